"""Every encoder family with every task head: its outputs against transformers', on every backend."""

from __future__ import annotations

import torch

from tests.zoo import HEAD_CASES, prompt_batch

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
