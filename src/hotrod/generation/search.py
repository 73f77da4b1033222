"""The one decoding loop: greedy and sampling, and beam search, for every backend and kind.

Greedy and sampled decoding whose logits live on a GPU keep their tokens there (`hotrod.generation.device_loop`,
the same choices without a wait on the device at every step).

Beam search follows transformers' vectorised algorithm step for step (top 2K candidates, finished
hypotheses merged by length-normalised score, the same early-stopping heuristics), so that its
output is token-identical.
"""

from __future__ import annotations

import numpy as np
import torch

from hotrod.generation import device_loop
from hotrod.generation.config import Settings
from hotrod.generation.sampling import argmax, draw, greedy_only, held_back, index_on, process
from hotrod.generation.state import DecodingState

NEG = -1.0e9


def generate(state: DecodingState, input_ids: torch.Tensor, attention_mask: torch.Tensor, s: Settings,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """The sequences `s` asks for; sampled draws from `generator` where given (a request's own seeded
    stream), else from the default generator of the logits' device."""
    if s.num_beams > 1:
        return beam_search(state, input_ids, attention_mask, s, generator)
    return sample_or_greedy(state, input_ids, attention_mask, s, generator)


def prompt_padding(state: DecodingState, attention_mask: torch.Tensor, expand: int, s: Settings) -> torch.Tensor | None:
    """Leading padding per row, which the repetition penalty ignores when rows start with the prompt (None
    without the penalty, which alone reads it: four torch calls a generate() call saved)."""
    if not state.sequences_include_prompt or s.repetition_penalty == 1.0:
        return None
    return (attention_mask != 0).int().argmax(dim=1).repeat_interleave(expand)


def pick(logits: torch.Tensor, sequences: torch.Tensor, s: Settings, skip: torch.Tensor | None = None,
         generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token of each row, on the CPU: processed scores, then argmax or a draw.

    Logits may live on a GPU: they are reduced there, and only the chosen ids cross to the host (a
    seeded draw runs where its generator lives).
    """
    if greedy_only(s):
        return greedy(logits, s, sequences.shape[1])
    scores = process(logits, sequences, s, skip)
    if s.do_sample:
        return draw(scores, 1, generator).squeeze(1).cpu()
    return argmax(scores).cpu()


def greedy(logits: torch.Tensor, s: Settings, length: int) -> torch.Tensor:
    """Greedy choice after rows of `length` tokens, where the processors hold fixed ids back (EOS under
    `min_length`, one-token bad words, suppressed tokens) or force a step: the raw argmax wherever it is none
    of the held-back ids, which is the choice over the processed scores, and no vocabulary-sized copy of the
    scores at every step (a fresh allocation, page faults and all); at a forced step, or where a row chose a
    held-back id (rare), the choice is made again over the processed scores."""
    tokens = argmax(logits)
    held = held_back(s, length)
    if held is None or (held and not set(held).isdisjoint(tokens.tolist())):
        rows = torch.empty((logits.shape[0], length), dtype=torch.long)  # its length is all `process` reads here
        tokens = argmax(process(logits, rows, s, None))
    return tokens if tokens.device.type == "cpu" else tokens.cpu()


class HostScores:
    """Logits lent to numpy where they are fp32 on the CPU (else None), each logits object asked once: a
    decoding state may return the same buffer at every step, and every torch call costs microseconds there,
    its code cold again after every graph run. Both decoding loops read their greedy choices through it."""

    def __init__(self):
        self._lent: tuple = (None, None)  # the last logits and their numpy view

    def __call__(self, logits: torch.Tensor) -> np.ndarray | None:
        if logits is not self._lent[0]:
            on_host = logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad
            self._lent = (logits, logits.numpy() if on_host else None)
        return self._lent[1]


def greedy_on_host(logits: torch.Tensor, s: Settings, length: int, scores: np.ndarray | None = None) -> np.ndarray:
    """`greedy` over fp32 logits on the CPU, in numpy: the ids as an array, and no torch call but the one lending
    the logits to numpy (`scores`, where the caller has it already: each torch call costs microseconds at
    every step, its code cold again after every graph run has streamed the weights through the caches; the
    decoding state takes the array as it is)."""
    scores = logits.numpy() if scores is None else scores
    ids = scores.argmax(axis=-1)  # the first on a tie, a NaN counting as largest: `argmax`'s rule
    held = held_back(s, length)
    if held is None or (held and not set(held).isdisjoint(ids.tolist())):
        ids = greedy(logits, s, length).numpy()
    return ids


def sample_or_greedy(state: DecodingState, input_ids, attention_mask, s: Settings,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    expand = s.num_return_sequences if s.do_sample else 1
    sequences, logits = state.start(input_ids, attention_mask, expand)
    skip = prompt_padding(state, attention_mask, expand, s)
    if device_loop.applies(logits):  # logits on a GPU: the tokens stay there, read every few steps
        return device_loop.decode(state, sequences, logits, s, skip, generator)
    unfinished = torch.ones(sequences.shape[0], dtype=torch.bool)
    some_finished = False  # a Python bool: asking the tensor at every step costs more than the step's other work
    eos = frozenset(s.eos_token_ids or ())
    out = _Tokens(sequences, s.max_length)
    plain_greedy = greedy_only(s)
    host = HostScores()
    while True:
        scores = host(logits) if plain_greedy else None
        if scores is not None:  # numpy ids, which the state and the sequences take as they are
            tokens = greedy_on_host(logits, s, out.length, scores)
        elif plain_greedy:  # the sequences are not read: no view of them made at every step
            tokens = greedy(logits, s, out.length)
        else:
            tokens = pick(logits, out.view(), s, skip, generator)
        if some_finished:
            tokens = torch.as_tensor(tokens)
            tokens = torch.where(unfinished, tokens, torch.full_like(tokens, s.pad_token_id))
        out.append(tokens)
        chosen = tokens.tolist()
        if not eos.isdisjoint(chosen):
            unfinished &= ~torch.tensor([token in eos for token in chosen])
            some_finished = True
            if not unfinished.any():
                return out.view().clone()
        if out.length >= s.max_length:
            return out.view().clone()
        logits = state.step(tokens)


class _Tokens:
    """The sequences decoded so far, in a buffer that grows by doubling: concatenating a column at every
    step copies every row's tokens each time. On the CPU a column is written through the buffer's numpy
    view: torch's indexed assignment costs several times numpy's, its code cold after every graph run."""

    def __init__(self, sequences: torch.Tensor, limit: int):
        self.length = sequences.shape[1]
        self.limit = max(limit, self.length + 1)
        self._grow(sequences, min(self.limit, max(2 * self.length, 64)))

    def _grow(self, sequences: torch.Tensor, columns: int) -> None:
        self.buffer = sequences.new_empty((sequences.shape[0], columns))
        self.buffer[:, : self.length] = sequences[:, : self.length]
        self.array = self.buffer.numpy() if self.buffer.device.type == "cpu" else None

    def append(self, tokens: torch.Tensor | np.ndarray) -> None:
        if self.length == self.buffer.shape[1]:
            self._grow(self.buffer, min(self.limit, 2 * self.length))
        if self.array is not None and isinstance(tokens, np.ndarray):
            self.array[:, self.length] = tokens
        elif self.array is not None and tokens.device.type == "cpu":
            self.array[:, self.length] = tokens.numpy()
        else:
            self.buffer[:, self.length] = torch.as_tensor(tokens, device=self.buffer.device)
        self.length += 1

    def view(self) -> torch.Tensor:
        return self.buffer[:, : self.length]


def beam_search(state: DecodingState, input_ids, attention_mask, s: Settings,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Beam search where the logits are (a GPU's: no vocabulary-sized copy to the host at every step; the host
    reads only whether to go on and which beams continue)."""
    beams, batch = s.num_beams, input_ids.shape[0]
    flat, logits = state.start(input_ids, attention_mask, beams)
    device = logits.device
    prompt_len = flat.shape[1]
    skip = prompt_padding(state, attention_mask, beams, s)
    skip = None if skip is None else skip.to(device)
    min_keep = max(2, len(s.eos_token_ids) + 1)  # sampled beams must keep a non-EOS continuation
    keep = max(2, 1 + len(s.eos_token_ids)) * beams
    top_beams = torch.arange(keep, device=device) < beams
    fill = (s.pad_token_id or s.eos_token_ids[0]) if s.eos_token_ids else -1
    eos = index_on(tuple(s.eos_token_ids or [-1]), device)
    rows = torch.arange(batch, device=device)[:, None] * beams

    running = torch.full((batch, beams, s.max_length), fill, dtype=torch.long, device=device)
    running[:, :, :prompt_len] = flat.view(batch, beams, prompt_len).to(device)
    finished = running.clone()
    running_scores = torch.zeros(batch, beams, device=device)
    running_scores[:, 1:] = NEG
    finished_scores = torch.full((batch, beams), NEG, device=device)
    is_finished = torch.zeros(batch, beams, dtype=torch.bool, device=device)
    improvable = torch.ones(batch, 1, dtype=torch.bool, device=device)
    cur = prompt_len
    generated = torch.zeros(batch, beams, dtype=torch.long, device=device)  # tokens per finished hypothesis
    running_generated = torch.zeros(batch, beams, dtype=torch.long, device=device)

    while True:
        log_probs = torch.log_softmax(logits, dim=-1)
        log_probs = process(log_probs, running[:, :, :cur].reshape(batch * beams, cur), s, skip, min_keep)
        vocab = log_probs.shape[-1]
        log_probs = (log_probs.view(batch, beams, vocab) + running_scores[:, :, None]).view(batch, beams * vocab)

        if s.do_sample:
            top_idx = draw(log_probs, keep, generator)
            # Drawn candidates are ranked by score, as topk's are: the first `beams` are the ones that may
            # finish a hypothesis (transformers ranks them too since 5.24; before, draw order decided).
            top_scores, order = torch.gather(log_probs, 1, top_idx).sort(dim=-1, descending=True)
            top_idx = top_idx.gather(1, order)
        else:
            top_scores, top_idx = torch.topk(log_probs, k=keep)
        source_beam = top_idx // vocab
        candidates = _gather(running, source_beam)
        candidates[:, :, cur] = top_idx % vocab
        candidate_generated = _gather(running_generated, source_beam) + 1
        hits_stop = (candidates[:, :, cur, None] == eos).any(dim=-1) | (cur + 1 >= s.max_length)

        # Continue with the best `beams` candidates that did not just finish.
        alive_scores = top_scores + hits_stop.float() * NEG
        next_idx = torch.topk(alive_scores, k=beams)[1]
        running = _gather(candidates, next_idx)
        running_scores = _gather(alive_scores, next_idx)
        running_generated = _gather(candidate_generated, next_idx)
        parent = _gather(source_beam, next_idx)

        # Merge the candidates that finished into the kept hypotheses, by length-normalised score.
        just_finished = hits_stop & top_beams[None, :]
        final_scores = top_scores / ((cur + 1 - prompt_len) ** s.length_penalty)
        full = is_finished.all(dim=-1, keepdim=True) & (s.early_stopping is True)
        final_scores = final_scores + full.float() * NEG + (~improvable).float() * NEG + (~just_finished).float() * NEG
        merged_idx = torch.topk(torch.cat([finished_scores, final_scores], dim=1), k=beams)[1]
        finished = _gather(torch.cat([finished, candidates], dim=1), merged_idx)
        finished_scores = _gather(torch.cat([finished_scores, final_scores], dim=1), merged_idx)
        generated = _gather(torch.cat([generated, candidate_generated], dim=1), merged_idx)
        is_finished = _gather(torch.cat([is_finished, just_finished], dim=1), merged_idx)

        cur += 1
        improvable = _still_improvable(improvable, running_scores, finished_scores, is_finished, cur, prompt_len, s)
        done_early = is_finished.all() & (s.early_stopping is True)
        if bool(~improvable.any() | done_early | hits_stop.all()):  # the host's one read of the step
            break
        state.reorder((parent + rows).view(-1))
        logits = state.step(running[:, :, cur - 1].reshape(-1).contiguous())  # a strided column otherwise

    n = s.num_return_sequences
    out = finished[:, :n].reshape(batch * n, s.max_length)
    length = prompt_len + int(generated[:, :n].max())
    return out[:, :length].cpu()


def _still_improvable(improvable, running_scores, finished_scores, is_finished, cur, prompt_len, s: Settings):
    """Can a running beam still beat the worst kept hypothesis? (transformers' heuristic)"""
    if s.early_stopping == "never" and s.length_penalty > 0.0:
        best_length = s.max_length - prompt_len
    else:
        best_length = cur - prompt_len
    best_running = running_scores[:, :1] / (best_length**s.length_penalty)
    worst_kept = torch.where(is_finished, finished_scores.min(dim=1, keepdim=True)[0], NEG)
    return improvable & (best_running > worst_kept).any(dim=-1, keepdim=True)


def _gather(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    while index.dim() < tensor.dim():
        index = index.unsqueeze(-1)
    return torch.take_along_dim(tensor, index, dim=1)
