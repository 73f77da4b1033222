"""What the HTTP layer and a served model's worker exchange: plain dataclasses and one Protocol.

The app validates a request, turns it into token ids and `Params`, and submits it to the model's
`Worker`; the worker queues it, batches it with others (dynamic batching for encoders, continuous
batching for generation) and reports back through a `Ticket`. Neither side knows how the other works:
the app is tested with a fake worker, the scheduler with a fake model runner.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from hotrod.pipelines.base import Row


@dataclass(frozen=True)
class Params:
    """Generation parameters of one request, already checked by the app."""

    max_new_tokens: int = 32
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    num_beams: int = 1
    seed: int | None = None
    logprobs: int | None = None  # with each token, its log-probability and this many most likely alternatives
    prompt_lookup: int | None = None  # tokens drafted a step by prompt lookup (0: none); None: the server's default
    # Per request, over the model's generation config (None: the model's own): the target language of an
    # mBART-50 / M2M100 / NLLB translation, and a summary's no-repeat n-gram size (0: off).
    forced_bos_token_id: int | None = None
    no_repeat_ngram_size: int | None = None

    def generate_kwargs(self) -> dict[str, Any]:
        """The same request as keyword arguments of `HotrodModel.generate`."""
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "num_beams": self.num_beams,
                                  "repetition_penalty": self.repetition_penalty, "do_sample": self.do_sample}
        if self.do_sample:
            kwargs.update(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
        for name in ("forced_bos_token_id", "no_repeat_ngram_size"):  # None here leaves the model's setting on
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        return kwargs


class QueueFull(Exception):
    """The model's queue is at its bound: the client should retry after `retry_after` seconds (429)."""

    def __init__(self, retry_after: float = 1.0):
        super().__init__("the server is at capacity; retry later")
        self.retry_after = retry_after


class ShuttingDown(Exception):
    """The server has stopped accepting requests (503)."""

    def __init__(self):
        super().__init__("the server is shutting down")


class BatchFailed(Exception):
    """Running this request failed (500); its message is for the log, never for the client."""


class WorkerDown(Exception):
    """The model's worker has died: nothing it holds or is sent will run (503, and the server exits)."""

    def __init__(self, reason: str = "the model's worker has stopped"):
        super().__init__(f"model unavailable: {reason}")


@dataclass(frozen=True)
class TokenLogprobs:
    """A chosen token's log-probability under the model (before any sampling transform), and the top ones."""

    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Event:
    """One step of a ticket: new tokens, or the end (`finish_reason` set, or `error` set)."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None  # one per token, when the request asked for them
    finish_reason: str | None = None  # "length" | "stop" | "cancelled" | "timeout"
    error: BaseException | None = None
    result: Any = None  # on an encoder's final event: embeddings [rows, hidden] (a torch tensor), or each row's
    # outputs by name (a list of dicts of tensors) for a submission of rows


class Ticket:
    """A submitted request: events arrive from the worker's thread, the app reads them with `events()`.

    `cancel()` (a disconnected client, a timeout) tells the worker to free the request's slot at its next
    step; the ticket then ends with finish_reason "cancelled".
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self.loop = loop or asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = False
        self.done = False
        self.submitted = 0.0  # time.perf_counter() when queued
        self.started: float | None = None  # when it first ran

    def push(self, event: Event) -> None:
        """Called from the worker's thread."""
        if event.finish_reason is not None or event.error is not None:
            self.done = True
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop has closed: nobody is left to read this ticket
            pass

    def cancel(self) -> None:
        self.cancelled = True

    async def events(self) -> AsyncIterator[Event]:
        while True:
            event = await self.queue.get()
            yield event
            if event.finish_reason is not None or event.error is not None:
                return


@dataclass(frozen=True)
class ModelInfo:
    """What the app needs to validate requests for one served model."""

    name: str
    kind: str  # "decoder" | "seq2seq" | "encoder"
    vocab_size: int
    max_positions: int | None  # longest sequence the model accepts (prompt + new tokens for decoders)
    created: int  # unix time the model was loaded
    path: str
    task: str | None = None  # an encoder's head (`hotrod.tasks`): which /v1 task routes it answers
    labels: tuple[str, ...] = ()  # a labelled head's label of each output index
    verifies_drafts: bool = False  # checks several drafted tokens a row in one pass: speculative decoding runs
    width: int = 0  # an encoder's embedding size (0: not known before its first answer)
    sentence: Any = None  # an encoder's sentence-transformers pipeline (`hotrod.pipelines.sentence`): its
    #                       prompts and normalization; None: a plain checkpoint
    precision: str = "fp32"  # the artifact's precision (`hotrod.precisions`), which TEI's /info reports
    max_batch_size: int = 0  # the most rows (sequences) one batch runs; 0: not known
    max_queue: int = 0  # the most requests waiting before a 429; 0: not known


class Worker(Protocol):
    """One served model: a tokenizer, a queue, a scheduler and a runner on a thread of its own."""

    info: ModelInfo

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (with the model's special tokens, as the model expects)."""

    def decode(self, ids: list[int]) -> str:
        """Text of generated ids, special tokens dropped."""

    def forced_bos(self, target_language: str, forced_bos_token_id: int | None) -> int:
        """The token a request's target language forces first (`hotrod.pipelines.languages.forced_bos`); a
        HotrodError naming the code the tokenizer lacks, or the field. Runs on the tokenizer thread."""

    def submit_generate(self, prompt: list[int], params: Params) -> Ticket:
        """Queue a generation; raises QueueFull or ShuttingDown. Must be called on the event loop."""

    def embedding_tokens(self, texts: list[str], prompt: str | None, truncate: bool, side: str) -> Any:
        """Texts tokenized as the model's embedding pipeline tokenizes them (`hotrod.pipelines.sentence_tokens`:
        the prompt before each, cut at its max_seq_length when `truncate`, on `side`), with the prompt's
        length; a HotrodError for an input the pipeline refuses. Runs on the tokenizer thread."""

    def submit_embed(self, rows: list[list[int]], pooling: str | None, normalize: bool | None,
                     prompt_length: int = 0) -> Ticket:
        """Queue embeddings of `rows` (its final event carries a [rows, width] tensor). None: the model's own
        pooling and normalization; `prompt_length`: the tokens of a prompt that pooling may leave out."""

    def submit_hidden(self, rows: list[list[int]]) -> Ticket:
        """Queue the last hidden state of `rows` (its final event carries one [tokens, hidden] tensor a row)."""

    def submit_rows(self, rows: list[Row]) -> Ticket:
        """Queue an encoder head's rows (`hotrod.pipelines`), batched with other requests' rows; the final
        event carries each row's outputs by name, in order."""

    def pipeline_model(self) -> Any:
        """What `hotrod.pipelines`' prepare and finish take (the HotrodModel): its tokenizer, config and
        labels. The HTTP layer tokenizes and assembles answers with it, on the model's tokenizer thread;
        it never runs the model."""

    def queue_depth(self) -> int:
        """Requests waiting to run."""

    def start(self) -> None:
        """Load, warm up and begin serving; `ready()` is true after it returns."""

    def ready(self) -> bool: ...

    def failure(self) -> str | None:
        """Why the model's worker died, or None while it lives (or has not started)."""

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting; with `drain`, finish what is queued and running first. Blocks until done, or for
        `timeout` seconds at most, after which whatever is left is failed with ShuttingDown."""
