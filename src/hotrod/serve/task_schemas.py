"""Request and response bodies of the task routes: hotrod's /v1/classify, Cohere's (and Jina's) /v1/rerank,
and text-embeddings-inference's /predict and /rerank, field for field, so their clients switch unchanged.

Strict and closed like every request model (`schemas._Request`); what depends on the served model (its
task, labels, positions) is checked by the routes.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, Field, RootModel

from hotrod.serve.schemas import _MODEL, Usage, _Request

_TRUNCATE = Field(False, description="Cut inputs longer than the model takes (the longer text of a pair first); "
                                     "without it such an input is a 400 naming it.")
_RAW = Field(False, description="The head's logits, without the sigmoid or softmax.")
_RIGHT_ONLY = Field("right", description="TEI's field: which end `truncate` cuts; a pair is cut from the "
                                        "right of its longer text, as transformers cuts it (left is refused).")


class ClassifyRequest(_Request):
    """Classify texts or text pairs, as transformers' text-classification pipeline does."""

    model: str | None = _MODEL
    input: str | list[str | list[str]] = Field(description="A text, a list of texts, or a list of [text, text_pair].")
    top_k: int | None = Field(1, ge=1, description="Labels per input, best first; null: every label. With 1, each "
                                                   "input's best label (the pipeline's default answer).")
    raw_scores: bool = _RAW
    truncate: bool = _TRUNCATE


class Label(BaseModel):
    label: str
    score: float


class ClassifyResponse(BaseModel):
    model: str
    results: list[Label] | list[list[Label]] = Field(
        description="The pipeline's answer: with top_k 1, one best label per input; otherwise each input's "
                    "labels (for one text, its labels)")
    usage: Usage


class Document(_Request):
    text: str


class RerankRequest(_Request):
    """Cohere's v1 rerank request (Jina's too): order documents by relevance to the query."""

    model: str | None = _MODEL
    query: str
    documents: list[str | Document]
    top_n: int | None = Field(None, ge=1, description="Results to return, most relevant first; default: all.")
    return_documents: bool = Field(False, description="Put each document's text in its result.")
    truncate: bool = _TRUNCATE


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: Document | None = None


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage


class PredictParameters(_Request):
    """What huggingface_hub's `text_classification` sends beside `inputs` (the Inference API's parameters)."""

    top_k: int | None = Field(None, ge=1, description="The best k labels of each input; default: every label.")
    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = Field(
        None, description="The scores' function in place of TEI's (sigmoid for one label, softmax otherwise).")


class PredictRequest(_Request):
    """text-embeddings-inference's /predict: a text, a [text, text_pair], or a batch of [text] and [text, pair]."""

    null_is_default: ClassVar[tuple[str, ...]] = ("truncate", "parameters")  # TEI's Option<bool>
    inputs: str | list[str] | list[list[str]]
    truncate: bool = _TRUNCATE
    truncation_direction: Literal["right", "left", "Right", "Left"] = _RIGHT_ONLY
    raw_scores: bool = _RAW
    parameters: PredictParameters | None = None


class Prediction(BaseModel):
    score: float
    label: str


class PredictResponse(RootModel[list[Prediction] | list[list[Prediction]]]):
    """Every label of an input, best first; a batch's, one list per input."""


class TeiRerankRequest(_Request):
    """text-embeddings-inference's /rerank."""

    null_is_default: ClassVar[tuple[str, ...]] = ("truncate",)  # TEI's Option<bool>
    query: str
    texts: list[str]
    truncate: bool = _TRUNCATE
    truncation_direction: Literal["right", "left", "Right", "Left"] = _RIGHT_ONLY
    raw_scores: bool = _RAW
    return_text: bool = False


class Rank(BaseModel):
    index: int
    text: str | None = None
    score: float


class TeiRerankResponse(RootModel[list[Rank]]):
    """The texts by score, best first."""


