"""Every encoder family with every task head: its outputs against transformers', on every backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import hotrod
from tests.zoo import HEAD_CASES, MNLI_CASES, prompt_batch

FIELDS = {"text-classification": ("logits",), "token-classification": ("logits",),
          "question-answering": ("start_logits", "end_logits")}


def test_head_outputs_match_transformers(zoo, head_case, backend):
    case = HEAD_CASES[head_case]
    model = zoo.model(head_case, backend)
    assert model.task == case.task
    ids, mask = prompt_batch(case, (9, 4, 6), seed=3)
    inputs = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        theirs = zoo.reference(head_case)(**inputs)
    ours = model(**inputs)
    for field in FIELDS[case.task]:
        expected = getattr(theirs, field)
        if expected.dim() > 1 and expected.shape[1] == ids.shape[1]:  # per token: real positions only
            keep = mask.bool()
            ours_real, expected = ours[field][keep], expected[keep]
        else:
            ours_real = ours[field]
        torch.testing.assert_close(ours_real, expected, atol=1e-4, rtol=0)


def test_labelled_heads_carry_their_label_map(zoo, head_case):
    case = HEAD_CASES[head_case]
    model = zoo.model(head_case, "onnxruntime")
    expected = {} if case.task == "question-answering" else dict(case.config().id2label)
    assert model.labels == expected
    assert model.manifest["task"] == case.task


def _without_architectures(checkpoint: Path) -> Path:
    config = json.loads((checkpoint / "config.json").read_text())
    config.pop("architectures", None)
    (checkpoint / "config.json").write_text(json.dumps(config))
    return checkpoint


def test_head_weights_under_a_config_naming_no_head_are_refused_not_dropped(zoo, head_case, tmp_path):
    """transformers' AutoModel would run such a checkpoint bare and drop its head with a warning: hotrod says
    so in one line naming the head's weights and the tasks that run it, and runs the head when told to."""
    case = HEAD_CASES[head_case]
    checkpoint = _without_architectures(zoo.copy_checkpoint(head_case, tmp_path / "ckpt"))
    with pytest.raises(hotrod.HotrodError, match=f"names no architectures.*--task.*{case.task}") as caught:
        hotrod.load(checkpoint, backend="torch")
    assert "\n" not in str(caught.value)
    named = ("classification_head.dense.weight",) if head_case in MNLI_CASES else ("classifier.", "qa_outputs.")
    assert any(name in str(caught.value) for name in named)  # as the checkpoint names them
    ids, mask = prompt_batch(case, (5, 3), seed=1)
    told = hotrod.load(checkpoint, backend="torch", task=case.task)
    ours = told(input_ids=ids, attention_mask=mask)
    theirs = zoo.model(head_case, "torch")(input_ids=ids, attention_mask=mask)
    for field in FIELDS[case.task]:
        torch.testing.assert_close(ours[field], theirs[field], atol=0, rtol=0)


def test_a_bare_checkpoint_naming_no_head_runs_bare(zoo, encoder_case, tmp_path):
    """The check looks for a whole head: a bare model's own extras (BERT's pooler) are no head."""
    checkpoint = _without_architectures(zoo.copy_checkpoint(encoder_case, tmp_path / "ckpt"))
    assert hotrod.load(checkpoint, backend="torch").task == "feature-extraction"
