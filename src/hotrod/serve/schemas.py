"""Request and response bodies of the HTTP API.

The request models are the one statement of what the server accepts: FastAPI derives the OpenAPI schema
from them, and `extra="forbid"` plus strict types keep the two honest (a field the schema does not list, or
"5" where an integer belongs, is refused rather than silently dropped or coerced). Checks that depend on the
served model (vocabulary, positions, kind) cannot live in a schema; the app makes them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, model_validator

from hotrod.generation.drafts import MAX_DRAFT_TOKENS

MAX_CHOICES = 16
MAX_LOGPROBS = 5  # as OpenAI's legacy completions
MAX_STOPS = 4
_MODEL = Field(None, description="A served model's name; optional when the server serves exactly one.")
_SEED = Field(None, ge=-2**63, le=2**63 - 1, description="Seed of the sampler, for repeatable samples (OpenAI's "
                                                         "range, a signed 64-bit number).")


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    null_is_default: ClassVar[tuple[str, ...]] = ()  # fields whose null means "left out", as the API they copy has

    @model_validator(mode="before")
    @classmethod
    def _nulls_left_out(cls, data: Any) -> Any:
        if isinstance(data, dict) and cls.null_is_default:
            return {k: v for k, v in data.items() if not (v is None and k in cls.null_is_default)}
        return data


class Speculate(_Request):
    """Speculative decoding: drafts the model verifies in one pass, several tokens a step where they hold.
    Greedy requests get the same tokens as without it."""

    prompt_lookup: int = Field(ge=0, le=MAX_DRAFT_TOKENS,
                               description="Tokens drafted a step from the request's own text (prompt lookup); "
                                           "0: none, whatever the server's default.")


_SPECULATE = Field(None, description="Speculative decoding for this request (default: the server's --speculate).")
# Per request, over the model's generation config (`hotrod.serve.checks.forced_bos` checks the last two).
MAX_NGRAM = 32  # bart-large-cnn's is 3; past a few tokens a repeat is rare anyway
_FORCED_BOS = Field(None, description="The token generated first (transformers' forced_bos_token_id: a multilingual "
                                      "model's target language); within the vocabulary. Default: the model's own.")
_TARGET_LANGUAGE = Field(None, min_length=1, max_length=32,
                         description="The language to translate into, a code of the model's tokenizer (mBART-50: "
                                     "fr_XX, M2M100: fr, NLLB: fra_Latn), which sets forced_bos_token_id.")
_NO_REPEAT = Field(None, ge=0, le=MAX_NGRAM, description="No n-gram of this many tokens is generated twice (0: "
                                                        "off). Default: the model's own.")


class Sampling(_Request):
    """How to generate: the fields of /v1/generate's body, and the parameters of a v2 infer request."""

    max_new_tokens: int | None = Field(None, ge=1, description="Default: 32, or the server's limit if lower.")
    do_sample: bool = False
    temperature: float = Field(1.0, ge=0, description="0 means greedy even when do_sample is true.")
    top_k: int = Field(0, ge=0, description="0: no top-k filter.")
    top_p: float = Field(1.0, gt=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)
    num_beams: int = Field(1, ge=1, le=8)
    seed: int | None = _SEED
    speculate: Speculate | None = _SPECULATE
    no_repeat_ngram_size: int | None = _NO_REPEAT
    forced_bos_token_id: int | None = _FORCED_BOS
    target_language: str | None = _TARGET_LANGUAGE


class GenerateRequest(Sampling):
    """Continue `text` (or `token_ids`, exactly one of the two) with a decoder or seq2seq model."""

    model: str | None = _MODEL
    text: str | None = Field(None, description="The prompt; tokenized by the model's tokenizer.")
    token_ids: list[int] | None = Field(None, description="The prompt as token ids, instead of text.")
    stream: bool = Field(False, description="Answer with server-sent events, one per step, then [DONE].")


_PROMPT_NAME = Field(None, max_length=256, description="One of the checkpoint's named prompts (its "
                                                     "config_sentence_transformers.json), put before each text; "
                                                     "default: its default prompt, if it names one.")
_EMBED_TRUNCATE = Field(False, description="Cut texts longer than the model embeds (its max_seq_length) where "
                                           "sentence-transformers cuts them; without it such a text is a 400.")


