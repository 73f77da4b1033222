"""generate() is token-identical to transformers' generate, per language model, backend and decoding mode."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch
import transformers
from packaging.version import Version

from tests.zoo import CASES, POSITIONS, assert_same_tokens, prompt_batch

SINGLE, BATCH = (7,), (7, 3, 5)


@dataclass(frozen=True)
class Scenario:
    kwargs: dict = field(default_factory=dict)
    stop_often: bool = False  # end on any of the tokens the model emits most, so hypotheses finish early
    seed: int | None = None  # sampling: torch.manual_seed before each side's call
    since: str = "0"  # the first transformers release whose algorithm hotrod follows here


SCENARIOS = {
    "greedy": Scenario(dict(max_new_tokens=12)),
    "greedy_stop_often": Scenario(dict(max_new_tokens=12), stop_often=True),
    "greedy_stop_often_own_pad": Scenario(dict(max_new_tokens=12, pad_token_id=2), stop_often=True),
    "beam": Scenario(dict(max_new_tokens=12, num_beams=4)),
    "beam_stop_often_own_pad": Scenario(dict(max_new_tokens=12, num_beams=4, num_return_sequences=2, pad_token_id=2),
                                        stop_often=True),
    "beam_return_3": Scenario(dict(max_new_tokens=12, num_beams=4, num_return_sequences=3), stop_often=True),
    "beam_length_penalty_0.5": Scenario(dict(max_new_tokens=12, num_beams=4, num_return_sequences=2,
                                             length_penalty=0.5), stop_often=True),
    "beam_length_penalty_2": Scenario(dict(max_new_tokens=12, num_beams=4, num_return_sequences=2,
                                           length_penalty=2.0), stop_often=True),
    "beam_early_stopping_true": Scenario(dict(max_new_tokens=12, num_beams=4, num_return_sequences=2,
                                              early_stopping=True), stop_often=True),
    "beam_early_stopping_never": Scenario(dict(max_new_tokens=12, num_beams=4, num_return_sequences=2,
                                               early_stopping="never"), stop_often=True),
    "min_new_tokens_repetition_penalty": Scenario(dict(max_new_tokens=10, min_new_tokens=5, repetition_penalty=1.3),
                                                  stop_often=True),
    "beam_repetition_penalty": Scenario(dict(max_new_tokens=10, num_beams=3, repetition_penalty=1.3),
                                        stop_often=True),
    "sample": Scenario(dict(max_new_tokens=10, do_sample=True, top_k=10, top_p=0.9, temperature=0.8), seed=3),
    "sample_hot": Scenario(dict(max_new_tokens=10, do_sample=True, temperature=3.0, top_p=0.95), seed=6),
    "sample_defaults_return_2": Scenario(dict(max_new_tokens=10, do_sample=True, num_return_sequences=2), seed=4),
    # 5.24 ranks the drawn candidates by score before choosing which may finish; earlier releases did not.
    "beam_sample": Scenario(dict(max_new_tokens=10, do_sample=True, num_beams=3, top_k=20), seed=5, since="5.24"),
}


def frequent_tokens(zoo, name: str, ids, mask, count: int = 6) -> list[int]:
    """The tokens transformers' beam search emits most often after the first step (ties by id)."""
    out = zoo.hf_generate(name, ids, mask, max_new_tokens=8, num_beams=4, num_return_sequences=4)
    start = 1 if CASES[name].kind == "seq2seq" else ids.shape[1]
    counts = Counter(out[:, start + 1:].flatten().tolist())
    return [token for token, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:count]]


def generate_ours(model, ids, mask, seed: int | None, **kwargs) -> torch.Tensor:
    if seed is not None:
        torch.manual_seed(seed)
    return model.generate(ids, attention_mask=mask, **kwargs)


