"""The Open Inference Protocol (KServe v2, Triton's HTTP API), so KServe and Triton clients call hotrod unchanged.

Each served model is one v2 model with one version, "1". Its tensors (also in its metadata):

- decoder and seq2seq models take `text_input` (BYTES [n] or [n, 1], one prompt per row) or `input_ids`
  (INT64 [n, L], or [L] for one row; rows are unpadded, so prompts of other lengths go as text or in
  another request), and answer `text_output` (BYTES [n]), `output_ids` (INT64 [n, T]: the generated
  tokens, rows shorter than the longest padded with -1, which is no token), `output_lengths` (INT64 [n])
  and `finish_reason` (BYTES [n]: "length" or "stop"). Request parameters are /v1/generate's sampling
  fields (max_new_tokens, do_sample, temperature, top_k, top_p, num_beams, repetition_penalty, seed, and
  speculate, an object: {"prompt_lookup": N}),
  checked the same way; each row is its own worker request, so rows batch with everyone else's.
- encoder models take `text` or `input_ids` alike and answer `embeddings` (FP32 [n, width]), the model's
  own (its sentence-transformers pipeline); parameters pooling, normalize, prompt_name, prompt and truncate,
  as /v1/embed.
- encoder heads (`hotrod.tasks`) take the same inputs and answer their head's outputs: a classifier its
  `logits` (FP32 [n, labels]); a token classifier its `logits` (FP32 [n, L, labels]) and a span head its
  `start_logits` and `end_logits` (FP32 [n, L]), rows shorter than the longest padded with 0, with each
  row's `lengths` (INT64 [n]). They take no parameters; their rows run in the dynamic batches of /v1/classify's.

Rows are bounded by the server's max_batch_inputs, tokens by its input limit, and every refusal is a
4xx with the protocol's `{"error": "<message>"}`. The health probes are in app.py, beside /health.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ValidationError

from hotrod import kinds, tasks
from hotrod.pipelines.base import Row
from hotrod.serve import tensors
from hotrod.serve.checks import forced_bos, input_limit, new_tokens, token_rows
from hotrod.serve.embeddings import check_embeds, chosen_prompt, embed_vectors, embedding_rows, own_normalize
from hotrod.serve.endpoints import ENCODERS, GENERATORS, generation_params
from hotrod.serve.http_errors import ApiError, check_running, resolve
from hotrod.serve.messages import Worker
from hotrod.serve.schemas import Pooling, Sampling, _Request
from hotrod.serve.sse import collect_all, continuation, prompt_context, submit_all
from hotrod.serve.task_calls import run as run_rows
from hotrod.serve.tensors import Input, Output, bad
from hotrod.version import __version__

VERSION = "1"  # hotrod serves one version of each model
PAD = -1  # fills `output_ids` past a row's end: no token has this id
Tensors = dict[str, tuple[str, list[int]]]  # name -> (datatype, shape; -1 where it varies)
Built = dict[str, Callable[[], tuple[list[int], Any]]]  # output name -> its (shape, values), made on demand


@dataclass(frozen=True)
class Signature:
    inputs: Tensors
    outputs: Tensors
    parameters: type[BaseModel]


GENERATOR = Signature({"text_input": ("BYTES", [-1]), "input_ids": ("INT64", [-1, -1])},
                      {"text_output": ("BYTES", [-1]), "output_ids": ("INT64", [-1, -1]),
                       "output_lengths": ("INT64", [-1]), "finish_reason": ("BYTES", [-1])}, Sampling)
ENCODER = Signature({"text": ("BYTES", [-1]), "input_ids": ("INT64", [-1, -1])},
                    {"embeddings": ("FP32", [-1, -1])}, Pooling)
LENGTHS = "lengths"  # a head with per-token outputs: each row's tokens


class NoParameters(_Request):
    """An encoder head's infer request takes no parameters."""


def head_outputs(task: str, labels: int) -> Tensors:
    """The outputs of a head of `task` (its spec's `outputs`): what `HotrodModel.run_rows` gives per row,
    batched, with each row's `lengths` where an output is per token."""
    outputs = tasks.get(task).outputs
    found: Tensors = {out.name: ("FP32", [_axis(a, labels) for a in out.axes]) for out in outputs}
    return {**found, LENGTHS: ("INT64", [-1])} if any(out.per_token for out in outputs) else found