class Pooling(_Request):
    """How to embed: the fields of /v1/embed's body, and the parameters of a v2 infer request. Left out, the
    checkpoint's own pipeline applies (a sentence-transformers checkpoint's pooling, Dense and Normalize;
    otherwise mean pooling, unit length)."""

    pooling: Literal["mean", "cls"] | None = Field(None, description="Replaces the checkpoint's pooling.")
    normalize: bool | None = Field(None, description="true: unit length; false: without the checkpoint's "
                                                     "Normalize.")
    prompt_name: str | None = _PROMPT_NAME
    prompt: str | None = Field(None, max_length=4096, description="A prompt of your own, put before each text.")
    truncate: bool = _EMBED_TRUNCATE


class EmbedRequest(Pooling):
    """Embed `texts` (or `token_ids`, exactly one of the two) with an encoder model."""

    model: str | None = _MODEL
    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None


class StreamOptions(_Request):
    include_usage: bool = Field(False, description="End the stream with a chunk holding only the usage.")
    include_obfuscation: bool = Field(False, description="Each chunk carries `obfuscation`, random characters of "
                                                         "random length, so that chunk sizes do not tell the text.")


class CompletionRequest(_Request):
    """OpenAI's legacy completions request, for a prompt or a list of them (forced_bos_token_id, target_language and
    no_repeat_ngram_size are hotrod's own: the client's `extra_body`). OpenAI's fields hotrod does not run are
    taken at the values that change nothing (which clients such as LangChain's send on every call), and any
    other value is refused by name (`completions.check_neutral`)."""

    null_is_default = ("max_tokens", "n", "stream", "echo")
    model: str | None = _MODEL
    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        description="A text or token ids; or a list of either, whose prompt i has choices i * n .. i * n + n - 1.")
    max_tokens: int = Field(16, ge=1)
    temperature: float | None = Field(None, ge=0, le=2, description="0 or absent: greedy; above 0: sampling.")
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="Choices to generate; with a seed, choice i uses seed + i.")
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="Only with stream: true.")
    stop: str | list[str] | None = Field(None, description="Up to 4 strings; the text ends before the first one.")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS,
                                 description="Log-probability of each token, and of this many most likely ones.")
    echo: bool = Field(False, description="Put the prompt before the completion's text.")
    seed: int | None = _SEED
    speculate: Speculate | None = _SPECULATE
    no_repeat_ngram_size: int | None = _NO_REPEAT
    forced_bos_token_id: int | None = _FORCED_BOS
    target_language: str | None = _TARGET_LANGUAGE
    user: str | None = None
    best_of: int | None = Field(None, description="Only n (each choice is its own sample).")
    presence_penalty: float | None = Field(None, description="Only 0.")
    frequency_penalty: float | None = Field(None, description="Only 0.")
    logit_bias: dict[str, float] | None = Field(None, description="Only empty.")
    suffix: str | None = Field(None, description="Only empty.")


class EmbeddingsRequest(_Request):
    """OpenAI's embeddings request: the model's own vectors (unit length for a checkpoint without a
    sentence-transformers pipeline). The official `openai` client asks for `base64` unless told otherwise:
    each vector's little-endian float32 bytes, base64-encoded. `prompt_name` and `truncate` are hotrod's own
    (the client's `extra_body`)."""

    null_is_default = ("encoding_format", "dimensions", "user")
    model: str | None = _MODEL
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="The first N numbers of each vector, made unit length "
                                                         "again (as OpenAI's Matryoshka models); at most the "
                                                         "model's width.")
    user: str | None = Field(None, max_length=256, description="The caller's end-user id, as OpenAI's API takes "
                                                               "it: written to the server's log with the request.")
    prompt_name: str | None = _PROMPT_NAME
    truncate: bool = _EMBED_TRUNCATE


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int


class GenerateResponse(BaseModel):
    model: str
    text: str
    token_ids: list[int] = Field(description="The generated tokens only, not the prompt.")
    finish_reason: str
    usage: Usage


class EmbedResponse(BaseModel):
    model: str
    embeddings: list[list[float]]
    usage: Usage


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    text: str
    index: int = 0
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="The vector, or with encoding_format base64 its "
                                                     "little-endian float32 bytes in base64")


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "hotrod"
    kind: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None


class ErrorBody(BaseModel):
    """Every error the server answers, whatever the status."""

    error: ErrorDetail


class TeiErrorBody(BaseModel):
    """Every error of text-embeddings-inference's routes, as TEI answers it."""

    error: str
    error_type: Literal["validation", "tokenizer", "backend", "overloaded", "unhealthy"]


