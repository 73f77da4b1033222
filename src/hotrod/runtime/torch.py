"""Eager PyTorch backend: the lean family modules, run directly on CPU or CUDA."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hotrod.batching import CALL_OVERHEAD_TOKENS
from hotrod.contracts import GraphIO
from hotrod.runtime.base import Held, RuntimeOptions, contract_of, cpu_threads, merged


class TorchBackend:
    def __init__(self, module: torch.nn.Module, contracts: dict[str, GraphIO], options: RuntimeOptions):
        self.device = options.device
        self.loop_threads = None  # torch runs the model itself: its threads are the engine's
        self.verifies_drafts = self.verifies_batches = True
        self.binds_outputs = False  # its modules return new logits: writing them into a buffer would be a copy
        self.pools_cache = self.chains_steps = False
        self.shares_sources = True
        self.call_overhead_tokens = CALL_OVERHEAD_TOKENS
        if options.device == "cpu" and options.threads:  # torch's thread count is process-wide: only when asked
            torch.set_num_threads(cpu_threads(options.threads))
        self.module = module.eval().to(options.device)
        self.graphs = module.graphs()
        self.contracts = contracts

    @torch.inference_mode()
    def run(self, graph: str, feeds: Mapping[str, Any], into: Mapping[str, Any] | None = None,
            held: Held | None = None) -> dict[str, Any]:
        feeds, into = merged(feeds, into, held)
        io = contract_of(self.contracts, graph, feeds)
        args = [torch.as_tensor(feeds[name]).to(self.device) for name in io.input_names]  # numpy too
        outputs = self.graphs[graph](*args)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        result = dict(zip(io.output_names, outputs))
        for name, target in (into or {}).items():
            if result[name] is not target:  # the modules update cache buffers in place and return them
                target.copy_(result[name])
                result[name] = target
        return result

    def empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        # Zeros, not garbage: eager attention multiplies the whole span up to the longest row, masked
        # scores and all, and a NaN left in memory would survive a zero weight.
        return torch.zeros(shape, device=self.device)

    def to_torch(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def view(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def select(self, value: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return value.index_select(0, index.to(value.device))
