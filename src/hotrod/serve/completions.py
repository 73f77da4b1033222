"""OpenAI's completions endpoint: one prompt (text or token ids), one choice, optional streaming."""

from __future__ import annotations

import functools
import time
from typing import Any

from fastapi import APIRouter, Request, Response

from hotrod.serve.checks import new_tokens, token_ids
from hotrod.serve.endpoints import GENERATORS, STREAMED, json_response, sampling, usage
from hotrod.serve.http_errors import ApiError, request_id_of, resolve
from hotrod.serve.protocol import Params
from hotrod.serve.schemas import CompletionChoice, CompletionRequest, CompletionResponse
from hotrod.serve.sse import collect, stream, submit

router = APIRouter()


@router.post("/v1/completions", response_model=CompletionResponse, responses=STREAMED)
async def completions(body: CompletionRequest, request: Request) -> Response:
    """OpenAI's completions endpoint: one prompt (text or token ids), one choice, optional streaming."""
    engine, recorder = resolve(request, "completions", body.model, GENERATORS)
    if body.stop:  # null, "" and [] all mean "no stop sequences"
        raise ApiError(400, "stop: stop sequences are not supported", "stop")
    prompt = await token_ids(request, engine, body.prompt, "prompt")
    new = new_tokens(request, engine, prompt, body.max_tokens, "prompt", "max_tokens")
    params = Params(max_new_tokens=new, top_p=1.0 if body.top_p is None else body.top_p, seed=body.seed,
                    **sampling(body.temperature, True))
    reader = submit(request, functools.partial(engine.submit_generate, prompt, params))
    head = {"id": f"cmpl-{request_id_of(request)}", "object": "text_completion", "created": int(time.time()),
            "model": recorder.model}
    if body.stream:
        def chunk(text: str, ids: list[int], finish: str | None, usage: dict | None) -> dict[str, Any]:
            choice = {"text": text, "index": 0, "finish_reason": finish, "logprobs": None}
            return {**head, "choices": [choice], **({"usage": usage} if usage else {})}

        return await stream(reader, recorder, engine.decode, len(prompt), chunk)
    tokens, last = await collect(reader)
    choice = CompletionChoice(text=engine.decode(tokens), finish_reason=last.finish_reason)
    return json_response(CompletionResponse(**head, choices=[choice], usage=usage(len(prompt), len(tokens))),
                         recorder)