# -- text-embeddings-inference's embedding routes (`tei_embed.py`), field for field ------------------------

_TEI_INPUTS = Field(description="A text, a list of texts, or token ids (one row or a list of rows).")
_DIRECTION = Field("right", description="Which end of a text `truncate` cuts: right keeps its start.")


class TeiEmbedAllRequest(_Request):
    """TEI's /embed_all: every token's vector of the last hidden state."""

    null_is_default: ClassVar[tuple[str, ...]] = ("truncate",)  # TEI's Option<bool>
    inputs: str | list[str] | list[int] | list[list[int]] = _TEI_INPUTS
    truncate: bool = _EMBED_TRUNCATE
    truncation_direction: Literal["right", "left", "Right", "Left"] = _DIRECTION
    prompt_name: str | None = _PROMPT_NAME


class TeiEmbedRequest(TeiEmbedAllRequest):
    """TEI's /embed: one vector per input, the model's own pooling, unit length unless `normalize` is false."""

    normalize: bool = Field(True, description="Unit length; false also leaves out the checkpoint's Normalize.")
    dimensions: int | None = Field(None, ge=1, description="The first N numbers of each vector (Matryoshka), "
                                                           "made unit length again when normalizing.")


class TeiTokenizeRequest(_Request):
    """TEI's /tokenize: the tokens of each text, with their characters."""

    inputs: str | list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = _PROMPT_NAME


class TeiSimilarityInputs(_Request):
    source_sentence: str
    sentences: list[str] = Field(description="The texts compared with source_sentence.")


class TeiSimilarityParameters(_Request):
    null_is_default: ClassVar[tuple[str, ...]] = ("truncate",)  # TEI's Option<bool>
    truncate: bool = _EMBED_TRUNCATE
    truncation_direction: Literal["right", "left", "Right", "Left"] = _DIRECTION
    prompt_name: str | None = _PROMPT_NAME


class TeiSimilarityRequest(_Request):
    """TEI's /similarity (huggingface_hub's `sentence_similarity`): the cosine similarity of source_sentence's
    vector with each sentence's, the vectors as /embed makes them."""

    null_is_default: ClassVar[tuple[str, ...]] = ("parameters",)
    inputs: TeiSimilarityInputs
    parameters: TeiSimilarityParameters | None = None


class TeiSimilarities(RootModel[list[float]]):
    """Each sentence's cosine similarity with the source sentence, in order."""


class TeiDecodeRequest(_Request):
    """TEI's /decode: the text of each row of token ids."""

    ids: list[int] | list[list[int]] = Field(description="One row of token ids, or a list of rows.")
    skip_special_tokens: bool = True


class TeiTexts(RootModel[list[str]]):
    """Each row's text, in order (a one-row request too)."""


class TeiInfo(BaseModel):
    """TEI's /info: the served model and the server's limits, in TEI's names. `model_type` is one of
    {"embedding": {"pooling": ...}}, {"classifier": {"id2label", "label2id"}}, {"reranker": {...}};
    `model_dtype` is hotrod's precision (fp32, int8, bf16-products, ...)."""

    model_id: str
    model_sha: str | None = None
    model_dtype: str
    model_type: dict[str, dict[str, Any]]
    max_concurrent_requests: int = Field(description="Requests that may wait for the model before a 429.")
    max_input_length: int = Field(description="The most tokens of one input.")
    max_batch_tokens: int = Field(description="The most tokens one batch runs: rows times max_input_length.")
    max_batch_requests: int | None = Field(description="The most rows one batch runs.")
    max_client_batch_size: int = Field(description="The most inputs of one request.")
    auto_truncate: bool = Field(description="Whether a long input is cut without `truncate`: never here.")
    tokenization_workers: int
    version: str
    sha: str | None = None
    docker_label: str | None = None


class TeiToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None = Field(description="The UTF-8 byte offset in the text where the token's text starts, as TEI "
                                          "counts it; null for a special token.")
    stop: int | None = Field(description="The byte offset where it ends (exclusive); null for a special token.")


class TeiTokens(RootModel[list[list[TeiToken]]]):
    """Each text's tokens, in order."""


class TeiVectors(RootModel[list[list[float]]]):
    """One vector per input, in order (a one-text request too)."""


class TeiTokenVectors(RootModel[list[list[list[float]]]]):
    """Every token's vector, per input."""