@pytest.mark.parametrize("lengths", [SINGLE, BATCH], ids=["single", "batch"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_generate_matches_transformers(zoo, lm_case, backend, lengths, scenario):
    spec = SCENARIOS[scenario]
    if Version(transformers.__version__) < Version(spec.since):
        pytest.skip(f"transformers {transformers.__version__} predates the {spec.since} algorithm hotrod follows")
    ids, mask = prompt_batch(CASES[lm_case], lengths)
    kwargs = dict(spec.kwargs)
    if spec.stop_often:
        kwargs["eos_token_id"] = frequent_tokens(zoo, lm_case, ids, mask)
    # a sampled run draws from its device's generator: on the GPU, compare with transformers on the GPU
    device = "cuda" if backend == "cuda" and spec.seed is not None else "cpu"
    expected = zoo.hf_generate(lm_case, ids, mask, seed=spec.seed, device=device, **kwargs)
    actual = generate_ours(zoo.model(lm_case, backend), ids, mask, spec.seed, **kwargs)
    assert_same_tokens(actual, expected)


def test_generate_infers_the_mask_like_transformers(zoo, lm_case, backend):
    """Without a mask, padding is where the pad token differs from EOS (T5); else every token counts (GPT-2)."""
    ids, mask = prompt_batch(CASES[lm_case], BATCH)
    expected = zoo.hf_generate(lm_case, ids, None, max_new_tokens=6)
    assert_same_tokens(zoo.model(lm_case, backend).generate(ids, max_new_tokens=6), expected)


def test_min_new_tokens_holds_back_eos(zoo, lm_case, backend):
    ids, mask = prompt_batch(CASES[lm_case], BATCH)
    model = zoo.model(lm_case, backend)
    first = model.generate(ids, attention_mask=mask, max_new_tokens=1)[:, -1].tolist()  # would end every row now
    out = model.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=5, eos_token_id=first)
    start = out.shape[1] - 8
    assert out.shape[1] > start + 5
    assert not torch.isin(out[:, start:start + 5], torch.tensor(first)).any()


# A high temperature flattens even the peaked tiny models, so different seeds draw different tokens.
@pytest.mark.parametrize("kwargs", [dict(top_k=0, temperature=5.0), dict(num_beams=2, temperature=5.0)],
                         ids=["sample", "beam_sample"])
def test_sampling_is_reproducible_under_a_seed(zoo, lm_case, backend, kwargs):
    ids, mask = prompt_batch(CASES[lm_case], BATCH)
    model = zoo.model(lm_case, backend)
    runs = [generate_ours(model, ids, mask, seed, do_sample=True, max_new_tokens=10, **kwargs) for seed in (7, 7, 8)]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2]), "the seed does not reach the sampler"


def test_generate_accepts_lists_and_1d_prompts(zoo, lm_case, backend):
    model = zoo.model(lm_case, backend)
    ids, _ = prompt_batch(CASES[lm_case], SINGLE)
    expected = model.generate(ids, max_new_tokens=4)
    assert_same_tokens(model.generate(ids[0], max_new_tokens=4), expected)
    assert_same_tokens(model.generate(ids.tolist(), max_new_tokens=4), expected)
    assert_same_tokens(model.generate(inputs=ids, max_new_tokens=4), expected)


def test_generation_may_use_every_position(zoo, backend):
    ids, mask = prompt_batch(CASES["gpt2"], (POSITIONS - 6, POSITIONS - 9))
    expected = zoo.hf_generate("gpt2", ids, mask, max_new_tokens=6, num_beams=2)
    actual = zoo.model("gpt2", backend).generate(ids, attention_mask=mask, max_new_tokens=6, num_beams=2)
    assert actual.shape[1] == POSITIONS
    assert_same_tokens(actual, expected)


def test_long_seq2seq_generation_matches_transformers(zoo, seq2seq_case, backend):
    """Encoder and decoder distances beyond T5's exact buckets (log-spaced and clamped relative positions)."""
    ids, mask = prompt_batch(CASES[seq2seq_case], (150, 90))
    expected = zoo.hf_generate(seq2seq_case, ids, mask, max_new_tokens=40, min_new_tokens=40)
    actual = zoo.model(seq2seq_case, backend).generate(ids, attention_mask=mask, max_new_tokens=40, min_new_tokens=40)
    assert_same_tokens(actual, expected)


def test_sequences_come_back_where_the_prompt_was(zoo, backend):
    """As transformers' generate: a prompt on the GPU gets its sequences on the GPU (the same tokens)."""
    ids, mask = prompt_batch(CASES["gpt2"], BATCH)
    model = zoo.model("gpt2", backend)
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=4)
    device = "cuda" if backend == "cuda" else "cpu"
    out = model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=4)
    assert out.device.type == device
    assert_same_tokens(out.cpu(), expected)
