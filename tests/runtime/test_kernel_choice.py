"""This machine's record of the CPU kernels a measurement left out (`hotrod tune`): graphs loaded afterwards
keep onnxruntime's ops where such a kernel would have run (the same answers, where the kernel computes
onnxruntime's arithmetic); a damaged record leaves nothing out; the record is kept whole, per machine and
library, under hotrod's cache, earlier choices kept where not measured again."""

from __future__ import annotations

import json
import os

import pytest
import torch

import hotrod
from hotrod import files
from hotrod.errors import HotrodError
from hotrod.runtime import attention, kernel_choice, native, rows
from tests.zoo import CASES, prompt_batch

library = pytest.mark.skipif(native.library() is None, reason="no kernels' library for this CPU: onnxruntime's ops run")


@pytest.fixture(scope="module")
def int8_bert(zoo, tmp_path_factory):
    return hotrod.optimize(zoo.checkpoint("bert"), tmp_path_factory.mktemp("bert-int8"), precision="int8",
                           progress=False, verify_examples=0)


def _ops(model) -> set[str]:
    return set().union(*model.backend.kernel_ops.values())


def test_without_a_record_every_kernel_runs():
    assert not kernel_choice.record_path().exists() and kernel_choice.left_out() == frozenset()


@library
def test_a_kernel_left_out_here_gives_way_to_onnxruntimes_ops_with_the_same_answers(int8_bert):
    ids, mask = prompt_batch(CASES["bert"], (7, 4))
    every = hotrod.load(int8_bert, device="cpu", threads=1)
    assert rows.OP in _ops(every)
    path, chosen = kernel_choice.record({"quantize-rows": True}, {"quantize-rows": {"speedup": 0.9}})
    assert chosen == {"quantize-rows"}
    assert path.parent == kernel_choice.record_path().parent and kernel_choice.left_out() == {"quantize-rows"}
    fewer = hotrod.load(int8_bert, device="cpu", threads=1)
    assert rows.OP not in _ops(fewer)
    with torch.no_grad():
        answers = [model(input_ids=ids, attention_mask=mask).last_hidden_state for model in (every, fewer)]
    assert torch.equal(*answers)
    with kernel_choice.leaving_out(set()):  # a measurement's own choice, whatever the record says
        assert rows.OP in _ops(hotrod.load(int8_bert, device="cpu", threads=1))
    assert kernel_choice.forget() and kernel_choice.left_out() == frozenset() and not kernel_choice.forget()


@library
def test_the_attentions_path_on_vdpbf16ps_left_out_runs_it_on_fmas_close_to_the_same_answers(int8_bert):
    if attention.path() != attention.PAIRS:
        pytest.skip("this CPU's attention takes no path on VDPBF16PS")
    ids, mask = prompt_batch(CASES["bert"], (7, 4))
    pairs = hotrod.load(int8_bert, device="cpu", threads=1)
    assert {attention.OP, attention.PAIRS_PATH} <= _ops(pairs)
    assert kernel_choice.kernels_in(_ops(pairs))[-1] == kernel_choice.ATTENTION_PAIRS  # so the tune measures it
    with kernel_choice.leaving_out({kernel_choice.ATTENTION_PAIRS}):
        fmas = hotrod.load(int8_bert, device="cpu", threads=1)
    assert attention.OP in _ops(fmas) and attention.PAIRS_PATH not in _ops(fmas)
    with torch.no_grad():  # the same bf16 operands, summed in another order
        first, second = (model(input_ids=ids, attention_mask=mask).last_hidden_state for model in (pairs, fmas))
    torch.testing.assert_close(first, second, atol=2e-2, rtol=0)


def test_a_record_keeps_earlier_choices_and_measurements_and_is_written_whole():
    kernel_choice.record({"int4-matmul": True}, {"int4-matmul": {"speedup": 0.95}})
    _, chosen = kernel_choice.record({"quantize-rows": False}, {"quantize-rows": {"speedup": 1.3}})
    body = json.loads(kernel_choice.record_path().read_text())
    assert chosen == {"int4-matmul"} and body["left_out"] == ["int4-matmul"]  # not measured the second time: kept
    assert set(body["measured"]) == {"int4-matmul", "quantize-rows"}
    _, chosen = kernel_choice.record({"int4-matmul": False}, {})  # measured again, and kept now
    assert chosen == frozenset() == kernel_choice.left_out()
    assert not list(kernel_choice.record_path().parent.glob("*.tmp"))
    assert kernel_choice.record_path().stat().st_mode & 0o044  # readable as the user's other files are


