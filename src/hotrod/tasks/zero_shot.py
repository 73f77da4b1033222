"""Zero-shot classification, a variant of text-classification: an NLI head's entailment of each candidate
label's hypothesis by each text, as transformers' `pipeline("zero-shot-classification")` answers it
(`hotrod.pipelines.zero_shot`). Its models are the classifiers with an entailment label; it is verified on
(premise, hypothesis) pairs, the rows its pipeline runs."""

from __future__ import annotations

import argparse
from typing import Any

from hotrod.errors import HotrodError
from hotrod.pipelines import zero_shot
from hotrod.tasks.constants import CLASSIFY, ZERO_SHOT
from hotrod.tasks.registry import Command, Door, Route, TaskSpec, register
from hotrod.verification.measures import ZERO_SHOT as MEASURE


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--labels", required=True, help="the candidate labels, comma-separated")
    p.add_argument("--template", default=zero_shot.DEFAULT_TEMPLATE,
                   help="the hypothesis made of each label, {} where it goes (default: 'This example is {}.')")
    p.add_argument("--multi-label", action="store_true",
                   help="score each label on its own (entailment against contradiction), not one softmax among them")


def _call(model: Any, args: argparse.Namespace) -> Any:
    return model.zero_shot(list(args.texts), args.labels, hypothesis_template=args.template,
                           multi_label=args.multi_label, truncate=args.truncate)


def _show(args: argparse.Namespace, results: Any):
    for result in results:
        yield "  ".join(f"{label} {score:.4f}" for label, score in zip(result["labels"], result["scores"])) \
            + f"\t{result['sequence']}"


def _schemas() -> tuple[type, type]:
    from hotrod.serve.task_schemas import ZeroShotRequest, ZeroShotResponse

    return ZeroShotRequest, ZeroShotResponse


def _texts(body: Any) -> list[str]:
    return [body.input] if isinstance(body.input, str) else body.input


def _door(body: Any) -> Door:
    labels = body.candidate_labels
    named = [("candidate_labels", labels)] if isinstance(labels, str) else \
        [(f"candidate_labels[{i}]", label) for i, label in enumerate(labels)]
    return Door("input", len(_texts(body)), [(f"input[{i}]", text) for i, text in enumerate(_texts(body))],
                body.truncate, other=[("candidate_labels", named, False)])


def _check(body: Any, limits: Any) -> None:
    """The (text, label) pairs a request makes, at most the rows the server runs per request, counted
    before any tokenizing (labels the pipeline refuses are its to name)."""
    try:
        labels = zero_shot.parse_labels(body.candidate_labels)
    except HotrodError:
        return
    pairs = len(_texts(body)) * len(labels)
    if pairs > limits.max_batch_inputs:
        raise ValueError(f"candidate_labels: {len(_texts(body))} texts with {len(labels)} labels make {pairs} "
                         f"(text, label) pairs; this server runs at most {limits.max_batch_inputs} per request "
                         "(--max-batch-inputs)")


def _arguments_of(body: Any) -> tuple:
    return _texts(body), body.candidate_labels, body.hypothesis_template, body.multi_label, body.truncate


def _respond(body: Any, results: Any, reply: Any) -> Any:
    from hotrod.serve.task_schemas import ZeroShotResponse

    return ZeroShotResponse(model=reply.model, results=results, usage=reply.usage)


SPEC = register(TaskSpec(
    ZERO_SHOT, kinds=("encoder",), variant_of=CLASSIFY, fits_labels=zero_shot.has_entailment, needs=zero_shot.NEEDS,
    method="zero_shot", pipeline=zero_shot, measure=MEASURE,
    command=Command("zero-shot", "candidate labels of texts, best first, by an NLI model's entailment", _arguments,
                    _call, _show),
    route=Route("/v1/zero-shot", "zero_shot", _schemas, _door, _arguments_of, _respond, check=_check,
                fields=("candidate_labels", "hypothesis_template", "multi_label"), many="(text, label) pairs"),
    summary="candidate labels of texts by an NLI head's entailment",
))
