"""llama.cpp as a peer: the same weights as a GGUF file (`hotrod.bench.gguf_file`), quantized by llama.cpp's
own quantizer to Q8_0, Q4_0 and Q4_K_M, and run through llama-cpp-python's bindings to its C API.

Each call runs the case the way llama.cpp runs it natively: the prompt in one `llama_decode` (or, for T5,
the input in one `llama_encode`), then one `llama_decode` per new token, greedy (the argmax of the last
logits), with the memory cleared first so no call reuses an earlier prompt's cache. Encoders go in as one
padding-free batch, one sequence id per row, and every token's hidden state is read back. Generation is
timed at batch 1, which is what the bindings' single-sequence decoding loop is for. Each system runs in a
process of its own (`workers/llamacpp_worker.py`), away from the other peers' OpenMP runtimes.
"""

from __future__ import annotations

import ctypes
import hashlib
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from hotrod.bench import gguf_file
from hotrod.bench.case import Case
from hotrod.bench.remote import Worker
from hotrod.bench.runners import System
from hotrod.kinds import spec as kind_spec
from hotrod.source import cache_dir, source_fingerprint

# Each format, and the hotrod precision whose hardware floor it is held to.
FORMATS = {"Q8_0": "int8-weight", "Q4_0": "int4", "Q4_K_M": "int4"}


def builders(case: Case, ids: torch.Tensor, mask: torch.Tensor, threads: int) -> dict[str, Callable[[], System]]:
    """One builder per format, named "llama.cpp <format>"; each converts (once) and loads."""
    return {f"llama.cpp {name}": _builder(case, ids, mask, threads, name) for name in FORMATS}


def _builder(case: Case, ids: torch.Tensor, mask: torch.Tensor, threads: int, name: str) -> Callable[[], System]:
    def build() -> System:
        if case.spec.generates and case.batch != 1:
            raise ValueError("llama.cpp's generation is timed at batch 1 (one sequence per decoding loop)")
        if case.num_beams > 1:
            raise ValueError("llama.cpp's decoding loop here is greedy; a beam search case is not timed on it")
        log = cache_dir() / "bench" / "llamacpp" / "worker.log"
        worker = Worker(sys.executable, "llamacpp_worker.py", log)  # its own process: see the worker's docstring
        try:
            info = worker.build(name=case.name, source=case.source, kind=case.kind, lengths=case.lengths,
                                new_tokens=case.new_tokens, format=name, threads=threads, ids=ids.cpu().numpy(),
                                mask=mask.cpu().numpy())
        except BaseException:
            worker.close()
            raise
        first = (lambda: worker.call(first=True)) if case.spec.generates else None
        return System(worker.call, first, FORMATS[name], info["size_bytes"], figures={"format": name},
                      close=worker.close)

    return build


def quantized(source: str, kind: str, name: str, threads: int) -> Path:
    """The checkpoint as a GGUF file in format `name`, written and quantized once under hotrod's cache."""
    import llama_cpp

    tag = f"{source_fingerprint(Path(source))}|{kind}|{llama_cpp.__version__}"
    folder = cache_dir() / "bench" / "llamacpp" / f"{Path(source).name}-{hashlib.sha256(tag.encode()).hexdigest()[:16]}"
    path = folder / f"model-{name}.gguf"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    full = folder / "model-F32.gguf"
    if not full.is_file():
        _whole(full, lambda partial: gguf_file.write(_transformers_model(source, kind), partial))
    if name != "F32":  # F32: the written file itself, the reference the quantized formats are judged by
        _whole(path, lambda partial: _quantize(full, partial, name, threads))
    return path


def _whole(path: Path, write: Callable[[Path], None]) -> None:
    """Writes `path` through a partial file renamed into place, so a file appears whole or not at all."""
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    write(partial)
    partial.rename(path)


def _transformers_model(source: str, kind: str) -> torch.nn.Module:
    import transformers

    return getattr(transformers, kind_spec(kind).auto_class).from_pretrained(source).eval()