def test_a_tuned_artifact_runs_its_own_verdicts_and_the_machines_elsewhere(tmp_path):
    """The int4 kernel losing on one artifact's shapes and winning on another's: each keeps its own verdict,
    an artifact never tuned the machine's choice, and a verdict its tune did not reach the machine's."""
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "t5").mkdir()
    (tmp_path / "gpt2" / "manifest.json").write_text('{"a": 1}')
    (tmp_path / "t5" / "manifest.json").write_text('{"a": 2}')
    gpt2, t5 = kernel_choice.artifact_key(tmp_path / "gpt2"), kernel_choice.artifact_key(tmp_path / "t5")
    assert gpt2 != t5 and kernel_choice.artifact_key(tmp_path) is None  # a build under way: no manifest yet
    _, chosen = kernel_choice.record({"int4-matmul": True}, {}, gpt2)
    assert chosen == {"int4-matmul"}
    _, chosen = kernel_choice.record({"int4-matmul": False, "attention": True}, {}, t5)
    assert chosen == {"attention"} == kernel_choice.left_out(t5)
    assert kernel_choice.left_out(gpt2) == {"int4-matmul", "attention"}  # its own int4 verdict, the machine's rest
    assert kernel_choice.left_out() == {"attention"} == kernel_choice.left_out("never-tuned")
    kernel_choice.record({}, {}, "undecided")  # a tune that decided nothing keeps no entry
    assert kernel_choice.tuned_artifacts() == 2
    body = json.loads(kernel_choice.record_path().read_text())
    body["by_artifact"]["stale"] = {"turbo": True}  # a kernel a later hotrod dropped: the next tune drops it
    kernel_choice.record_path().write_text(json.dumps(body))
    assert kernel_choice.left_out(gpt2) == frozenset()  # meanwhile the record does not read: every kernel runs
    kernel_choice.record({"layernorm": False}, {}, t5)
    assert kernel_choice.left_out(gpt2) == {"int4-matmul", "attention"} and kernel_choice.tuned_artifacts() == 2
    (tmp_path / "gpt2" / "manifest.json").chmod(0)
    if not os.access(tmp_path / "gpt2" / "manifest.json", os.R_OK):  # root reads it anyway
        assert kernel_choice.artifact_key(tmp_path / "gpt2") is None


def test_a_write_that_fails_leaves_the_record_as_it_was(monkeypatch):
    kernel_choice.record({"attention": True}, {})
    monkeypatch.setattr(files.os, "replace", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left")))
    with pytest.raises(OSError):
        kernel_choice.record({"attention": False}, {})
    assert kernel_choice.left_out() == {"attention"}
    assert not list(kernel_choice.record_path().parent.glob("*.tmp"))


@pytest.mark.parametrize("text", ["{", '{"left_out": ["turbo"]}', '{"left_out": "rows"}', "[]", '{"other": 1}',
                                  '{"left_out": [], "by_artifact": {"k": {"turbo": true}}}',
                                  '{"left_out": [], "by_artifact": {"k": {"attention": 1}}}'])
def test_a_damaged_record_warns_and_leaves_nothing_out(text):
    path = kernel_choice.record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    with pytest.warns(UserWarning, match="not a kernel record"):
        assert kernel_choice.left_out() == frozenset()


def test_unknown_kernels_are_refused_by_name():
    with pytest.raises(HotrodError, match="unknown kernels \\['turbo'\\]"), kernel_choice.leaving_out({"turbo"}):
        pass
    with pytest.raises(HotrodError, match="unknown kernels"):
        kernel_choice.record({"turbo": True}, {})


def test_every_kernel_names_the_ops_it_brings():
    ops = [op for kernel in kernel_choice.KERNELS.values() for op in kernel.ops]
    assert len(ops) == len(set(ops))
    assert kernel_choice.kernels_in({rows.OP, "Int8MatMulSplit", "MatMul"}) == ["int8-matmul", "quantize-rows"]
