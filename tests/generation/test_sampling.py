"""The score processors against transformers' own, on random scores."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hotrod.generation import config as gen_config
from hotrod.generation import sampling

ROWS, VOCAB = 6, 50


def random_scores(seed: int = 0, ties: bool = False) -> torch.Tensor:
    scores = torch.randn(ROWS, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3
    if ties:  # several equal values, some at the boundary of what is kept
        scores = scores.round()
    return scores


def random_sequences(length: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (ROWS, length), generator=torch.Generator().manual_seed(seed))


def assert_same_scores(ours: torch.Tensor, theirs: torch.Tensor):
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs)), "different tokens were filtered"
    torch.testing.assert_close(ours, theirs, atol=0, rtol=0)


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("min_keep", [1, 3])
@pytest.mark.parametrize("k", [1, 2, 10, 49, 50, 200])
def test_top_k_matches_transformers(k, min_keep, ties):
    scores = random_scores(ties=ties)
    theirs = TopKLogitsWarper(top_k=k, min_tokens_to_keep=min_keep)(None, scores.clone())
    assert_same_scores(sampling.top_k(scores, k, min_keep), theirs)


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("min_keep", [1, 3])
@pytest.mark.parametrize("p", [0.01, 0.3, 0.75, 0.95, 1.0])
def test_top_p_matches_transformers(p, min_keep, ties):
    scores = random_scores(ties=ties)
    theirs = TopPLogitsWarper(top_p=p, min_tokens_to_keep=min_keep)(None, scores.clone())
    assert_same_scores(sampling.top_p(scores, p, min_keep), theirs)


def test_top_p_after_top_k_matches_transformers():
    """Already filtered (-inf) scores, as in the sampling chain."""
    scores = sampling.top_k(random_scores(), 8)
    theirs = TopPLogitsWarper(top_p=0.6)(None, scores.clone())
    assert_same_scores(sampling.top_p(scores, 0.6), theirs)


@pytest.mark.parametrize("penalty", [0.6, 1.0, 1.3, 2.0])
def test_repetition_penalty_matches_transformers(penalty):
    scores, sequences = random_scores(), random_sequences()
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(sequences, scores.clone())
    assert_same_scores(sampling.repetition_penalty(scores, sequences, penalty, None), theirs)


def test_repetition_penalty_skips_leading_padding_like_transformers():
    scores, sequences = random_scores(), random_sequences()
    skip = torch.tensor([0, 1, 3, 0, 8, 9])
    theirs = RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=skip)(sequences, scores.clone())
    ours = sampling.repetition_penalty(scores, sequences, 1.5, skip)
    assert_same_scores(ours, theirs)
    assert not torch.equal(ours, sampling.repetition_penalty(scores, sequences, 1.5, None)), "skip had no effect"


def test_processors_do_not_modify_their_input():
    scores, sequences = random_scores(), random_sequences()
    original = scores.clone()
    sampling.top_k(scores, 5)
    sampling.top_p(scores, 0.5)
    sampling.repetition_penalty(scores, sequences, 1.3, None)
    sampling.suppress(scores, (1, 2))
    assert torch.equal(scores, original)


def settings(**kwargs) -> gen_config.Settings:
    return gen_config.resolve(gen_config.merge(None, None, kwargs), prompt_length=5, max_positions=None)


@pytest.mark.parametrize("length", [7, 12], ids=["below_min_length", "past_min_length"])
def test_process_chain_matches_transformers_order(length):
    """Repetition penalty, minimum length, temperature, top-k, top-p: transformers' order and semantics."""
    s = settings(do_sample=True, repetition_penalty=1.2, min_length=10, eos_token_id=[3, 4], temperature=0.7,
                 top_k=12, top_p=0.8, max_new_tokens=20)
    scores, sequences = random_scores(), random_sequences(length)
    chain = LogitsProcessorList([
        RepetitionPenaltyLogitsProcessor(1.2),
        MinLengthLogitsProcessor(10, [3, 4]),
        TemperatureLogitsWarper(0.7),
        TopKLogitsWarper(12),
        TopPLogitsWarper(0.8),
    ])
    assert_same_scores(sampling.process(scores, sequences, s, None), chain(sequences, scores.clone()))


def test_process_without_sampling_leaves_scores_alone():
    scores = random_scores()
    s = settings(temperature=0.5, top_k=3, top_p=0.5, max_new_tokens=3)
    assert torch.equal(sampling.process(scores, random_sequences(), s, None), scores)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("scores_kind", ["random", "ties", "nan", "inf", "strided"])
def test_argmax_is_torchs(scores_kind, dtype):
    """The vocabulary argmax picks what torch.argmax picks: first of a tie, NaN as largest, -inf rows."""
    scores = random_scores(3, ties=scores_kind == "ties").to(dtype)
    if scores_kind == "nan":
        scores[1, 7] = scores[4, 0] = scores[4, 9] = float("nan")
    if scores_kind == "inf":
        scores[2] = -float("inf")
        scores[3, 5] = scores[3, 11] = float("inf")
    if scores_kind == "strided":
        scores = scores.t().contiguous().t()[::2]
    ours = sampling.argmax(scores)
    assert ours.dtype == torch.long and torch.equal(ours, torch.argmax(scores, dim=-1))
    assert torch.equal(sampling.argmax(scores[0]), torch.argmax(scores[0], dim=-1))  # one row, 1-D
    assert sampling.argmax_ids(scores) == torch.argmax(scores, dim=-1).tolist()  # the ids as Python ints
    assert sampling.argmax_ids(scores[0]) == [torch.argmax(scores[0]).item()]


@pytest.mark.parametrize("where", ["eos_first", "eos_ties_another", "nan_at_eos", "eos_elsewhere"])
@pytest.mark.parametrize("length", [7, 12], ids=["below_min_length", "past_min_length"])
def test_greedy_pick_is_the_argmax_of_the_processed_scores(where, length):
    """The greedy choice that skips processing equals the argmax over the processed scores, EOS held back
    below the minimum length whatever the raw scores hold there."""
    from hotrod.generation.search import greedy_on_host, pick

    s = settings(min_length=10, eos_token_id=[3, 4], max_new_tokens=20)
    scores = random_scores(5, ties=where == "eos_ties_another")
    if where == "eos_first":
        scores[0, 3] = scores[2, 4] = 100.0
    if where == "eos_ties_another":
        scores[1, 3] = scores[1, 20] = 100.0
    if where == "nan_at_eos":
        scores[3, 4] = float("nan")
    sequences = random_sequences(length)
    expected = torch.argmax(sampling.process(scores, sequences, s, None), dim=-1)
    assert torch.equal(pick(scores, sequences, s), expected)
    assert greedy_on_host(scores, s, length).tolist() == expected.tolist()  # the decoding loop's numpy path
