"""A graph's onnxruntime IOBinding, kept from one run to the next (`hotrod.runtime.ort.OrtBackend` holds one
per graph, run width and thread).

A buffer bound by pointer stays bound while it is the same memory, shape and type, and a decoding state's
cache comes as one `Held` set, kept bound while the next step brings the same object, so a step neither
rebinds nor checks every layer's buffers; its few small inputs are copied into staging buffers bound once,
and only the outputs it returns are wrapped.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from hotrod.contracts import GraphIO
from hotrod.runtime.base import Held

NUMPY_TYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64,
               torch.int32: np.int32, torch.bool: np.bool_}
_TORCH_TYPES = {np.dtype(numpy_type): torch_type for torch_type, numpy_type in NUMPY_TYPES.items()}


ALLOCATED = ("allocated by onnxruntime",)  # what `Binding.bound` holds for an output onnxruntime allocates


class Binding:
    """A graph's IOBinding and what each name is bound to: (a weak reference to the tensor, its pointer)
    for memory bound by pointer, `ALLOCATED` for an output onnxruntime allocates on each run.

    A tensor bound by pointer is known again by identity (the very object, at the same address): a step
    feeds every layer's cache buffers, and asking each for its pointer, shape and type cost more than the
    rest of the binding (GPT-2: 48 buffers a step). Tensors bound here are never reshaped in place.

    A decoding step's small host inputs (its tokens, positions and lengths, new tensors at every step)
    are copied into buffers of the binding's own, bound once (`stage`): a copy of a few numbers costs a
    fraction of binding afresh. Allocated outputs are bound, the run started and its outputs read through
    onnxruntime's native binding where it has one: its Python wrapper's checks (for WebGPU graph capture,
    which hotrod does not use) and device objects made at every call are a sizeable share of a small
    model's step.
    """

    STAGED_ELEMENTS = 1024  # host inputs at most this large are copied into staging buffers
    STAGED_BUFFERS = 64  # staging buffers kept, one per input name, shape and type

    def __init__(self, session: ort.InferenceSession, device: str):
        self.io = session.io_binding()
        self.bound: dict[str, tuple] = {}
        # The `Held` every name of which is bound as it holds it, weakly: a state that lets its buffers go
        # frees them (a run binds afresh whatever is not the held set it brings, or not alive).
        self._held: weakref.ref | None = None
        self.rest: list[str] = []  # the graph's inputs `held` does not hold, in the graph's order
        self.staged: dict[tuple, tuple[torch.Tensor, np.ndarray]] = {}  # (name, shape, type) -> buffer, its array
        self.plans: dict[tuple, tuple[list[str], list[int]]] = {}
        self.ordered = False  # whether every output has been bound once, in the graph's order
        self.stages = device == "cpu"  # elsewhere host inputs are copied to the device in any case
        native, inner = getattr(session, "_sess", None), getattr(self.io, "_iobinding", None)
        make = getattr(getattr(ort, "OrtDevice", None), "make", None)
        if native is not None and inner is not None and make is not None:
            c_device = make(device, 0)._get_c_device()
            self.run = functools.partial(native.run_with_iobinding, inner, None)
            self._bind_allocated = lambda name: inner.bind_output(name, c_device)
            self._bind_pointer = {False: inner.bind_input, True: inner.bind_output}
            self._device = (device, c_device)
        else:  # an onnxruntime without them: its public wrapper does the same, more slowly
            self.run = functools.partial(session.run_with_iobinding, self.io)
            self._bind_allocated = functools.partial(self.io.bind_output, device_type=device)
            self._bind_pointer = None

    def holds(self, name: str, value: Any) -> bool:
        """Whether `name` is bound to `value` itself, where it lay when it was bound."""
        entry = self.bound.get(name)
        return entry is not None and entry is not ALLOCATED and entry[0]() is value \
            and entry[1] == value.data_ptr()

    def stage(self, name: str, value: Any) -> bool:
        """Copy a small host array or tensor into `name`'s staging buffer, bound by pointer; False where
        `value` is not one (then it is bound as it is). A buffer of another shape or type is replaced."""
        if type(value) is np.ndarray:  # a decoding step's own feeds: numpy's few attributes are cheap to ask
            if not (self.stages and 0 < value.size <= self.STAGED_ELEMENTS and value.dtype in _TORCH_TYPES):
                return False
            key, array = (name, value.shape, value.dtype), value
        elif (self.stages and isinstance(value, torch.Tensor) and value.device.type == "cpu"
              and 0 < value.numel() <= self.STAGED_ELEMENTS and value.dtype in NUMPY_TYPES):
            key, array = (name, value.shape, value.dtype), (value.detach() if value.requires_grad else value).numpy()
        else:
            return False
        staged = self.staged.get(key)
        if staged is None:
            if len(self.staged) >= self.STAGED_BUFFERS:  # drafts of many widths: forget those not bound now
                self._forget_staged()
            with torch.inference_mode(False):  # a buffer made in inference mode could not be copied into outside it
                buffer = torch.empty(tuple(value.shape), dtype=_TORCH_TYPES.get(value.dtype, value.dtype))
            staged = self.staged[key] = (buffer, buffer.numpy())
        # numpy's copy, not torch's: a few numbers, where torch's copy_ costs its dispatch, cold after a run
        np.copyto(staged[1], array)
        entry = self.bound.get(name)  # a staging buffer never moves: bound if it is the one bound, by identity
        if entry is None or entry is ALLOCATED or entry[0]() is not staged[0]:
            self.tensor(name, staged[0])
        return True

    def _forget_staged(self) -> None:
        """Drop the staging buffers no name is bound to (those bound may be this very run's feeds)."""
        bound = {id(entry[0]()) for entry in self.bound.values() if entry is not ALLOCATED}
        self.staged = {key: staged for key, staged in self.staged.items() if id(staged[0]) in bound}

    def hold(self, io: GraphIO, held: Held, device: torch.device) -> bool:
        """Bind `held` unless it is bound already; False where an entry is not a contiguous tensor on the
        device, which is then fed as any other (a copy would not see the writes made to it in place)."""
        if self.held is held:
            return True
        values = [*held.feeds.values(), *held.into.values()]
        if not all(isinstance(v, torch.Tensor) and v.device == device and v.dtype in NUMPY_TYPES
                   and v.is_contiguous() and v.numel() for v in values):
            return False
        for name, value in held.feeds.items():
            if not self.holds(name, value):
                self.tensor(name, value)
        if self.ordered:  # else the run binds every output in the graph's order, these among them
            for name, value in held.into.items():
                if not self.holds(name, value):
                    self.tensor(name, value, output=True)
        self.keep(held)
        self.rest = [name for name in io.input_names if name not in held.feeds]
        return True

    @property
    def held(self) -> Held | None:
        return self._held() if self._held is not None else None

    def keep(self, held: Held) -> None:
        self._held = weakref.ref(held)

    def plan(self, io: GraphIO, into: Mapping[str, Any], held: Held | None = None) -> tuple[list[str], list[int]]:
        """The outputs onnxruntime allocates when `into` (and `held`) hold the rest: their names and places."""
        key = (io.name, held.names if held is not None else None, *into)
        if key not in self.plans:
            written = held.into if held is not None else {}
            indices = [i for i, name in enumerate(io.output_names) if name not in into and name not in written]
            self.plans[key] = ([io.output_names[i] for i in indices], indices)
        return self.plans[key]

    def allocated(self, name: str) -> None:
        """Have onnxruntime allocate output `name` on the device, unless it is bound that way already."""
        if self.bound.get(name) is not ALLOCATED:
            self.forget(name)
            self._bind_allocated(name)
            self.bound[name] = ALLOCATED

    def release(self, names: list[str]) -> None:
        """Let go of the outputs onnxruntime allocated in the last run (the caller holds them now): binding
        each to its device again empties its slot, and the next run allocates afresh."""
        for name in names:
            self._bind_allocated(name)

    def tensor(self, name: str, tensor: torch.Tensor, output: bool = False) -> None:
        """Bind a contiguous torch tensor by pointer, as input `name` or as that output."""
        self.forget(name)
        device = "cpu" if tensor.device.type == "cpu" else tensor.device.type
        dtype, shape, pointer = NUMPY_TYPES[tensor.dtype], list(tensor.shape), tensor.data_ptr()
        if self._bind_pointer is not None and device == self._device[0]:
            self._bind_pointer[output](name, self._device[1], dtype, shape, pointer)
        else:
            bind = self.io.bind_output if output else self.io.bind_input
            bind(name, device, tensor.device.index or 0, dtype, shape, pointer)
        self.bound[name] = (weakref.ref(tensor), pointer)

    def forget(self, name: str) -> None:
        """`name` is bound afresh outside `held`: the held set is then no longer bound as a whole."""
        held = self.held
        if held is not None and name in held.names:
            self._held = None

    def outputs(self, names: list[str], into: Mapping[str, Any], indices: list[int]) -> dict[str, Any]:
        """The run's outputs: `into`'s own handles, and the others (at `indices`) as `wrap` hands them over.
        onnxruntime's get_outputs() would wrap every output, the cache buffers bound in `into` too; only the
        others are wrapped here."""
        outputs = dict(into)
        if indices:
            values = self.io._iobinding.get_outputs()  # the native list behind IOBinding.get_outputs()
            for index in indices:
                outputs[names[index]] = self.wrap(values[index])
        return outputs

    def wrap(self, value: Any) -> Any:
        """An output as the caller gets it: on the CPU a torch tensor on its memory through DLPack, which
        holds the output for as long as the tensor lives (cheaper than an OrtValue lent to numpy and then
        to torch); elsewhere, or in an onnxruntime without DLPack, the OrtValue."""
        if self.stages and hasattr(value, "to_dlpack"):
            return torch.from_dlpack(value.to_dlpack())
        return ort.OrtValue(value)
