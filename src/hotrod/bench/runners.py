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

from hotrod import tasks
from hotrod.kinds import spec as kind_spec


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


def pytorch_model(source: str | Path, kind: str, device: str = "cpu", task: str | None = None) -> torch.nn.Module:
    """transformers' own model for `source` (with its `task` head), in eval mode on `device`: the baseline."""
    import transformers

    name = tasks.get(task).bench.auto_class if task else kind_spec(kind).auto_class
    model = getattr(transformers, name).from_pretrained(source).eval().to(device)
    # from_pretrained maps safetensors files into memory; on a machine that reclaims cold file pages
    # between runs, PyTorch would be timed on page faults. Private copies keep the baseline honest.
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.clone()
    return model


def pytorch_runner(model: torch.nn.Module, kind: str, ids: torch.Tensor, mask: torch.Tensor,
                   generate_kwargs: dict | None = None, task: str | None = None,
                   types: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
    """A no-argument call running `model` once; returns tokens (LMs), the last hidden state (encoders), or
    what the head's user gets (`head_answer`). `types`: token types of text pairs."""
    spec = kind_spec(kind)
    if not spec.generates:
        extra = {} if types is None else {"token_type_ids": types}

        def forward():
            with torch.inference_mode():
                out = model(input_ids=ids, attention_mask=mask, **extra)
                return head_answer(out, task, mask)

        return forward
    kwargs = dict(generate_kwargs or {})
    if spec.pads_left and model.generation_config.pad_token_id is None:
        kwargs["pad_token_id"] = model.config.eos_token_id

    def generate():
        with torch.inference_mode():
            return model.generate(ids, attention_mask=mask, **kwargs)

    return generate


def hotrod_runner(model: Any, ids: torch.Tensor, mask: torch.Tensor, generate_kwargs: dict | None = None,
                  task: str | None = None, types: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
    """The same call on a HotrodModel; text pairs (`types` given) run as `run_rows` runs a task's rows
    (sorted by length, padded per sub-batch), as a rerank request is run."""
    if types is not None:
        from hotrod.pipelines.base import Row

        lengths = [int(n) for n in mask.sum(dim=1)]
        members = [Row(ids[i, :n].tolist(), types[i, :n].tolist()) for i, n in enumerate(lengths)]
        return lambda: torch.stack([out["logits"] for out in model.run_rows(members)]).float()
    if not model.spec.generates:
        return lambda: head_answer(model(input_ids=ids, attention_mask=mask), task, mask)
    return lambda: model.generate(ids, attention_mask=mask, **(generate_kwargs or {}))


def head_answer(out: Any, task: str | None, mask: torch.Tensor) -> torch.Tensor:
    """The last hidden state (bare encoders), or what the head's task compares (`TaskSpec.bench`): a
    classifier's logits, each row's best answer span."""
    if task is None:
        return out.last_hidden_state
    return tasks.get(task).bench.answer(out, mask)


def agreement(ours: torch.Tensor, theirs: torch.Tensor, kind: str, mask: torch.Tensor,
              task: str | None = None) -> float:
    """Share of generated tokens that agree (LMs), hidden-state cosine over real tokens (encoders), answer
    F1 against PyTorch's spans (question answering), or what the head's task compares (`TaskSpec.bench`)."""
    spec = kind_spec(kind)
    if task is not None:
        return tasks.get(task).bench.agreement(ours, theirs, mask)
    if not spec.generates:
        keep = mask.bool()
        cosine = torch.nn.functional.cosine_similarity(ours.float()[keep], theirs.float()[keep], dim=-1)
        return float(cosine.mean())
    if ours.shape != theirs.shape:
        width = min(ours.shape[1], theirs.shape[1])
        ours, theirs = ours[:, :width], theirs[:, :width]
    start = mask.shape[1] if spec.continues_prompt else 0
    return float((ours[:, start:] == theirs[:, start:]).float().mean())
