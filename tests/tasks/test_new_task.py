"""A new task is a spec and a pipeline pair, nothing else: registered here, it runs end to end through the
Python API (build, verification, its method), the CLI (its subcommand, `--task`) and a server route.

The toy task, "token-mean", ends an encoder in a head without weights (the mean of its real tokens'
hidden states), so any encoder checkpoint runs it; its measure compares both models' vectors by cosine.
"""

from __future__ import annotations

import json
import types
from typing import Any

import pytest
import torch
from torch import nn

import hotrod
from hotrod import tasks
from hotrod.pipelines.base import Prepared, encode
from hotrod.verification import examples as ex
from hotrod.verification.measures import Measure, on_rows
from hotrod.verification.rows import example_rows
from tests.test_cli import ok

TASK = "token-mean"


class MeanHead(nn.Module):
    def forward(self, hidden, attention_mask):
        weights = attention_mask[..., None].to(hidden.dtype)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


def prepare(model: Any, texts: list[str], scale: float = 1.0) -> Prepared:
    """Each text's mean token vector, times `scale`."""
    if not texts:
        raise hotrod.HotrodError("nothing to average")
    return Prepared(encode(model, texts), options={"scale": scale})


def finish(model: Any, prepared: Prepared, outputs: list[dict[str, torch.Tensor]]) -> list[list[float]]:
    return [(out["mean"] * prepared.options["scale"]).tolist() for out in outputs]


def compare(candidate: Any, reference: Any, examples: list) -> dict:
    rows = example_rows(candidate, examples)
    ours = torch.stack([o["mean"] for o in candidate.run_rows(rows)])
    theirs = torch.stack([o["mean"] for o in reference.run_rows(rows)])
    cosine = float(torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).min())
    return {"examples": len(rows), "mean_cosine": cosine, "score": cosine, "score_name": "mean cosine"}


def _route() -> tasks.Route:
    def schemas():
        from pydantic import BaseModel

        from hotrod.serve.schemas import Usage

        class MeanRequest(BaseModel):
            model: str | None = None
            input: list[str]

        class MeanResponse(BaseModel):
            model: str
            vectors: list[list[float]]
            usage: Usage

        return MeanRequest, MeanResponse

    return tasks.Route(
        "/v1/token-mean", "token_mean", schemas,
        door=lambda body: tasks.Door("input", len(body.input), [(f"input[{i}]", t) for i, t in enumerate(body.input)]),
        arguments=lambda body: (body.input,),
        respond=lambda body, vectors, reply: schemas()[1](model=reply.model, vectors=vectors, usage=reply.usage))


def _command() -> tasks.Command:
    def arguments(p):
        p.add_argument("texts", nargs="+")
        p.add_argument("--scale", type=float, default=1.0)

    return tasks.Command("token-mean", "mean token vectors", arguments,
                         call=lambda model, args: model.token_mean(args.texts, scale=args.scale),
                         show=lambda args, vectors: (f"{len(v)} numbers\t{t}" for t, v in zip(args.texts, vectors)),
                         truncate=False)


@pytest.fixture
def toy_task():
    pipeline = types.SimpleNamespace(prepare=prepare, finish=finish)
    spec = tasks.register(tasks.TaskSpec(
        TASK, kinds=("encoder",), outputs=(tasks.Output("mean", ("batch", "hidden")),), head=lambda config: MeanHead(),
        method="token_mean", pipeline=pipeline,
        measure=Measure("vectors", "input", ex.plain, ex.singles, on_rows(compare), rows=example_rows),
        command=_command(), route=_route(), summary="the mean of each text's token vectors"))
    yield spec
    tasks.unregister(TASK)


@pytest.fixture
def built(toy_task, zoo, tmp_path):
    return hotrod.optimize(zoo.checkpoint("bert"), tmp_path / "mean", task=TASK, verify_examples=8)


def test_the_api_builds_verifies_and_runs_a_new_task(built, zoo):
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["task"] == TASK and manifest["verification"]["score_name"] == "mean cosine"
    assert manifest["verification"]["score"] > 0.999
    model, reference = hotrod.load(built), hotrod.load(zoo.checkpoint("bert"), backend="torch")
    vectors = model.token_mean(["hello world", "the quick brown fox"], scale=2.0)
    hidden = reference(torch.tensor([reference.tokenizer("hello world")["input_ids"]])).last_hidden_state
    assert torch.allclose(torch.tensor(vectors[0]), 2 * hidden[0].mean(0), atol=1e-4)
    assert hotrod.verify(built, examples=4)["score"] > 0.999
    with pytest.raises(hotrod.HotrodError, match="token_mean\\(\\) needs a token-mean model"):
        zoo.model("bert-cls", "onnxruntime").token_mean(["hello"])


def test_the_cli_has_the_new_task_command(built, capsys):
    vectors = json.loads(ok(capsys, "token-mean", built, "hello world", "--json"))
    assert vectors == hotrod.load(built).token_mean(["hello world"])
    assert ok(capsys, "token-mean", built, "hello world").startswith("32 numbers")


def test_the_server_has_the_new_task_route(built):
    from fastapi.testclient import TestClient

    from hotrod.serve.app import create_app
    from hotrod.serve.worker import ModelWorker, ServeOptions

    worker = ModelWorker("mean", hotrod.load(built), ServeOptions())
    worker.start()
    try:
        with TestClient(create_app({"mean": worker})) as client:
            body = client.post("/v1/token-mean", json={"input": ["hello world", "a tiny model"]}).json()
            expected = hotrod.load(built).token_mean(["hello world", "a tiny model"])
            assert torch.allclose(torch.tensor(body["vectors"]), torch.tensor(expected), atol=1e-5)
            assert body["usage"]["prompt_tokens"] > 0
            refused = client.post("/v1/token-mean", json={"input": ["hello", " "]})
            assert refused.status_code == 400 and "input[1]" in refused.json()["error"]["message"]
    finally:
        worker.stop(drain=False)


@pytest.mark.parametrize("architecture, task", [("GPT2Model", "text-generation"), ("GPT2LMHeadModel", "text-generation"),
                                                ("GPT2DoubleHeadsModel", None)])
def test_a_head_named_as_a_model_is_not_taken_for_the_bare_model(architecture, task):
    from hotrod.models import get_family

    config = types.SimpleNamespace(architectures=[architecture])
    if task is not None:
        assert tasks.task_of(config, get_family("gpt2")) == task
        return
    with pytest.raises(hotrod.HotrodError, match=f"head {architecture} is not supported by hotrod's gpt2 family"):
        tasks.task_of(config, get_family("gpt2"))
