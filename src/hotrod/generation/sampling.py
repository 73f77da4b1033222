"""Score processing, as small pure functions with transformers' semantics and order.

Order (as transformers' `_get_logits_processor`): repetition penalty, no-repeat n-grams, bad words,
minimum length, forced first token, forced last token, suppressed tokens, suppressed first tokens; then,
when sampling, temperature, top-k, top-p. Each takes scores [rows, vocab] (beam search: log-softmaxed)
and the rows so far [rows, length] (an encoder-decoder's from its start token; a decoder-only model's
with its prompt and padding, as transformers' `input_ids`) and returns new scores.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from hotrod.generation.config import Settings


def repetition_penalty(scores: torch.Tensor, sequences: torch.Tensor, penalty: float, skip: torch.Tensor | None):
    """Penalise every token already in a row (CTRL-style); `skip[r]` leading positions (padding) don't count."""
    ids = sequences.to(scores.device)
    if skip is not None:
        skip = skip.to(scores.device)
        positions = torch.arange(ids.shape[1], device=ids.device)[None, :]
        ids = ids.masked_fill(positions < skip[:, None], scores.shape[-1])
    seen = torch.zeros(scores.shape[0], scores.shape[1] + 1, dtype=torch.bool, device=scores.device)
    seen.scatter_(1, ids, True)
    penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(seen[:, :-1], penalised, scores)


def no_repeat_ngram(scores: torch.Tensor, sequences: torch.Tensor, size: int) -> torch.Tensor:
    """Ban every token that would complete an n-gram of `size` tokens the row already holds: the windows of
    the row whose first size-1 tokens are its last size-1 ban their last token (transformers' algorithm)."""
    ids = sequences.to(scores.device)
    length = ids.shape[-1]
    if length < size:
        return scores
    prefix = ids[:, length + 1 - size:]
    windows = ids.unfold(1, size, 1)
    matches = (windows[..., :-1] == prefix.unsqueeze(1)).all(dim=-1)
    vocab = scores.shape[-1]  # windows that do not match ban the spare column past the vocabulary
    banned = torch.zeros(scores.shape[0], vocab + 1, dtype=torch.bool, device=scores.device)
    banned.scatter_(1, torch.where(matches, windows[..., -1].clamp(max=vocab), vocab), True)
    return scores.masked_fill(banned[:, :vocab], -float("inf"))


def ban_sequences(scores: torch.Tensor, sequences: torch.Tensor, banned: tuple[tuple[int, ...], ...]) -> torch.Tensor:
    """bad_words_ids: a one-token word is never chosen, a longer one's last token not after the rest of it.
    As transformers, a bias of -inf added (not a fill), so the scores are its scores to the bit."""
    single, groups = _banned_on(banned, scores.device)
    bias = torch.zeros_like(scores)
    if single is not None:
        bias.index_fill_(1, single, -float("inf"))
    ids = sequences.to(scores.device)
    for prefixes, last in groups:  # words of one prefix length, matched against the row's end at once
        if prefixes.shape[1] > ids.shape[1]:
            continue
        matching = (ids[:, None, -prefixes.shape[1]:] == prefixes).all(dim=-1)
        bias.index_add_(1, last, torch.where(matching, -float("inf"), 0.0).to(bias.dtype))
    return scores + bias


@functools.lru_cache(maxsize=16)
def _banned_on(banned: tuple[tuple[int, ...], ...], device: torch.device) -> tuple[torch.Tensor | None, list]:
    """The one-token words' index, and the longer words as (prefixes, last tokens) per prefix length: made once
    per device, not at every step."""
    singles = tuple(sorted({word[0] for word in banned if len(word) == 1}))
    by_length: dict[int, list[tuple[int, ...]]] = {}
    for word in banned:
        if len(word) > 1:
            by_length.setdefault(len(word) - 1, []).append(word)
    groups = [(torch.tensor([w[:-1] for w in words], device=device), torch.tensor([w[-1] for w in words], device=device))
              for words in by_length.values()]
    return (index_on(singles, device) if singles else None), groups


def force(scores: torch.Tensor, token_ids: tuple[int, ...]) -> torch.Tensor:
    """Only `token_ids` possible, each at score 0 (forced_bos_token_id, forced_eos_token_id)."""
    return torch.full_like(scores, -float("inf")).index_fill(1, index_on(tuple(token_ids), scores.device), 0.0)


def argmax(scores: torch.Tensor) -> torch.Tensor:
    """Each row's index of its largest score, the first on a tie, a NaN counting as largest (torch's rule).

    On the CPU numpy's reduction does it: torch's CPU argmax over a vocabulary is not vectorised (numpy's
    is, and many times faster over a vocabulary of tens of thousands), and it runs once per generated
    token. Elsewhere, and for types numpy lacks, torch's own.
    """
    ids = _numpy_argmax(scores)
    return torch.argmax(scores, dim=-1) if ids is None else torch.from_numpy(np.asarray(ids))  # 0-d for one row


def argmax_ids(scores: torch.Tensor) -> list[int]:
    """`argmax` as a list of Python ints (one per row, or one for a 1-D row): on the CPU straight from
    numpy, with no torch tensor made and indexed for a caller that wants the ids themselves."""
    ids = _numpy_argmax(scores)
    ids = torch.argmax(scores, dim=-1).tolist() if ids is None else ids.tolist()
    return ids if isinstance(ids, list) else [ids]


def _numpy_argmax(scores: torch.Tensor) -> np.ndarray | np.integer | None:
    """numpy's argmax over the last axis where numpy can read the scores in place (see `argmax`), else None."""
    if scores.device.type != "cpu" or scores.dtype not in (torch.float32, torch.float64):
        return None
    return scores.numpy(force=scores.requires_grad).argmax(axis=-1)