class TagRequest(_Request):
    """Entities of texts, as transformers' token-classification pipeline finds them."""

    model: str | None = _MODEL
    input: str | list[str] = Field(description="A text or a list of texts.")
    aggregation_strategy: Literal["none", "simple", "first", "average", "max"] = Field(
        "simple", description="none: every token; simple: neighbouring tokens of one entity joined; first, average, "
                              "max: each word's label from its tokens first")
    ignore_labels: list[str] = Field(["O"], description="Labels left out of the answer.")
    truncate: bool = _TRUNCATE


class Entity(BaseModel):
    entity: str | None = None
    entity_group: str | None = None
    score: float
    index: int | None = None
    word: str
    start: int | None = None  # None from a slow tokenizer, which has no character offsets
    end: int | None = None


class TagResponse(BaseModel):
    model: str
    results: list[list[Entity]] = Field(description="Each text's entities, in the text's order")
    usage: Usage


class AnswerRequest(_Request):
    """The span of a context that answers a question, as transformers 4.x's question-answering pipeline found it."""

    model: str | None = _MODEL
    question: str
    context: str
    top_k: int = Field(1, ge=1, le=100, description="Answers to return, best first.")
    doc_stride: int | None = Field(None, ge=0, description="Tokens neighbouring windows share (default 128, at most "
                                                           "half a window, less beside a long question).")
    max_answer_len: int = Field(15, ge=1, le=512, description="Tokens an answer may span.")
    max_seq_len: int | None = Field(None, ge=8, description="Tokens a window holds (default 384, or the model's).")
    max_question_len: int = Field(64, ge=1, description="Tokens the question may have.")
    handle_impossible_answer: bool = Field(False, description="Allow the answer that the context has none.")
    align_to_words: bool = Field(True, description="Widen answers to whole words (false: the tokens' characters).")


class Answer(BaseModel):
    answer: str
    score: float
    start: int
    end: int


class AnswerResponse(BaseModel):
    model: str
    answers: list[Answer] = Field(description="The best answers, best first (one unless top_k asks for more)")
    windows: int = Field(description="Windows the context was split into, run as one batch")
    usage: Usage


class ZeroShotRequest(_Request):
    """Candidate labels of texts by an NLI model's entailment, as transformers' zero-shot-classification
    pipeline scores them."""

    model: str | None = _MODEL
    input: str | list[str] = Field(description="A text or a list of texts.")
    candidate_labels: list[str] | str = Field(description="The labels to choose among: a list, or one text of "
                                                          "comma-separated labels.")
    hypothesis_template: str = Field("This example is {}.", description="The hypothesis made of each label, with {} "
                                                                        "where the label goes.")
    multi_label: bool = Field(False, description="Score each label on its own (entailment against contradiction) "
                                                 "instead of one softmax among the labels.")
    truncate: bool = Field(False, description="Cut texts too long for the model beside a hypothesis (the text, "
                                              "never the hypothesis); without it such a text is a 400 naming it.")


class ZeroShotResult(BaseModel):
    sequence: str
    labels: list[str] = Field(description="The candidate labels, best first")
    scores: list[float] = Field(description="Each label's score, in the order of labels")


class ZeroShotResponse(BaseModel):
    model: str
    results: list[ZeroShotResult] = Field(description="One per text, in the input's order")
    usage: Usage


class EmbedSparseRequest(_Request):
    """text-embeddings-inference's /embed_sparse: a SPLADE model's sparse vector of each text."""

    model: str | None = _MODEL
    inputs: str | list[str] = Field(description="A text or a list of texts.")
    truncate: bool | None = Field(None, description="Cut texts longer than the model embeds (its max_seq_length), "
                                                    "as sentence-transformers cuts them; without it such a text is "
                                                    "a 400 naming it.")
    truncation_direction: Literal["right", "left", "Right", "Left"] = Field(
        "right", description="Which end of a text `truncate` cuts: right keeps its start.")
    prompt_name: str | None = Field(None, max_length=256, description="One of the checkpoint's named prompts, put "
                                                                      "before each text; default: its default prompt.")


class SparseValue(BaseModel):
    index: int = Field(description="The vocabulary entry (token id)")
    value: float


class EmbedSparseResponse(RootModel[list[list[SparseValue]]]):
    """Each text's non-zero entries, in index order; one list per text (a one-text request too)."""
