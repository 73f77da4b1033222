"""The loop prompt lookup and assisted decoding share, on a model whose scores are fixed."""

from __future__ import annotations

import torch

from hotrod.generation import config as gen_config
from hotrod.generation.assist import Assist
from hotrod.generation.drafts import Drafting
from hotrod.generation.lookup import Lookup
from hotrod.generation.search import sample_or_greedy


class Fixed:
    """A decoding state whose model scores token 0 a little above token 1 after anything."""

    sequences_include_prompt = True
    logits = torch.tensor([[1.0, 0.9, 0.0, 0.0]])

    def start(self, input_ids, attention_mask, expand):
        return input_ids, self.logits

    def step(self, tokens):
        return self.logits

    def verify(self, tokens):
        return self.logits[:, None].expand(1, tokens.shape[1], 4)

    def rewind(self, positions):
        pass


def test_the_repetition_penalty_leaves_out_a_padded_rows_padding_as_plain_decoding_does():
    ids, mask = torch.tensor([[0, 0, 2, 3, 2, 3]]), torch.tensor([[0, 0, 1, 1, 1, 1]])
    values = gen_config.merge(None, None, {"repetition_penalty": 2.0, "max_new_tokens": 6})
    settings = gen_config.resolve(values, ids.shape[1], None)
    plain = sample_or_greedy(Fixed(), ids, mask, settings)
    assert plain[0, 6] == 0  # the padding's token 0 is not penalised
    assert torch.equal(Lookup(Fixed(), settings, 3).generate(ids, mask), plain)
    assert torch.equal(Assist(Fixed(), settings, Fixed(), 3).generate(ids, mask), plain)


def test_a_sampled_draft_is_kept_as_often_as_the_model_draws_it():
    """The draw that differs from the draft is the next token: drawing again there would favour the draft."""
    settings = gen_config.resolve(gen_config.merge(None, None, {"do_sample": True, "max_new_tokens": 4}), 1, None)
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    every = p.log()[None, None].expand(1, 2, 4)  # the model's distribution after the last token and after the draft
    torch.manual_seed(0)
    trials = 4000
    counts = torch.zeros(4)
    for _ in range(trials):
        kept, token = Drafting(None, settings).accept(every, [1], [0])
        counts[(kept or [token])[0]] += 1
    assert (counts / trials - p).abs().max() < 0.03  # drawing again after a miss: 0.75 for token 0