def _axis(axis: str | int, labels: int) -> int:
    """A symbolic axis as the protocol has it: the label count, a number, or -1 where it varies."""
    if axis == "labels":
        return labels
    return axis if isinstance(axis, int) else -1


class V2Error(BaseModel):
    """Every error of a /v2 route, as the protocol has it."""

    error: str


ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": V2Error} for s in (400, 401, 404, 413, 415, 429, 500, 503,
                                                                           504)}
_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"type": "object", "description": "An inference request (id, parameters, "
                                                                     "inputs, outputs)"}},
    "application/octet-stream": {"schema": {"type": "string", "format": "binary", "description": (
        "The binary tensor form: the JSON request in the first Inference-Header-Content-Length bytes, then "
        "each binary input's bytes")}}}}}

router = APIRouter()


def signature(worker: Worker) -> Signature:
    if kinds.spec(worker.info.kind).generates:
        return GENERATOR
    task = worker.info.task
    if task is not None and not tasks.get(task).bare:
        return Signature(ENCODER.inputs, head_outputs(task, len(worker.info.labels)), NoParameters)
    return ENCODER


@router.get("/v2", responses=ERRORS)
async def server_metadata() -> dict[str, Any]:
    """The server's name, version and protocol extensions."""
    return {"name": "hotrod", "version": __version__, "extensions": ["binary_tensor_data"]}


@router.get("/v2/models/{name}", responses=ERRORS)
@router.get("/v2/models/{name}/versions/{version}", responses=ERRORS)
async def model_metadata(name: str, request: Request, version: str | None = None) -> dict[str, Any]:
    """A model's tensors, and the server's limits on them."""
    worker = _served(request, name, version)
    found, limits = signature(worker), request.app.state.limits
    extra = ({"max_new_tokens_limit": limits.max_new_tokens_limit, "output_ids_pad": PAD}
             if found is GENERATOR else {})
    return {"name": name, "versions": [VERSION], "platform": "hotrod",
            "inputs": _described(found.inputs), "outputs": _described(found.outputs),
            "parameters": {"kind": worker.info.kind, "max_batch_inputs": limits.max_batch_inputs,
                           "max_input_tokens": input_limit(request, worker), **extra}}


@router.get("/v2/models/{name}/ready", responses=ERRORS)
@router.get("/v2/models/{name}/versions/{version}/ready", responses=ERRORS)
async def model_ready(name: str, request: Request, version: str | None = None) -> dict[str, Any]:
    """200 while the model takes requests; 503 while it loads, after it failed, or at shutdown."""
    worker = _served(request, name, version)
    if request.app.state.shutting_down:
        raise ApiError(503, "the server is shutting down")
    check_running(name, worker)
    return {"name": name, "ready": True}


@router.post("/v2/models/{name}/infer", responses=ERRORS, openapi_extra=_BODY)
@router.post("/v2/models/{name}/versions/{version}/infer", responses=ERRORS, openapi_extra=_BODY)
async def infer(name: str, request: Request, version: str | None = None) -> Response:
    """Generate or embed: JSON tensors, or the binary tensor data extension (in, out, or both)."""
    worker, recorder = resolve(request, "infer", name, GENERATORS + ENCODERS)
    _check_version(name, version)
    call = tensors.read_request(await request.body(), request.headers.get(tensors.HEADER))
    found = signature(worker)
    options, binary = _options(call.parameters, found.parameters, request)
    wanted = _requested(call.outputs, found.outputs, binary)
    source = _source(call.inputs, found.inputs, worker)
    items, wheres = _items(request, worker, source)
    if found is ENCODER:
        built = await _embed(request, worker, items, wheres, source.name, options)  # type: ignore[arg-type]
    else:
        rows = await token_rows(request, worker, items, source.name, wheres)
        if found is GENERATOR:
            built = await _generate(request, worker, rows, source.name, options)  # type: ignore[arg-type]
        else:
            built = await _heads(request, worker, rows, found.outputs)
    outputs = [Output(out, found.outputs[out][0], *built[out](), binary=as_binary) for out, as_binary in wanted]
    head = {"model_name": name, "model_version": VERSION, **({"id": call.id} if call.id is not None else {})}
    recorder.done("ok")
    return tensors.response(head, outputs)


