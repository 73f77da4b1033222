"""A chain's choice at each of its steps, inside the one recorded call that runs them (`Backend.chain`).

Greedy settings whose processors act on fixed ids alone (`Settings.masks_only`) choose the argmax of the
scores as `hotrod.generation.sampling.process` leaves them, in its order: one-token bad words' -inf added
(transformers' bias: a NaN stays a NaN), then the ids held back at that step (min_length's EOS, suppressed
tokens, the tokens suppressed at `begin_index`) filled with -inf. Which groups a step holds back depends
on its row length alone, which the host knows ahead.

What the choice reads lies on the device. The bad words' bias and the groups' masks depend on the
settings alone: made once per device and kept, read by address (their address is part of a recording's
key; a tensor at that address under the same key holds the same values). Which groups each step holds
back is a small [steps, groups] table copied in at each call.
"""

from __future__ import annotations

import functools

import torch

from hotrod.generation.config import Settings
from hotrod.generation.sampling import held_at, held_groups, index_on


class ChainPick:
    """`pick(logits [rows, vocab], step, *bound, *tensors)` -> each row's token at that step, over fp32 scores
    as the host loop's; `bound` are read where they lie, `tensors` copied in at each call; `key` names what
    else the choice depends on."""

    def __init__(self, s: Settings, length: int, steps: int, vocab: int, device: torch.device):
        self.banned = tuple(sorted({word[0] for word in s.bad_words_ids}))
        groups = held_groups(s)
        self.kept = tuple(i for i, group in enumerate(groups) if group)
        self.bound: list[torch.Tensor] = [bias_on(self.banned, vocab, device)] if self.banned else []
        self.tensors: list[torch.Tensor] = []
        if self.kept:
            steps_held = [held_at(s, length + j) for j in range(steps)]
            if any(held is None for held in steps_held):
                raise ValueError("a chain may not hold a forced step")
            self.bound.append(masks_on(tuple(groups[i] for i in self.kept), vocab, device))
            self.tensors.append(torch.tensor([[held[i] for i in self.kept] for held in steps_held], dtype=torch.bool))
        self.key = (self.banned, tuple(groups[i] for i in self.kept))

    def __call__(self, logits: torch.Tensor, step: int, *args: torch.Tensor) -> torch.Tensor:
        scores = logits.float()
        if self.banned:
            scores, args = scores + args[0], args[1:]
        if self.kept:
            masks, held = args
            scores = scores.masked_fill((held[step][:, None] & masks).any(dim=0), -float("inf"))
        return scores.argmax(dim=-1)


@functools.lru_cache(maxsize=64)
def bias_on(banned: tuple[int, ...], vocab: int, device: torch.device) -> torch.Tensor:
    """-inf at the `banned` ids, 0 elsewhere [vocab], made once per device."""
    return torch.zeros(vocab, device=device).index_fill_(0, index_on(banned, device), -float("inf"))


@functools.lru_cache(maxsize=64)
def masks_on(groups: tuple[tuple[int, ...], ...], vocab: int, device: torch.device) -> torch.Tensor:
    """Each group's ids as a mask [groups, vocab], made once per device."""
    masks = torch.zeros((len(groups), vocab), dtype=torch.bool)
    for i, group in enumerate(groups):
        masks[i, list(group)] = True
    return masks.to(device)
