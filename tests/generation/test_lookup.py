"""Prompt lookup decoding: greedy decoding's tokens, fewer passes where the output copies the prompt."""

from __future__ import annotations

import pytest
import torch

import hotrod
from hotrod.generation.lookup import Lookup, find_draft


def test_a_draft_is_what_followed_the_latest_earlier_occurrence_of_the_tail():
    assert find_draft([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2) == [7, 1]  # the latest match of (1, 2, 3)
    assert find_draft([5, 6, 7, 8, 6], 3) == [7, 8, 6]  # a one-token tail when longer ones never recur
    assert find_draft([1, 2, 3], 4) == []


def test_a_single_token_is_looked_up_in_the_prompt_only():
    # prompt [5, 6, 7], then the output 8, 9, 8: the 8 recurs only in the output
    assert find_draft([5, 6, 7, 8, 9, 8], 2, prompt=3) == []
    assert find_draft([5, 6, 7, 8, 9, 8], 2) == [9, 8]  # without a prompt, anywhere in the row
    assert find_draft([5, 6, 7, 8, 6], 2, prompt=3) == [7, 8]  # the 6 is in the prompt
    assert find_draft([5, 8, 9, 0, 8, 9], 2, prompt=1) == [0, 8]  # two tokens are looked up anywhere


def _prompts(vocab: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    base = torch.randint(2, vocab, (8,), generator=generator)
    return [torch.cat([base, base[:4], base])[None], base[None], torch.randint(2, vocab, (1, 20), generator=generator)]


@pytest.mark.parametrize("name", ["gpt2", "t5"])
@pytest.mark.parametrize("draft", [1, 4, 10])
def test_prompt_lookup_gives_greedy_decodings_tokens(zoo, backend, draft, name):
    model = zoo.model(name, backend)
    if not model.backend.verifies_drafts:
        with pytest.raises(hotrod.HotrodError, match="static engine"):
            model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, prompt_lookup_num_tokens=draft)
        return
    for ids in _prompts(model.dims.vocab_size):
        plain = model.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False)
        assert torch.equal(model.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False,
                                          prompt_lookup_num_tokens=draft), plain)


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_drafts_are_accepted_where_the_output_repeats(zoo, name):
    model = zoo.model(name, "onnxruntime")
    ids = _prompts(model.dims.vocab_size)[0]
    from hotrod.generation import config as gen_config

    values = gen_config.merge(model.generation_config, None, {"max_new_tokens": 30, "min_new_tokens": 30})
    settings = model.settings(ids.shape[1], values)
    lookup = Lookup(model.decoding_state(settings), settings, 6)
    out = lookup.generate(ids, torch.ones_like(ids))
    assert torch.equal(out, model.generate(ids, max_new_tokens=30, min_new_tokens=30))
    assert lookup.drafted > 0 and 0 <= lookup.accepted <= lookup.drafted


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"prompt_lookup_num_tokens": 0}, "from 1 to 64"),
    ({"prompt_lookup_num_tokens": -3}, "from 1 to 64"),
    ({"prompt_lookup_num_tokens": 10_000}, "from 1 to 64"),
    ({"prompt_lookup_num_tokens": True}, "from 1 to 64"),
    ({"prompt_lookup_num_tokens": 3, "num_beams": 2}, "not beam search"),
    ({"prompt_lookup_num_tokens": 3, "do_sample": True, "num_return_sequences": 2}, "one row"),
    ({"assistant_model": object()}, "assistant_model"),
])
def test_bad_lookup_settings_are_one_line(zoo, kwargs, message):
    model = zoo.model("gpt2", "onnxruntime")
    with pytest.raises(hotrod.HotrodError, match=message):
        model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, **kwargs)


def test_lookup_is_refused_where_it_does_not_run_yet(zoo):
    with pytest.raises(hotrod.HotrodError, match="one row"):
        zoo.model("gpt2", "onnxruntime").generate(torch.tensor([[3, 4], [5, 6]]), max_new_tokens=4,
                                                  prompt_lookup_num_tokens=2)


def test_generate_command_takes_prompt_lookup(zoo, capsys):
    from tests.test_cli import ok, run

    artifact = zoo.artifact("gpt2")
    plain = ok(capsys, "generate", artifact, "3 4 5 3 4 5 3", "--ids", "--max-new-tokens", "8")
    assert ok(capsys, "generate", artifact, "3 4 5 3 4 5 3", "--ids", "--max-new-tokens", "8",
              "--prompt-lookup", "3") == plain
    code, _, err = run(capsys, "generate", artifact, "3 4", "--ids", "--prompt-lookup", "0")
    assert code == 1 and "prompt_lookup_num_tokens must be a whole number from 1 to 64" in err


def test_sampling_with_lookup_draws_from_the_models_distribution(zoo):
    model = zoo.model("gpt2", "onnxruntime")
    ids = _prompts(model.dims.vocab_size)[0]

    def sampled(seed: int, **kwargs) -> torch.Tensor:
        torch.manual_seed(seed)
        return model.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=True, prompt_lookup_num_tokens=4,
                              **kwargs)

    assert torch.equal(sampled(3), sampled(3))  # torch's generator reproduces it
    greedy = model.generate(ids, max_new_tokens=16, min_new_tokens=16)
    assert torch.equal(sampled(4, top_k=1), greedy)  # one candidate a step: sampling is greedy decoding

