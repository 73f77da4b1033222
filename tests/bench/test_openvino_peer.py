"""OpenVINO as a peer, in an environment of its own: found or skipped with the reason, and its answers.

The tests that run OpenVINO need the environment `make peers` builds, named by HOTROD_OPENVINO_PYTHON
(`make test-peers` sets it); they skip with that reason where it is absent.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import transformers

from hotrod.bench import openvino_peer, peers
from hotrod.bench.case import Case
from hotrod.bench.remote import RemoteError
from hotrod.bench.runners import pytorch_runner
from hotrod.kinds import spec as kind_spec
from tests.zoo import CASES, HEAD_CASES, TASK_HEADS

OPENVINO_PYTHON = os.environ.get(openvino_peer.ENVIRONMENT)
needs_openvino = pytest.mark.skipif(not OPENVINO_PYTHON, reason=f"{openvino_peer.ENVIRONMENT} is not set "
                                    "(make test-peers builds the environment and sets it)")


def test_without_an_environment_the_reason_says_how_to_make_one(monkeypatch):
    monkeypatch.delenv(openvino_peer.ENVIRONMENT, raising=False)
    monkeypatch.setattr(openvino_peer, "_has_intel", lambda: False)
    assert "make peers" in peers.missing_peers(["openvino"])["openvino"]


@pytest.mark.parametrize("python, reason", [("/no/such/python", "is not a file"),
                                            (sys.executable, "cannot import optimum.intel")])
def test_a_named_environment_that_cannot_run_it_is_skipped_with_the_reason(monkeypatch, python, reason):
    monkeypatch.setenv(openvino_peer.ENVIRONMENT, python)
    if python == sys.executable and openvino_peer._has_intel():
        pytest.skip("optimum-intel is installed beside hotrod here")
    assert reason in peers.missing_peers(["openvino"])["openvino"]


def test_openvino_is_timed_on_the_cpu_only():
    assert "CPU only" in openvino_peer.problem("cuda")


def _case(zoo, name: str, lengths=(6,)) -> tuple[Case, torch.nn.Module]:
    kind = CASES[name].kind
    model = getattr(transformers, kind_spec(kind).auto_class).from_pretrained(zoo.checkpoint(name)).eval()
    return Case(name, str(zoo.checkpoint(name)), kind, lengths, 0 if kind == "encoder" else 4), model


def _system(case: Case, ids, mask, name: str):
    return openvino_peer._builder(case, ids, mask, 1, name)()


@needs_openvino
@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_fp32_tokens_are_transformers_tokens(zoo, name):
    case, model = _case(zoo, name)
    ids, mask = case.inputs(model.config.vocab_size)
    system = _system(case, ids, mask, "fp32")
    try:
        assert torch.equal(system.call(), pytorch_runner(model, case.kind, ids, mask, case.generate_kwargs())())
        assert system.first_token().shape[1] == ids.shape[1] + 1 - (case.kind == "seq2seq") * (ids.shape[1] - 1)
    finally:
        system.close()


def _cosine_to_fp32(zoo, name: str, precision: str) -> tuple[Case, float]:
    """The tiny bert through OpenVINO's `name` format (held to hotrod's `precision`) beside transformers' fp32: the
    case, and the mean cosine of the real rows' hidden states."""
    case, model = _case(zoo, "bert", lengths=(7, 3))
    ids, mask = case.inputs(model.config.vocab_size)
    system = _system(case, ids, mask, name)
    try:
        ours = system.call()
        assert system.precision == precision and system.figures["format"] == name
    finally:
        system.close()
    with torch.inference_mode():
        theirs = model(input_ids=ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    return case, float(torch.nn.functional.cosine_similarity(ours[keep], theirs[keep], dim=-1).mean())


@needs_openvino
def test_full_int8_encoder_stays_close_to_fp32(zoo):
    assert _cosine_to_fp32(zoo, "int8-full", "int8-static")[1] > 0.95


@needs_openvino
def test_the_bf16_format_computes_the_fp32_export_and_stays_close_to_it(zoo):
    case, cosine = _cosine_to_fp32(zoo, "bf16", "bf16-products")
    assert not openvino_peer.converted_path(case.source, case.kind, "bf16").exists()  # fp32's export, computed in bf16
    assert cosine > 0.99


@needs_openvino
@pytest.mark.parametrize("head, query", [("qa", 0), ("cls", 2), ("ner", 0)])
def test_fp32_heads_answer_as_transformers(zoo, head, query):
    """Each head runs as optimum-intel's class for its task and answers through the harness's own code: the
    span search gives PyTorch's spans, classifiers (here on text pairs, with their token types, as W7's
    rows are) and taggers give its logits."""
    name = f"bert-{head}"
    task = TASK_HEADS[head][0]
    case = Case(name, str(zoo.checkpoint(name)), "encoder", (9, 7), task=task, query=query)
    model = HEAD_CASES[name].hf_class.from_pretrained(case.source).eval()
    ids, mask = case.inputs(model.config.vocab_size)
    system = _system(case, ids, mask, "fp32")
    try:
        ours = system.call()
    finally:
        system.close()
    theirs = pytorch_runner(model, case.kind, ids, mask, task=task, types=case.token_types(mask))()
    if task == "question-answering":
        assert torch.equal(ours, theirs)
    else:
        # The tiny classifier's logits are about 0.01 and its token types move them by 6e-5: a tolerance
        # that would not notice them dropped would prove nothing (fp32 lands within 1e-8).
        assert ours.shape == theirs.shape and torch.allclose(ours, theirs, rtol=1e-4, atol=1e-6)


@needs_openvino
def test_a_conversion_that_fails_is_one_line_and_leaves_nothing(zoo):
    case = Case("broken", str(zoo.checkpoint("gpt2")), "seq2seq", (4,), 2)  # GPT-2 has no seq2seq export
    ids, mask = case.inputs(100)
    with pytest.raises(RemoteError) as caught:
        _system(case, ids, mask, "int8")
    assert "\n" not in str(caught.value) and str(caught.value)
    assert not openvino_peer.converted_path(case.source, case.kind, "int8").exists()


@needs_openvino
def test_bench_times_openvino_beside_hotrod(zoo, tmp_path, bench_peer):
    (result,) = bench_peer(zoo.checkpoint("bert"), tmp_path / "bench", "openvino", "--batch", "2", "--seq", "5")
    assert {"openvino int8", "openvino int8-full"} <= set(result["systems"]), result["skipped"]
    assert result["systems"]["openvino int8"]["agreement"] > 0.99
    assert result["systems"]["openvino int8"]["version"]
