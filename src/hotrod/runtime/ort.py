"""ONNX Runtime backend with IO binding.

Cache buffers that a graph updates in place are torch tensors on the device (`empty`), bound by pointer
as both input and output, so the KV cache is never copied. Other outputs are allocated by onnxruntime and
handed over without a copy: on the CPU as torch tensors on the same memory (DLPack), elsewhere as the
OrtValues themselves, which a later run can take back as inputs.

A graph's binding is kept from one run to the next (one per thread, as runs may come from several): a
buffer bound by pointer stays bound while it is the same memory, shape and type, and a decoding state's
cache comes as one `Held` set, kept bound while the next step brings the same object, so a step neither
rebinds nor checks every layer's buffers; its few small inputs (numpy arrays, whose attributes cost far
less to ask than a tensor's) are copied into staging buffers bound once, and only the outputs it returns
are wrapped (W2 int4 at one thread: 0.29 -> 0.19 ms a step outside onnxruntime, binding and decoding loop
together; the held set and numpy feeds, at two threads: 1.22-1.24 -> 1.16-1.18 ms a step in all).
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import tempfile
import threading
import time
import weakref
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from hotrod.batching import CALL_OVERHEAD_TOKENS
from hotrod.contracts import GraphIO
from hotrod.errors import HotrodError, first_line
from hotrod.runtime import q4
from hotrod.runtime.base import Held, RuntimeOptions, contract_of, cpu_threads, merged

_PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}


def providers_for(device: str) -> list[str]:
    if device not in _PROVIDERS:
        raise HotrodError(f"unknown device {device!r}; choose from {', '.join(_PROVIDERS)}")
    wanted = _PROVIDERS[device]
    if wanted[0] not in ort.get_available_providers():
        raise HotrodError(
            f"device {device!r} needs onnxruntime's {wanted[0]}, which this onnxruntime does not have "
            f"(available: {', '.join(ort.get_available_providers())})"
        )
    return wanted


class OrtBackend:
    def __init__(self, files: dict[str, Path], contracts: dict[str, GraphIO], options: RuntimeOptions):
        self.contracts = contracts
        self.device = "cpu" if options.device == "cpu" else "cuda"
        self.torch_device = torch.device(self.device, 0) if self.device != "cpu" else torch.device("cpu")
        self.loop_threads = 1 if self.device == "cpu" else None
        self.verifies_drafts = True
        self.pools_cache = False
        self.call_overhead_tokens = CALL_OVERHEAD_TOKENS
        self.verifies_batches = False  # GroupQueryAttention: "batch_size must be 1 when sequence_length > 1 ..."
        # On the CPU a step's logits go into a buffer of the decoding state's own; elsewhere they reach the
        # host as before (the decoding loop reads them there).
        self.binds_outputs = self.device == "cpu"
        providers = providers_for(options.device)
        self._profiles = Path(tempfile.mkdtemp(prefix="hotrod-profile-")) if options.profile else None
        # Runs of each graph, counted while profiling: the profiler's trace holds one model_run event each.
        self.profiled_runs: Counter[str] | None = Counter() if options.profile else None
        # Milliseconds inside each graph's runs, summed where a caller sets this to a Counter
        # (`hotrod.bench.ops`); None leaves the run untimed.
        self.run_ms: Counter[str] | None = None
        if self._profiles is not None:  # gone with the backend, read or not
            weakref.finalize(self, shutil.rmtree, self._profiles, True)
        self.kernel_graphs: set[str] = set()  # graphs whose int4 products run on hotrod's kernel (`q4`)
        self.sessions = {name: self._session(path, options, name, providers) for name, path in files.items()}
        _check_placement(self.sessions, options.device)
        self._local = threading.local()  # each thread's bindings: {graph: _Binding}

    def _session(self, path: Path, options: RuntimeOptions, graph: str, providers: list[str]) -> ort.InferenceSession:
        """`graph`'s session; on the CPU its int4 products run on hotrod's kernel where it can (`q4`), and
        elsewhere, or where the rewritten graph will not open, on onnxruntime's own."""
        if self.device == "cpu":
            with q4.kernel_graph(path, cpu_threads(options.threads)) as rewritten:
                if rewritten is not None:
                    kernel_options = self._session_options(options, graph)
                    q4.use_kernel(kernel_options)
                    with contextlib.suppress(HotrodError):  # the kernel's library would not load here
                        session = _open(path, kernel_options, providers, rewritten)
                        self.kernel_graphs.add(graph)
                        return session
        return _open(path, self._session_options(options, graph), providers)

    def _session_options(self, options: RuntimeOptions, graph: str) -> ort.SessionOptions:
        session_options = ort.SessionOptions()
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session_options.intra_op_num_threads = cpu_threads(options.threads)
        session_options.inter_op_num_threads = 1
        session_options.log_severity_level = 3
        # Worker threads spin between the parallel parts of a run and stop when it returns: spinning on after
        # it, they compete with the decoding loop's own work until the next step (W2 int4 at 2 threads on a
        # quiet machine: 112-117 -> 77-80 ms, onnxruntime's own time included; W1 the same within noise),
        # while turning spinning off altogether slows the parts of a run (W1: 171 -> 235 ms).
        session_options.add_session_config_entry("session.force_spinning_stop", "1")
        if self._profiles is not None:  # a file per graph, in a folder of the backend's own
            session_options.enable_profiling = True
            session_options.profile_file_prefix = str(self._profiles / graph)
        return session_options

    def profile_events(self) -> dict[str, list[dict]]:
        """Each graph's profiler events (onnxruntime's trace format, times in microseconds from the
        profiler's start), for a backend opened with `profile`. Ends the recording: a second call finds none."""
        if self._profiles is None:
            raise HotrodError("this model was not loaded with profile=True")
        events = {}
        for name, session in self.sessions.items():
            path = Path(session.end_profiling())
            if not path.is_file():
                continue
            try:
                events[name] = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise HotrodError(f"onnxruntime's profile of {name} cannot be read: {exc}") from None
        shutil.rmtree(self._profiles, ignore_errors=True)
        return events

    def run(self, graph: str, feeds: Mapping[str, Any], into: Mapping[str, Any] | None = None,
            held: Held | None = None) -> dict[str, Any]:
        io = self.contracts[graph]
        binding = self._binding(graph, _width(feeds.get(io.input_names[0]), feeds.get("logits_positions")))
        if held is not None and not binding.hold(io, held, self.torch_device):
            feeds, into = merged(feeds, into, held)  # not all bindable by pointer: bound as plain feeds
            held = None
        # The binding holds only native pointers: every Python object behind them (a copied feed, a
        # value made from numpy, which does not own its buffer) must outlive the run.
        alive: list[Any] = []
        bound = binding.bound
        for name in io.input_names if held is None else binding.rest:
            value = feeds.get(name)
            if value is None:
                contract_of(self.contracts, graph, merged(feeds, None, held)[0])  # the error naming every missing input
            entry = bound.get(name)  # binding.holds, inlined: this loop runs for every layer's cache at every step
            if entry is not None and entry is not _ALLOCATED and entry[0]() is value \
                    and entry[1] == value.data_ptr():
                continue
            if not binding.stage(name, value):
                self._bind_input(binding, name, value, alive)
        into = into or {}
        allocated, indices = binding.plan(io, into, held)  # outputs onnxruntime allocates, at this run's shape
        # Outputs are first bound in the graph's order, which is the order get_outputs() lists them in.
        for name in into if binding.ordered else io.output_names:
            if name in into:  # the same memory as an input: onnxruntime's kernels update it in place
                if not binding.holds(name, into[name]):
                    binding.tensor(name, into[name], output=True)
            elif held is not None and name in held.into:  # the first run: bound here, in order
                binding.tensor(name, held.into[name], output=True)
            else:
                binding.allocated(name)
        for name in allocated:
            binding.allocated(name)
        binding.ordered = True
        if held is not None:
            binding.keep(held)  # whole again, had the first run's ordered binding above forgotten it
        if self.run_ms is None:
            binding.run()
        else:
            started = time.perf_counter()
            binding.run()
            self.run_ms[graph] += (time.perf_counter() - started) * 1e3
        if self.profiled_runs is not None:
            self.profiled_runs[graph] += 1
        outputs = binding.outputs(io.output_names, into, indices)
        binding.release(allocated)
        return outputs

    def _binding(self, graph: str, width: str = "step") -> _Binding:
        """This thread's binding of `graph` for runs of one `width` (`_width`): a loop that verifies drafts
        alternates steps with passes after a prompt, and one binding for all would rebind its small feeds
        and its logits at every turn (a pass after a step cost about 30 us more than after a pass on the
        demo GPT-2, and a step after a pass 40 us more than after a step)."""
        bindings = self._local.__dict__.setdefault("bindings", {})
        key = (graph, width)
        if key not in bindings:
            bindings[key] = _Binding(self.sessions[graph], self.device)
        return bindings[key]

    def empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A torch tensor on the device, bound to runs by pointer: the cache rows can then be copied and
        reordered in place on any device (an OrtValue on a GPU has no view). Zeros, not stale memory:
        calibration records cache buffers as feeds, and the precision search would read stale bits as
        overflowing activations."""
        return torch.zeros(shape, device=self.torch_device)

    def to_torch(self, value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return value
        if self.device != "cpu" and value.device_name().lower() != "cpu":
            return torch.from_numpy(value.numpy())  # numpy() copies it to the host
        return torch.from_numpy(np.asarray(_Lent(value)))  # no copy: the tensor keeps the OrtValue alive

    def view(self, value: Any) -> torch.Tensor:
        return torch.from_numpy(value.numpy()) if isinstance(value, ort.OrtValue) else value

    def select(self, value: Any, index: torch.Tensor) -> Any:
        if isinstance(value, torch.Tensor):
            return value[index.to(value.device)]
        return self._handle(torch.from_numpy(value.numpy()[index.cpu().numpy()]))

    def _bind_input(self, binding: _Binding, name: str, value: Any, alive: list[Any]) -> None:
        """A torch tensor already on the device is bound where it lies; anything else goes through an OrtValue."""
        if isinstance(value, torch.Tensor) and value.device == self.torch_device and value.dtype in _NUMPY_TYPES \
                and value.numel():
            value = value.contiguous()
            alive.append(value)
            binding.tensor(name, value)
            return
        handle = self._handle(value)
        alive.append(handle)
        binding.io.bind_ortvalue_input(name, handle)
        binding.bound.pop(name, None)
        binding.forget(name)

    def _handle(self, value: Any) -> ort.OrtValue:
        if isinstance(value, ort.OrtValue):
            return value
        array = np.ascontiguousarray(value if isinstance(value, np.ndarray) else value.detach().cpu().numpy())
        # The OrtValue keeps a reference to `array`, so the buffer lives as long as the handle.
        return ort.OrtValue.ortvalue_from_numpy(array, self.device, 0)


def _width(first: Any, logits_positions: Any) -> str:
    """What a run feeds and returns: one token a row ("step"), several with the logits of the last alone
    ("prompt"), or several with the logits of each ("pass"), from its first feed (its tokens; an OrtValue's
    shape is a method) and the logits positions it asks for, where the graph takes them."""
    shape = first.shape() if isinstance(first, ort.OrtValue) else getattr(first, "shape", ())
    if len(shape) < 2 or shape[1] == 1:
        return "step"
    asked = getattr(logits_positions, "shape", None)
    return "prompt" if asked is not None and len(asked) > 1 and asked[1] == 1 else "pass"


class _Lent:
    """An OrtValue's host buffer lent to numpy, and through it to torch, without a copy.

    An array made from this object holds the OrtValue as its base, so the buffer lives as long as any
    array or tensor on it, whether or not this onnxruntime's own numpy() view does. Copying a step's
    logits instead cost a fresh vocab-sized buffer per token (GPT-2: about 50 us a step with its page
    faults, against a kernel time of 3-4 ms).
    """

    def __init__(self, value: ort.OrtValue):
        self.value = value
        self.__array_interface__ = value.numpy().__array_interface__


_NUMPY_TYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64,
                torch.int32: np.int32, torch.bool: np.bool_}
_TORCH_TYPES = {np.dtype(numpy_type): torch_type for torch_type, numpy_type in _NUMPY_TYPES.items()}


_ALLOCATED = ("allocated by onnxruntime",)  # what `_Binding.bound` holds for an output onnxruntime allocates


class _Binding:
    """A graph's IOBinding and what each name is bound to: (a weak reference to the tensor, its pointer)
    for memory bound by pointer, `_ALLOCATED` for an output onnxruntime allocates on each run.

    A tensor bound by pointer is known again by identity (the very object, at the same address): a step
    feeds every layer's cache buffers, and asking each for its pointer, shape and type cost more than the
    rest of the binding (GPT-2: 48 buffers a step). Tensors bound here are never reshaped in place.

    A decoding step's small host inputs (its tokens, positions and lengths, new tensors at every step)
    are copied into buffers of the binding's own, bound once (`stage`): a copy of a few numbers costs a
    microsecond or two where binding afresh costs about 15. Allocated outputs are bound, the run started
    and its outputs read through onnxruntime's native binding where it has one: its Python wrapper's
    checks (for WebGPU graph capture, which hotrod does not use) and device objects made at every call
    cost tens of microseconds a step, against a step budget of 200.
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
        return entry is not None and entry is not _ALLOCATED and entry[0]() is value \
            and entry[1] == value.data_ptr()

    def stage(self, name: str, value: Any) -> bool:
        """Copy a small host array or tensor into `name`'s staging buffer, bound by pointer; False where
        `value` is not one (then it is bound as it is). A buffer of another shape or type is replaced."""
        if type(value) is np.ndarray:  # a decoding step's own feeds: numpy's few attributes are cheap to ask
            if not (self.stages and 0 < value.size <= self.STAGED_ELEMENTS and value.dtype in _TORCH_TYPES):
                return False
            key, array = (name, value.shape, value.dtype), value
        elif (self.stages and isinstance(value, torch.Tensor) and value.device.type == "cpu"
              and 0 < value.numel() <= self.STAGED_ELEMENTS and value.dtype in _NUMPY_TYPES):
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
        if entry is None or entry is _ALLOCATED or entry[0]() is not staged[0]:
            self.tensor(name, staged[0])
        return True

    def _forget_staged(self) -> None:
        """Drop the staging buffers no name is bound to (those bound may be this very run's feeds)."""
        bound = {id(entry[0]()) for entry in self.bound.values() if entry is not _ALLOCATED}
        self.staged = {key: staged for key, staged in self.staged.items() if id(staged[0]) in bound}

    def hold(self, io: GraphIO, held: Held, device: torch.device) -> bool:
        """Bind `held` unless it is bound already; False where an entry is not a contiguous tensor on the
        device, which is then fed as any other (a copy would not see the writes made to it in place)."""
        if self.held is held:
            return True
        values = [*held.feeds.values(), *held.into.values()]
        if not all(isinstance(v, torch.Tensor) and v.device == device and v.dtype in _NUMPY_TYPES
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
        if self.bound.get(name) is not _ALLOCATED:
            self.forget(name)
            self._bind_allocated(name)
            self.bound[name] = _ALLOCATED

    def release(self, names: list[str]) -> None:
        """Let go of the outputs onnxruntime allocated in the last run (the caller holds them now): binding
        each to its device again empties its slot, and the next run allocates afresh."""
        for name in names:
            self._bind_allocated(name)

    def tensor(self, name: str, tensor: torch.Tensor, output: bool = False) -> None:
        """Bind a contiguous torch tensor by pointer, as input `name` or as that output."""
        self.forget(name)
        device = "cpu" if tensor.device.type == "cpu" else tensor.device.type
        dtype, shape, pointer = _NUMPY_TYPES[tensor.dtype], list(tensor.shape), tensor.data_ptr()
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
        holds the output for as long as the tensor lives (about 1 us, where an OrtValue lent to numpy and
        then to torch costs 5); elsewhere, or in an onnxruntime without DLPack, the OrtValue."""
        if self.stages and hasattr(value, "to_dlpack"):
            return torch.from_dlpack(value.to_dlpack())
        return ort.OrtValue(value)


def _check_placement(sessions: dict[str, ort.InferenceSession], device: str) -> None:
    """onnxruntime falls back to its CPU provider when a GPU provider's libraries fail to load; asked for a
    GPU, running on the CPU unannounced would be wrong answers about speed, so it is refused."""
    if device == "cpu":
        return
    on_cpu = [name for name, session in sessions.items() if session.get_providers()[0] == "CPUExecutionProvider"]
    if on_cpu:
        raise HotrodError(f"device {device!r}: onnxruntime could not start its GPU provider (its libraries failed "
                          f"to load) and would run {', '.join(on_cpu)} on the CPU")


# Session-level passes left out on the CPU: BiasGeluFusion turns an encoder's bias Add + Gelu (kept apart by
# `hotrod.optimize.fusion`) back into BiasGelu, whose CPU kernel is the slower (the same outputs to the bit;
# a MiniLM-L6 cross-encoder at 100 x 96 tokens and 32 x 128, 2 AVX-512 cores: 2-6% faster without it).
CPU_DISABLED_OPTIMIZERS = ["BiasGeluFusion"]


def _open(path: Path, options: ort.SessionOptions, providers: list[str],
          rewritten: Path | None = None) -> ort.InferenceSession:
    """A session of the graph at `path`, or of `rewritten`, that graph rewritten."""
    disabled = CPU_DISABLED_OPTIMIZERS if providers[0] == "CPUExecutionProvider" else None
    try:
        return ort.InferenceSession(str(rewritten or path), sess_options=options, providers=providers,
                                    disabled_optimizers=disabled)
    except Exception as exc:  # noqa: BLE001  (ORT raises its own exception types for a bad file)
        raise HotrodError(f"cannot load graph {path.name}: {first_line(exc)}") from None
