"""Verifying a draft in one pass over the in-place cache: the logits after each drafted token are those of
decoding the tokens one step at a time, for every kind that generates, and `rewind` gives positions back.
(onnxruntime's in-place attention takes several new tokens for one row at a time: drafts are verified per
row.)"""

from __future__ import annotations

import pytest
import torch

from hotrod.generation import config as gen_config

DRAFTED = 4


def _started(model, ids: torch.Tensor):
    values = gen_config.merge(model.generation_config, None, {"max_new_tokens": 16})
    state = model.decoding_state(model.settings(ids.shape[1], values))
    state.start(ids, torch.ones_like(ids), 1)
    return state


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_one_pass_over_a_draft_equals_steps(zoo, name):
    model = zoo.model(name, "onnxruntime")
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(2, model.dims.vocab_size, (1, 7), generator=generator)
    draft = torch.randint(2, model.dims.vocab_size, (1, DRAFTED), generator=generator)

    stepped = _started(model, ids)
    # A step's logits are good until the state's next call (they may lie in a buffer of its own): kept, copied.
    one_by_one = torch.stack([stepped.step(draft[:, j]).clone() for j in range(DRAFTED)], dim=1)
    verified = _started(model, ids)
    torch.testing.assert_close(verified.verify(draft), one_by_one, rtol=1e-4, atol=1e-4)

    # Two drafted tokens given back: the next step reads only the two kept, whatever the buffers hold past them.
    verified.rewind(DRAFTED - 2)
    reference = _started(model, ids)
    reference.verify(draft[:, :2])
    token = torch.tensor([7])
    torch.testing.assert_close(verified.step(token), reference.step(token), rtol=1e-4, atol=1e-4)