def _described(found: Tensors) -> list[dict[str, Any]]:
    return [{"name": name, "datatype": datatype, "shape": shape} for name, (datatype, shape) in found.items()]


def _served(request: Request, name: str, version: str | None) -> Worker:
    workers = request.app.state.workers
    if name not in workers:
        raise ApiError(404, f"model '{name}' is not served here; served: {', '.join(workers)}")
    _check_version(name, version)
    return workers[name]


def _check_version(name: str, version: str | None) -> None:
    if version is not None and version != VERSION:
        raise ApiError(404, f"model '{name}' has no version '{version}'; its only version is {VERSION}")


# -- the request's parts, checked before any work ---------------------------------------------------------

def _options(parameters: dict[str, Any], model: type[BaseModel], request: Request) -> tuple[BaseModel, bool]:
    """The model's parameters (checked as its /v1 endpoint checks them), and `binary_data_output`; Triton's
    request parameters that tritonclient's `infer(timeout=, priority=)` send: the timeout (microseconds) bounds
    this request below the server's own; priority levels are not kept here, so only the default 0 runs."""
    given = dict(parameters)
    binary = given.pop("binary_data_output", False)
    if not isinstance(binary, bool):
        raise bad("parameters.binary_data_output: must be true or false")
    timeout, priority = given.pop("timeout", None), given.pop("priority", 0)
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
            raise bad(f"parameters.timeout: microseconds, a whole number >= 1; got {timeout!r}")
        request.state.timeout_s = timeout / 1e6
    if priority != 0 or isinstance(priority, bool):
        raise bad(f"parameters.priority: this server runs requests in arrival order, without priority levels; "
                  f"send 0 (the default), not {priority!r}")
    try:
        return model.model_validate(given), binary
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        unknown = error["type"] == "extra_forbidden"
        reason = (f"not a parameter of this model (it takes {', '.join(model.model_fields) or 'none'})"
                  if unknown and len(error["loc"]) == 1 else "unknown field" if unknown else error["msg"])
        raise bad(f"parameters.{where}: {reason}") from None


def _requested(outputs: list[dict[str, Any]] | None, found: Tensors, binary: bool) -> list[tuple[str, bool]]:
    """(name, as binary) of each output to send: those asked for, or all of them."""
    if not outputs:
        return [(name, binary) for name in found]
    wanted: dict[str, bool] = {}
    for i, item in enumerate(outputs):
        name, where = item.get("name"), f"outputs[{i}]"
        if not isinstance(name, str) or name not in found:
            raise bad(f"{where}: {name!r} is not an output of this model; its outputs: {', '.join(found)}")
        if name in wanted or set(item) - {"name", "parameters"}:
            raise bad(f"{where}: {name} is asked for twice, or with fields other than name and parameters")
        options = tensors.parameters(item, f"{where}.parameters")
        if set(options) - {"binary_data"}:
            raise bad(f"{where}.parameters: only binary_data is supported (not the classification or shared "
                      f"memory extensions)")
        wanted[name] = options.get("binary_data", binary)
        if not isinstance(wanted[name], bool):
            raise bad(f"{where}.parameters.binary_data: must be true or false")
    return list(wanted.items())


def _source(inputs: list[Input], found: Tensors, worker: Worker) -> Input:
    """The one input the request gives, of a name and datatype this model takes."""
    for tensor in inputs:
        if tensor.name not in found:
            raise bad(f"{tensor.name}: not an input of model '{worker.info.name}' (kind {worker.info.kind}); "
                      f"it takes one of {', '.join(found)}")
    if len(inputs) != 1:
        raise bad(f"inputs: give exactly one of {' and '.join(found)}")
    tensor = inputs[0]
    if tensor.datatype != found[tensor.name][0]:
        raise bad(f"{tensor.name}: datatype {tensor.datatype}; this input is {found[tensor.name][0]}")
    return tensor


