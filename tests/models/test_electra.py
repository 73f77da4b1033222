"""ELECTRA without `embeddings_project`: a checkpoint whose embedding_size is the hidden size has no
projection, and hotrod's module adds none."""

from __future__ import annotations

import dataclasses

import torch
import transformers

from tests.zoo import CASES, HIDDEN, build_checkpoint, load_on, prompt_batch


def test_equal_embedding_and_hidden_sizes_load_without_a_projection(tmp_path):
    base = CASES["electra"]

    def config():
        made = base.config()
        made.embedding_size = HIDDEN
        return made

    case = dataclasses.replace(base, config=config)
    source = build_checkpoint(case, tmp_path / "ckpt")
    reference = transformers.ElectraModel.from_pretrained(source).eval()
    assert not hasattr(reference, "embeddings_project")
    model = load_on(source, "torch")
    ids, mask = prompt_batch(case, (6, 4))
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state
    got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=1e-4, rtol=0)
