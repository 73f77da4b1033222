"""The two sides of every timing: transformers' PyTorch model and hotrod, on the same inputs.

`hotrod demo` and the benchmark scripts build their callables here, so both sides are always run the
same way: generation with the same forced length and greedy settings, encoders as one padded forward
(PyTorch) against hotrod's padding-free forward of the same batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hotrod.kinds import spec as kind_spec

AUTO_CLASSES = {"decoder": "AutoModelForCausalLM", "seq2seq": "AutoModelForSeq2SeqLM", "encoder": "AutoModel"}


@dataclass
class System:
    """One way of running a case, as the harness times it: hotrod, PyTorch or a peer.

    `call` runs the whole case and returns what `agreement` compares (tokens, or hidden states);
    `first_token` runs it for one new token (None for encoders). `figures` are reported as they are.
    `close` frees what the system holds (a peer's worker process) once its case is timed.
    """

    call: Callable[[], torch.Tensor]
    first_token: Callable[[], torch.Tensor] | None
    precision: str
    size_bytes: int | None
    rss_bytes: int = 0
    figures: dict = field(default_factory=dict)
    close: Callable[[], None] | None = None


def dir_size(path: Path) -> int | None:
    """Bytes of the files directly in `path` (a checkpoint, an artifact, a converted model), or None."""
    if not path.is_dir():
        return None
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def pytorch_model(source: str | Path, kind: str, device: str = "cpu") -> torch.nn.Module:
    """transformers' own model for `source`, in eval mode on `device`: the baseline."""
    import transformers

    model = getattr(transformers, AUTO_CLASSES[kind]).from_pretrained(source).eval().to(device)
    # from_pretrained maps safetensors files into memory; on a machine that reclaims cold file pages
    # between runs, PyTorch would be timed on page faults. Private copies keep the baseline honest.
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.clone()
    return model


def pytorch_runner(model: torch.nn.Module, kind: str, ids: torch.Tensor, mask: torch.Tensor,
                   generate_kwargs: dict | None = None) -> Callable[[], torch.Tensor]:
    """A no-argument call running `model` once; returns tokens (LMs) or the last hidden state (encoders)."""
    spec = kind_spec(kind)
    if not spec.generates:
        def forward():
            with torch.inference_mode():
                return model(input_ids=ids, attention_mask=mask).last_hidden_state

        return forward
    kwargs = dict(generate_kwargs or {})
    if spec.pads_left and model.generation_config.pad_token_id is None:
        kwargs["pad_token_id"] = model.config.eos_token_id

    def generate():
        with torch.inference_mode():
            return model.generate(ids, attention_mask=mask, **kwargs)

    return generate


def hotrod_runner(model: Any, ids: torch.Tensor, mask: torch.Tensor,
                  generate_kwargs: dict | None = None) -> Callable[[], torch.Tensor]:
    """The same call on a HotrodModel."""
    if not model.spec.generates:
        return lambda: model(input_ids=ids, attention_mask=mask).last_hidden_state
    return lambda: model.generate(ids, attention_mask=mask, **(generate_kwargs or {}))


def agreement(ours: torch.Tensor, theirs: torch.Tensor, kind: str, mask: torch.Tensor) -> float:
    """Share of generated tokens that agree (LMs), or hidden-state cosine over real tokens (encoders)."""
    spec = kind_spec(kind)
    if not spec.generates:
        keep = mask.bool()
        cosine = torch.nn.functional.cosine_similarity(ours.float()[keep], theirs.float()[keep], dim=-1)
        return float(cosine.mean())
    if ours.shape != theirs.shape:
        width = min(ours.shape[1], theirs.shape[1])
        ours, theirs = ours[:, :width], theirs[:, :width]
    start = mask.shape[1] if spec.continues_prompt else 0
    return float((ours[:, start:] == theirs[:, start:]).float().mean())