def suppress(scores: torch.Tensor, token_ids: tuple[int, ...]) -> torch.Tensor:
    """`token_ids` made impossible in every row. Their index tensor is made once per device: indexing a GPU
    tensor with a Python list copies the list from pageable host memory, which waits for the GPU's queue to
    drain (on an H200, one of a GPT-2 step's three waits when `min_new_tokens` holds EOS back)."""
    return scores.index_fill(1, index_on(tuple(token_ids), scores.device), -float("inf"))


@functools.lru_cache(maxsize=64)
def index_on(token_ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """`token_ids` as a tensor on `device`, made once per device (see `suppress`)."""
    return torch.tensor(token_ids, dtype=torch.long, device=device)


def draw(scores: torch.Tensor, samples: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """`samples` ids a row drawn from softmax(scores) (without replacement, in draw order), on the scores'
    device: from `generator` where given (its own stream: a server's seeded request; the draw made where it
    lives), else from the default generator of the scores' device, as transformers draws."""
    where = scores.device
    if generator is not None and generator.device != where:
        scores = scores.to(generator.device)
    return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=samples, generator=generator).to(where)


def top_k(scores: torch.Tensor, k: int, min_keep: int = 1) -> torch.Tensor:
    k = min(max(k, min_keep), scores.shape[-1])
    threshold = torch.topk(scores, k)[0][..., -1, None]
    return scores.masked_fill(scores < threshold, -float("inf"))


def top_p(scores: torch.Tensor, p: float, min_keep: int = 1) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability mass reaches `p`."""
    sorted_scores, order = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= (1 - p)
    drop_sorted[..., -min_keep:] = False
    drop = drop_sorted.scatter(1, order, drop_sorted)
    return scores.masked_fill(drop, -float("inf"))


def plain_argmax(s: Settings, length: int) -> bool:
    """Whether the token after a row of `length` tokens is the raw logits' argmax: greedy, and nothing in
    `process` changes the scores there. Kept beside `process`, whose conditions it mirrors."""
    return (not s.do_sample and s.repetition_penalty == 1.0 and not s.constrained
            and (not s.eos_token_ids or length >= s.min_length))


def greedy_only(s: Settings) -> bool:
    """Whether the next token is the argmax with, at most, fixed ids held back or a step forced
    (`hotrod.generation.search.greedy`): no processor reads the row's tokens (`Settings.masks_only`)."""
    return not s.do_sample and s.repetition_penalty == 1.0 and s.masks_only


def held_back(s: Settings, length: int) -> tuple[int, ...] | None:
    """The ids `process` makes impossible after a row of `length` tokens, for settings whose processors act on
    fixed ids only (`Settings.masks_only`), or None at a step it forces (the forced BOS, the forced EOS).
    Kept beside `process`, whose conditions it mirrors."""
    if not s.constrained:  # only min_length's EOS (the common case, asked at every step)
        return s.eos_token_ids if length < s.min_length else ()
    groups = held_at(s, length)
    if groups is None:
        return None
    held = [word[0] for word in s.bad_words_ids]
    for group, holds in zip(held_groups(s), groups):
        if holds:
            held += group
    return tuple(held)


def held_groups(s: Settings) -> tuple[tuple[int, ...], ...]:
    """The groups of fixed ids `process` fills with -inf at some steps, each whole or not at all (one-token bad
    words aside, whose -inf it adds at every step): min_length's EOS, the suppressed tokens, the tokens
    suppressed at `begin_index` (a group may be empty). Kept beside `process`, whose terms they are."""
    return tuple(s.eos_token_ids or ()), tuple(s.suppress_tokens), tuple(s.begin_suppress_tokens)


def held_at(s: Settings, length: int) -> tuple[bool, ...] | None:
    """Which of `held_groups` `process` fills after a row of `length` tokens, or None at a step it forces (the
    forced BOS, the forced EOS). Kept beside `process`, whose conditions it mirrors."""
    if (s.forced_bos_token_id is not None and length == 1) or (s.forced_eos_token_ids and length == s.max_length - 1):
        return None
    return (bool(s.eos_token_ids) and length < s.min_length, bool(s.suppress_tokens),
            bool(s.begin_suppress_tokens) and length == s.begin_index)


def process(
    scores: torch.Tensor, sequences: torch.Tensor, s: Settings, skip: torch.Tensor | None, min_keep: int = 1
) -> torch.Tensor:
    """Apply every processor the settings ask for, in transformers' order (`plain_argmax` says when none
    changes a greedy choice)."""
    length = sequences.shape[1]
    if s.repetition_penalty != 1.0:
        scores = repetition_penalty(scores, sequences, s.repetition_penalty, skip)
    if s.no_repeat_ngram_size:
        scores = no_repeat_ngram(scores, sequences, s.no_repeat_ngram_size)
    if s.bad_words_ids:
        scores = ban_sequences(scores, sequences, s.bad_words_ids)
    if s.eos_token_ids and length < s.min_length:
        scores = suppress(scores, s.eos_token_ids)
    if s.forced_bos_token_id is not None and length == 1:
        scores = force(scores, (s.forced_bos_token_id,))
    if s.forced_eos_token_ids and length == s.max_length - 1:
        scores = force(scores, s.forced_eos_token_ids)
    if s.suppress_tokens:
        scores = suppress(scores, s.suppress_tokens)
    if s.begin_suppress_tokens and length == s.begin_index:
        scores = suppress(scores, s.begin_suppress_tokens)
    if s.do_sample:
        if s.temperature != 1.0:
            scores = scores / s.temperature
        if s.top_k:
            scores = top_k(scores, s.top_k, min_keep)
        if s.top_p < 1.0:
            scores = top_p(scores, s.top_p, min_keep)
    return scores
