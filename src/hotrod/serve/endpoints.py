"""hotrod's own generation endpoint, and what every route shares (the kinds each serves, the error bodies).

Each route resolves its model, checks its inputs (`checks.py`) and only then submits: a refused request
never takes a slot. OpenAI's completions endpoint is in `completions.py`, the embedding routes in
`embeddings.py`.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, Request, Response

from hotrod import kinds
from hotrod.serve.checks import exactly_one, forced_bos, new_tokens, prompt_lookup, token_ids
from hotrod.serve.http_errors import Recorder, resolve
from hotrod.serve.messages import Params, Worker
from hotrod.serve.schemas import (
    ErrorBody,
    GenerateRequest,
    GenerateResponse,
    Sampling,
    TeiErrorBody,
    Usage,
)
from hotrod.serve.sse import collect, continuation, prompt_context, stream, submit

GENERATORS = kinds.names(lambda kind: kind.generates)  # the kinds each route serves
ENCODERS = kinds.names(lambda kind: not kind.generates)
# An invalid field is a 400 on hotrod's and OpenAI's routes (as OpenAI answers it), a 422 on TEI's (as TEI does).
ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorBody} for s in (400, 401, 404, 413, 415, 429, 500, 503,
                                                                             504)}
TEI_ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": TeiErrorBody} for s in (400, 401, 404, 413, 415, 422,
                                                                                    429, 500, 503, 504)}
STREAMED = {**ERRORS, 200: {"description": "JSON, or with `stream: true` server-sent events ending in "
                                           "`data: [DONE]`", "content": {"text/event-stream": {}}}}

router = APIRouter()


def json_response(body: Any, recorder: Recorder) -> Response:
    recorder.done("ok")
    return Response(body.model_dump_json(), media_type="application/json")


def usage(prompt: int, completion: int = 0) -> Usage:
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def sampling(temperature: float | None, do_sample: bool) -> dict[str, Any]:
    """Temperature 0 means greedy whatever else is asked, as in OpenAI's API."""
    if not do_sample or not temperature:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": temperature}


def generation_params(body: Sampling, new: int, worker: Worker, forced: int | None, prefix: str = "") -> Params:
    """The worker's parameters of a checked request that generates `new` tokens, whose forced first token
    `checks.forced_bos` resolved (`prefix`: where its fields are, in a refusal)."""
    return Params(max_new_tokens=new, top_k=body.top_k, top_p=body.top_p, num_beams=body.num_beams,
                  repetition_penalty=body.repetition_penalty, seed=body.seed,
                  prompt_lookup=prompt_lookup(worker, body.speculate, body.num_beams, f"{prefix}speculate"),
                  forced_bos_token_id=forced, no_repeat_ngram_size=body.no_repeat_ngram_size,
                  **sampling(body.temperature, body.do_sample))


@router.post("/v1/generate", response_model=GenerateResponse, responses=STREAMED)
async def generate(body: GenerateRequest, request: Request) -> Response:
    """Generate from text or token ids; `stream: true` answers with one server-sent event per step."""
    worker, recorder = resolve(request, "generate", body.model, GENERATORS)
    where = exactly_one(body.text, body.token_ids, "text", "token_ids")
    forced = await forced_bos(request, worker, body)
    prompt = await token_ids(request, worker, body.text if body.text is not None else body.token_ids or [], where)
    new = new_tokens(request, worker, prompt, body.max_new_tokens, where, "max_new_tokens")
    params = generation_params(body, new, worker, forced)
    reader = submit(request, functools.partial(worker.submit_generate, prompt, params))
    name = recorder.model
    context = prompt_context(worker.decode, worker.info.kind, prompt)  # a decoder's text continues its prompt
    if body.stream:
        def chunk(text: str, ids: list[int], finish: str | None, usage: dict | None) -> dict[str, Any]:
            return {"model": name, "text": text, "token_ids": ids, "finish_reason": finish,
                    **({"usage": usage} if usage else {})}

        return await stream(reader, recorder, worker.decode, len(prompt), chunk, context)
    tokens, last = await collect(reader)
    return json_response(GenerateResponse(model=name, text=continuation(worker.decode, context, tokens),
                                          token_ids=tokens,
                                          finish_reason=last.finish_reason or "stop",
                                          usage=usage(len(prompt), len(tokens))), recorder)
