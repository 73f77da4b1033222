"""sparse-embedding: SPLADE vectors of a masked-LM head, as sentence-transformers' `SparseEncoder.encode`
gives them (`hotrod.pipelines.sparse`); the route is text-embeddings-inference's /embed_sparse.

A checkpoint saved as a SparseEncoder (modules.json: its Transformer, then SpladePooling) is a sparse model
by its own files (`files`); a plain ...ForMaskedLM checkpoint keeps being refused without a task, and
becomes one with --task sparse-embedding (task=). Each family that runs it has its masked-LM head in its
`heads` table (`hotrod.models.heads.SpladeHead`): there is no standard one, so the others refuse the task,
naming themselves.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from hotrod.pipelines import sparse, splade
from hotrod.pipelines.sentence import SentencePipeline
from hotrod.tasks.constants import SPARSE
from hotrod.tasks.registry import Bench, Command, Door, Output, Route, TaskSpec, register
from hotrod.verification.measures import SPARSE as MEASURE
from hotrod.verification.sparse import top_overlap


def asked_by(path: Path) -> dict[str, Any] | None:
    """A SparseEncoder checkpoint's SpladePooling settings, for its head (`splade.CONFIG_KEY`); None for any
    other checkpoint."""
    if not splade.lists_splade(path):
        return None
    pipeline = SentencePipeline.read(path)
    step = splade.of_steps(pipeline.steps) if pipeline is not None else None
    return {splade.CONFIG_KEY: step.config_value()} if step is not None else None


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--top", type=int, default=10, help="entries shown per text, heaviest first (default 10)")
    p.add_argument("--max-active-dims", type=int, default=None,
                   help="keep each vector's N largest entries (default: the checkpoint's own, else all)")
    p.add_argument("--prompt-name", default=None, help="one of the checkpoint's named prompts")
    p.add_argument("--prompt", default=None, help="a prompt of your own, put before each text")


def _call(model: Any, args: argparse.Namespace) -> Any:
    vectors = model.embed_sparse(list(args.texts), max_active_dims=args.max_active_dims,
                                 prompt_name=args.prompt_name, prompt=args.prompt)
    return sparse.tokens(model, vectors)


def _show(args: argparse.Namespace, found: Any):
    for text, terms in zip(args.texts, found):
        yield f"{len(terms)} terms\t{text}"
        yield "  " + "  ".join(f"{t['token']}:{t['value']:.4f}" for t in terms[: max(args.top, 0)])


def _schemas() -> tuple[type, type]:
    from hotrod.serve.task_schemas import EmbedSparseRequest, EmbedSparseResponse

    return EmbedSparseRequest, EmbedSparseResponse


def _items(body: Any) -> list[str]:
    return [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)


def _door(body: Any) -> Door:
    items = _items(body)
    return Door("inputs", len(items), [(f"inputs[{i}]", text) for i, text in enumerate(items)], bool(body.truncate))


def _arguments_of(body: Any) -> tuple:
    return _items(body), None, body.prompt_name, None, bool(body.truncate), body.truncation_direction.lower()


def _respond(body: Any, vectors: Any, reply: Any) -> Any:
    from hotrod.serve.task_schemas import EmbedSparseResponse

    return EmbedSparseResponse(sparse.entries(vectors))


def bench_answer(out: Any, mask: torch.Tensor) -> torch.Tensor:
    """The SPLADE vectors: hotrod's graph output, or transformers' masked-LM logits pooled as SpladePooling's
    defaults pool them (max over the real tokens of log(1 + relu(logit)))."""
    found = getattr(out, sparse.OUTPUT, None)
    if found is not None:
        return found.float()
    logits = out.logits.float() * mask.unsqueeze(-1).to(torch.float32)
    return torch.log1p(torch.relu(logits.max(dim=1).values))


def bench_agreement(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor) -> float:
    """The share of each row's heaviest terms that both systems give (`top_overlap`), over the rows."""
    return sum(top_overlap(a, b) for a, b in zip(ours, theirs)) / len(ours)


SPEC = register(TaskSpec(
    SPARSE, kinds=("encoder",), outputs=(Output(sparse.OUTPUT, ("batch", "vocab")),), method="embed_sparse",
    pipeline=sparse, measure=MEASURE, files=asked_by,
    command=Command("embed-sparse", "sparse (SPLADE) vectors of texts, their heaviest tokens first", _arguments,
                    _call, _show, truncate=False),
    route=Route("/embed_sparse", "embed_sparse", _schemas, _door, _arguments_of, _respond, fields=("prompt_name",)),
    bench=Bench("AutoModelForMaskedLM", bench_answer, bench_agreement),
    summary="sparse (SPLADE) vectors of texts",
))