def _items(request: Request, worker: Worker, tensor: Input) -> tuple[list[Any], list[str]]:
    """Each row's text or token ids and where it is, the shape checked against the server's limits before the
    data is decoded."""
    shape, name = tensor.shape, tensor.name
    if tensor.datatype == "BYTES":
        if len(shape) not in (1, 2) or shape[1:] not in ([], [1]):
            raise bad(f"{name}: shape {shape}; texts are [n] or [n, 1], one per row")
        count, width = shape[0], 0
    else:
        if len(shape) not in (1, 2):
            raise bad(f"{name}: shape {shape}; token ids are [n, L], one prompt per row, or [L]")
        count, width = (shape[0] if len(shape) == 2 else 1), shape[-1]
        limit = input_limit(request, worker)
        if width > limit:
            raise bad(f"{name}: rows of {width} tokens; this server takes at most {limit} tokens per input "
                      f"for this model")
    most = request.app.state.limits.max_batch_inputs
    if not 0 < count <= most:
        raise bad(f"{name}: {count} rows; this server takes 1 to {most} per request")
    flat = tensors.values(tensor)
    items = flat if tensor.datatype == "BYTES" else [flat[i * width:(i + 1) * width] for i in range(count)]
    return items, [f"{name}[{i}]" for i in range(count)]


# -- running ----------------------------------------------------------------------------------------------

async def _generate(request: Request, worker: Worker, prompts: list[list[int]], name: str,
                    options: Sampling) -> Built:
    """Each row as its own worker request, all at once; their answers in order."""
    news = [new_tokens(request, worker, prompt, options.max_new_tokens, f"{name}[{i}]", "max_new_tokens")
            for i, prompt in enumerate(prompts)]
    forced = await forced_bos(request, worker, options, "parameters.")
    calls = [functools.partial(worker.submit_generate, prompt, generation_params(options, new, worker, forced,
                                                                                 "parameters."))
             for prompt, new in zip(prompts, news)]
    results = await collect_all(submit_all(request, calls))
    tokens = [row for row, _ in results]
    rows, width = len(tokens), max(map(len, tokens))
    ids = np.full((rows, width), PAD, dtype=np.int64)
    for i, row in enumerate(tokens):
        ids[i, :len(row)] = row
    def texts() -> list[str]:  # a decoder's text continues its prompt
        return [continuation(worker.decode, prompt_context(worker.decode, worker.info.kind, prompt), row)
                for prompt, row in zip(prompts, tokens)]

    return {"text_output": lambda: ([rows], texts()),
            "output_ids": lambda: ([rows, width], ids),
            "output_lengths": lambda: ([rows], [len(row) for row in tokens]),
            "finish_reason": lambda: ([rows], [last.finish_reason or "stop" for _, last in results])}


async def _heads(request: Request, worker: Worker, ids: list[list[int]], found: Tensors) -> Built:
    """A head's outputs of each row, run in the worker's dynamic batches; per-token ones padded with 0."""
    outputs = await run_rows(request, worker, [Row(row) for row in ids])
    lengths = [len(row) for row in ids]
    built: Built = {LENGTHS: lambda: ([len(ids)], lengths)}
    for name in found:
        if name != LENGTHS:
            built[name] = functools.partial(_stacked, [out[name] for out in outputs])
    return built


def _stacked(values: list[Any]) -> tuple[list[int], np.ndarray]:
    """Rows of one output as one array, rows shorter than the longest padded with 0."""
    width = max(value.shape[0] for value in values) if values[0].dim() else 0
    array = np.zeros((len(values), *([width] if width else []), *values[0].shape[1:]), dtype=np.float32)
    for i, value in enumerate(values):
        array[i, : value.shape[0]] = value.float().numpy()
    return list(array.shape), array


async def _embed(request: Request, worker: Worker, items: list[Any], wheres: list[str], name: str,
                 options: Pooling) -> Built:
    """The model's own embeddings, as /v1/embed gives them (`embeddings.py`)."""
    check_embeds(worker)
    texts = bool(items) and isinstance(items[0], str)
    prompt = chosen_prompt(worker, options.prompt, options.prompt_name, texts)
    tokenized = await embedding_rows(request, worker, items, name, prompt, options.truncate, wheres=wheres)
    vectors = await embed_vectors(request, worker, tokenized, options.pooling, own_normalize(worker, options.normalize))
    return {"embeddings": lambda: (list(vectors.shape), vectors)}
