"""The model side of the server: runs what the scheduler decided, on a HotrodModel.

`GenerationRunner` keeps one decoding state for the whole running batch. Joining requests are
prefilled together (left-padded prompts for decoders, padded encoder inputs for seq2seq) and their
cache appended to the batch's; every step feeds each row its last token; finished rows leave. Token
choice is the decoding loop's own (`hotrod.generation.search.pick`), row by row where requests differ
in settings, so a request gets the tokens it would get alone.
"""

from __future__ import annotations

import torch

from hotrod.generation import config as gen_config
from hotrod.generation.cache import DecodingState
from hotrod.generation.config import Settings
from hotrod.generation.search import pick
from hotrod.model import HotrodModel, torch_threads
from hotrod.serve.protocol import Params
from hotrod.serve.scheduler import Request


class RowOptions:
    """What one request needs at each step: its settings and, when sampling, its own random stream."""

    def __init__(self, settings: Settings, seed: int | None):
        self.settings = settings
        self.generator = None
        if settings.do_sample:
            self.generator = torch.Generator()
            self.generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
        self.plain = not settings.do_sample and settings.repetition_penalty == 1.0 and settings.min_length <= settings.prompt_length


class GenerationRunner:
    def __init__(self, model: HotrodModel):
        self.model = model
        self.state: DecodingState | None = None
        self.rows: list[Request] = []
        defaults = gen_config.merge(model.generation_config, None, {})
        eos = defaults["eos_token_id"]
        self.eos_ids: tuple[int, ...] = tuple([eos] if isinstance(eos, int) else (eos or []))
        self.start_token = None
        if model.kind == "seq2seq":
            self.start_token = model.decoding_state(model.settings(1, {**defaults, "max_new_tokens": 1})).start_token

    def options(self, prompt: list[int], params: Params) -> RowOptions:
        """Resolve a request's settings as `generate()` would; raises HotrodError for a bad combination."""
        values = gen_config.merge(self.model.generation_config, None, params.generate_kwargs())
        return RowOptions(self.model.settings(len(prompt), values), params.seed)

    @torch.inference_mode()
    def admit(self, requests: list[Request]) -> list[int]:
        """Prefill `requests` as one batch and join them to the running batch; returns their first tokens."""
        ids, mask = _padded([r.prompt for r in requests], left=self.model.kind == "decoder")
        state = self.model.decoding_state(requests[0].options.settings)
        with torch_threads(self.model.backend.loop_threads):
            sequences, logits = state.start(ids, mask, 1)
            tokens = self._pick(logits, requests, first=True)
        if self.state is None:
            self.state = state
        else:
            self.state.join(state)
        self.rows += requests
        return tokens

    @torch.inference_mode()
    def step(self) -> list[int]:
        """One decoding step for every running row."""
        last = torch.tensor([r.tokens[-1] for r in self.rows])
        with torch_threads(self.model.backend.loop_threads):
            return self._pick(self.state.step(last), self.rows)

    def leave(self, requests: list[Request]) -> None:
        gone = set(map(id, requests))
        keep = [i for i, r in enumerate(self.rows) if id(r) not in gone]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        if keep:
            self.state.keep(torch.tensor(keep))
        else:
            self.state = None

    def reset(self) -> None:
        self.state, self.rows = None, []

    @torch.inference_mode()
    def run_whole(self, request: Request) -> list[int]:
        """Beam search, run alone through `generate()`; returns the new tokens."""
        out = self.model.generate(torch.tensor([request.prompt]), **request.params.generate_kwargs())
        start = len(request.prompt) if self.model.kind == "decoder" else 1
        return out[0, start:].tolist()

    def _pick(self, logits: torch.Tensor, requests: list[Request], first: bool = False) -> list[int]:
        plain = [i for i, r in enumerate(requests) if r.options.plain]
        tokens = torch.zeros(len(requests), dtype=torch.long)
        if plain:
            tokens[plain] = torch.argmax(logits[plain], dim=-1)
        for i, r in enumerate(requests):
            if not r.options.plain:
                sequence = torch.tensor([self._history(r, first)])
                tokens[i] = pick(logits[i : i + 1], sequence, r.options.settings, None, r.options.generator)[0]
        return tokens.tolist()

    def _history(self, request: Request, first: bool) -> list[int]:
        """The row as the decoding loop would hold it: prompt (or start token) plus what was generated."""
        generated = [] if first else request.tokens
        if self.model.kind == "decoder":
            return request.prompt + generated
        return [self.start_token] + generated


def _padded(rows: list[list[int]], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, span] = torch.tensor(row)
        mask[i, span] = 1
    return ids, mask


class EncoderRunner:
    """One dynamic batch of embedding requests through the model's padding-free forward."""

    def __init__(self, model: HotrodModel):
        self.model = model

    @torch.inference_mode()
    def embed(self, requests: list[Request]) -> list[torch.Tensor]:
        """Embeddings per request; requests with the same (pooling, normalize) share one call."""
        results: dict[int, torch.Tensor] = {}
        for pooling, normalize in {r.options for r in requests}:
            group = [r for r in requests if r.options == (pooling, normalize)]
            rows = [row for r in group for row in r.rows]
            vectors = self.model.embed(rows, pooling=pooling, normalize=normalize, batch_size=max(len(rows), 1))
            start = 0
            for r in group:
                results[r.id] = vectors[start : start + len(r.rows)]
                start += len(r.rows)
        return [results[r.id] for r in requests]