def _quantize(source: Path, target: Path, name: str, threads: int) -> None:
    import llama_cpp
    import llama_cpp._logger  # noqa: F401  (installs the log callback that set_verbose quiets)

    llama_cpp._logger.set_verbose(False)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}")
    params.nthread = threads
    if llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source.name} to {name}")


class Runner:
    """One loaded GGUF model and the case's inputs, driven through llama.cpp's C API."""

    def __init__(self, path: Path, case: Case, ids: torch.Tensor, mask: torch.Tensor, threads: int):
        import llama_cpp

        self.case = case
        self.rows = [row[keep.bool()].tolist() for row, keep in zip(ids, mask)]
        self.ids, self.mask = ids, mask
        tokens = case.seq + case.new_tokens + 1 if case.spec.generates else sum(len(row) for row in self.rows)
        kwargs = dict(n_ctx=tokens, n_batch=tokens, n_ubatch=tokens, n_threads=threads, n_threads_batch=threads,
                      verbose=False)
        if not case.spec.generates:
            kwargs.update(embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE)
        self.llama = llama_cpp.Llama(str(path), **kwargs)
        self.batch = llama_cpp.llama_batch_init(tokens, 0, max(case.batch, 1))
        self.vocab = self.llama.n_vocab()

    def close(self) -> None:
        """Frees the batch and the model now rather than whenever the garbage collector runs."""
        import llama_cpp

        if getattr(self, "batch", None) is not None:
            llama_cpp.llama_batch_free(self.batch)
            self.batch = None
            self.llama.close()

    def call(self) -> torch.Tensor:
        return self.generate(self.case.new_tokens) if self.case.spec.generates else self.encode()

    def generate(self, count: int) -> torch.Tensor:
        """Greedy tokens laid out as transformers' generate lays them out for the same kind."""
        import llama_cpp

        self._clear()
        prompt = self.rows[0]
        if self.case.spec.encodes:
            self._fill([prompt], every=True)
            self._check(llama_cpp.llama_encode(self.llama.ctx, self.batch), "llama_encode")
            start = llama_cpp.llama_model_decoder_start_token(self.llama.model)
            tokens, position, head = [start], 0, [start]
        else:
            tokens, position, head = prompt, 0, self.ids[0].tolist()
        new: list[int] = []
        for _ in range(count):
            self._fill([tokens], position)
            self._check(llama_cpp.llama_decode(self.llama.ctx, self.batch), "llama_decode")
            position += len(tokens)
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llama.ctx, -1), shape=(self.vocab,))
            tokens = [int(logits.argmax())]
            new.append(tokens[0])
        return torch.tensor([head + new])

    def encode(self) -> torch.Tensor:
        """Every row's hidden states from one padding-free batch, right-padded with zeros like CTranslate2's."""
        import llama_cpp

        self._clear()
        self._fill(self.rows, every=True)
        self._check(llama_cpp.llama_decode(self.llama.ctx, self.batch), "llama_decode")
        width = self.llama.n_embd()
        total = sum(len(row) for row in self.rows)
        flat = np.ctypeslib.as_array(llama_cpp.llama_get_embeddings(self.llama.ctx), shape=(total, width))
        out = torch.zeros(self.case.batch, self.case.seq, width)
        offset = 0
        for i, row in enumerate(self.rows):
            out[i, :len(row)] = torch.from_numpy(flat[offset:offset + len(row)].copy())
            offset += len(row)
        return out

    def _fill(self, rows: list[list[int]], start: int = 0, every: bool = False) -> None:
        """The batch: each row as its own sequence from position `start`; outputs for each row's last token,
        or with `every` for all tokens (an encoder's hidden states)."""
        batch, n = self.batch, 0
        for seq, row in enumerate(rows):
            for position, token in enumerate(row, start):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = token, position, 1
                batch.seq_id[n][0], batch.logits[n] = seq, every or position == start + len(row) - 1
                n += 1
        batch.n_tokens = n

    def _clear(self) -> None:
        import llama_cpp

        memory = llama_cpp.llama_get_memory(self.llama.ctx)
        if memory:
            llama_cpp.llama_memory_clear(memory, True)

    @staticmethod
    def _check(code: int, call: str) -> None:
        if code != 0:
            raise RuntimeError(f"{call} returned {code}")
