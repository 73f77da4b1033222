"""ONNX Runtime backend with IO binding.

Cache buffers that a graph updates in place are torch tensors on the device (`empty`), bound by pointer
as both input and output, so the KV cache is never copied. Other outputs are allocated by onnxruntime and
handed over without a copy: on the CPU as torch tensors on the same memory (DLPack), elsewhere as the
OrtValues themselves, which a later run can take back as inputs.

A graph's binding is kept from one run to the next (one per thread, as runs may come from several;
`hotrod.runtime.ort_binding`): a buffer bound by pointer stays bound while it is the same memory, shape
and type, and a decoding state's cache comes as one `Held` set, kept bound while the next step brings the
same object, so a step neither rebinds nor checks every layer's buffers; its few small inputs (numpy
arrays, whose attributes cost far less to ask than a tensor's) are copied into staging buffers bound
once, and only the outputs it returns are wrapped: what a step spends outside onnxruntime is then small
beside its run. How sessions are opened is `hotrod.runtime.ort_sessions`.
"""

from __future__ import annotations

import contextlib
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
from hotrod.errors import HotrodError
from hotrod.runtime import cpu_kernels, q4
from hotrod.runtime.base import Held, RuntimeOptions, contract_of, cpu_threads, merged
from hotrod.runtime.ort_binding import ALLOCATED, NUMPY_TYPES, Binding
from hotrod.runtime.ort_sessions import check_placement, open_session, providers_for, session_options


class OrtBackend:
    def __init__(self, files: dict[str, Path], contracts: dict[str, GraphIO], options: RuntimeOptions):
        self.contracts = contracts
        self.device = "cpu" if options.device == "cpu" else "cuda"
        self.torch_device = torch.device(self.device, 0) if self.device != "cpu" else torch.device("cpu")
        self.loop_threads = 1 if self.device == "cpu" else None
        self.verifies_drafts = True
        self.pools_cache = self.chains_steps = False
        self.shares_sources = True
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
        # Each graph's ops of hotrod's CPU kernels (`cpu_kernels`): its int4 products, its per-row quantization.
        self.kernel_ops: dict[str, frozenset[str]] = {}
        self.sessions = {name: self._session(path, options, name, providers) for name, path in files.items()}
        check_placement(self.sessions, options.device)
        self._local = threading.local()  # each thread's bindings: {graph: Binding}

    def _session(self, path: Path, options: RuntimeOptions, graph: str, providers: list[str]) -> ort.InferenceSession:
        """`graph`'s session; on the CPU what hotrod's kernels compute runs on them where they can
        (`cpu_kernels`), and elsewhere, or where the rewritten graph will not open, on onnxruntime's own ops."""
        if self.device == "cpu":
            with cpu_kernels.kernel_graph(path, cpu_threads(options.threads)) as rewritten:
                if rewritten is not None:
                    kernel_options = rewritten.options(self._session_options(options, graph))
                    with contextlib.suppress(HotrodError):  # the kernels' library would not load here
                        session = open_session(path, kernel_options, providers, rewritten.path)
                        self.kernel_ops[graph] = rewritten.ops
                        return session
        return open_session(path, self._session_options(options, graph), providers)

    @property
    def kernel_graphs(self) -> set[str]:
        """The graphs whose int4 products run on hotrod's kernel (`q4`)."""
        return {graph for graph, ops in self.kernel_ops.items() if q4.OP in ops}

    def _session_options(self, options: RuntimeOptions, graph: str) -> ort.SessionOptions:
        """`ort_sessions.session_options`, profiling into a file per graph, in a folder of the backend's own."""
        return session_options(options, self._profiles / graph if self._profiles is not None else None)

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
            if entry is not None and entry is not ALLOCATED and entry[0]() is value \
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

    def _binding(self, graph: str, width: str = "step") -> Binding:
        """This thread's binding of `graph` for runs of one `width` (`_width`): a loop that verifies drafts
        alternates steps with passes after a prompt, and one binding for all would rebind its small feeds
        and its logits at every turn, each rebinding a cost a run of the same width does not pay."""
        bindings = self._local.__dict__.setdefault("bindings", {})
        key = (graph, width)
        if key not in bindings:
            bindings[key] = Binding(self.sessions[graph], self.device)
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

    def _bind_input(self, binding: Binding, name: str, value: Any, alive: list[Any]) -> None:
        """A torch tensor already on the device is bound where it lies; anything else goes through an OrtValue."""
        if isinstance(value, torch.Tensor) and value.device == self.torch_device and value.dtype in NUMPY_TYPES \
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
    logits instead cost a fresh vocab-sized buffer per token, page faults and all.
    """

    def __init__(self, value: ort.OrtValue):
        self.value = value
        self.__array_interface__ = value.numpy().__array_interface__

