"""A request's answer is the same alone and beside any others, at every precision hotrod serves.

The same request is served alone, then among 1, 7 and 31 others of other lengths arriving around it (so it
shares prompt batches, and steps with rows of other cache lengths, in continuous batching; and dynamic
batches of encoder rows). Its tokens and log-probabilities, or its embedding, must be equal bit for bit:
a user who asks for greedy decoding gets the same completion at any load. Every family is asked, decoders
and encoders alike.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

import hotrod
from hotrod import precisions
from hotrod.runtime import bf16, i8, native
from hotrod.serve.messages import Params
from hotrod.serve.worker import ModelWorker, ServeOptions
from tests.zoo import ENCODER_CASES, LM_CASES

# bf16-products where this CPU has its kernels (elsewhere the build is refused: it would be fp32's)
HERE = ("bf16-products",) if precisions.get("bf16-products").has_kernels("cpu") else ()
PRECISIONS = ("fp32", "int8", "int8-static", "int8-weight", "int4", "int4-b128", "int4-b256", *HERE)
NEIGHBOURS = (1, 7, 31)
OPTIONS = ServeOptions(max_batch_size=32, max_queue_delay_ms=20.0, max_queue=128)
PARAMS = Params(max_new_tokens=6, logprobs=2)


@pytest.fixture(scope="module")
def artifacts(zoo, tmp_path_factory):
    made: dict[tuple[str, str], object] = {}

    def build(case: str, precision: str):
        if (case, precision) not in made:
            out = tmp_path_factory.mktemp(f"{case}-{precision}")
            made[case, precision] = hotrod.optimize(zoo.checkpoint(case), out, precision=precision, force=True,
                                                    progress=False, verify_examples=2)
        return made[case, precision]

    return build


@pytest.fixture
def worker(artifacts, started):
    def make(case: str, precision: str) -> ModelWorker:
        return started(ModelWorker(case, hotrod.load(artifacts(case, precision)), OPTIONS))

    return make


def _prompts(vocab: int, count: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 14, (count,), generator=generator).tolist()
    return [torch.randint(2, vocab, (n,), generator=generator).tolist() for n in lengths]


async def _generate(worker: ModelWorker, prompt: list[int]):
    tokens, logprobs = [], []
    async for event in worker.submit_generate(prompt, PARAMS).events():
        assert event.error is None
        tokens += event.tokens
        logprobs += [(p.logprob, p.top) for p in event.logprobs or []]
        if event.finish_reason:
            return tokens, logprobs
    raise AssertionError("the ticket ended without a finish reason")


async def _among(worker: ModelWorker, target: list[int], others: list[list[int]], submit):
    """`target`'s answer, submitted in the middle of `others` (half before it, half after, staggered)."""
    half = len(others) // 2
    order = [*others[:half], target, *others[half:]]

    async def one(i, prompt):
        await asyncio.sleep(0.002 * i)
        return await submit(worker, prompt)

    results = await asyncio.gather(*(one(i, p) for i, p in enumerate(order)))
    return results[half]


# Every other family at the precisions whose kernels differ most (float, per-row dynamic int8, calibrated
# int8, bf16 products); bert, gpt2 and t5 at all of them. The int4 precisions quantize only the decoders' products.
FAMILY_PRECISIONS = ("fp32", "int8", "int8-static", *HERE)
# int8-full (int8 attention) for every encoder family, and for T5's encoder under its decoder.
LMS = [(lm, p) for lm in ("gpt2", "t5") for p in PRECISIONS] + [
    (lm, p) for lm in LM_CASES if lm not in ("gpt2", "t5") for p in FAMILY_PRECISIONS] + [("t5", "int8-full")]
ENCODERS = [("bert", p) for p in PRECISIONS] + [
    (family, p) for family in ENCODER_CASES if family != "bert" for p in FAMILY_PRECISIONS] + [
    (family, "int8-full") for family in ENCODER_CASES]


@pytest.mark.parametrize(("lm", "precision"), LMS)
def test_tokens_and_logprobs_do_not_depend_on_batch_mates(worker, lm, precision):
    _same_tokens_beside_any(worker(lm, precision))


def _same_tokens_beside_any(served: ModelWorker) -> None:
    target, *others = _prompts(served.info.vocab_size, 1 + max(NEIGHBOURS), seed=3)
    alone = asyncio.run(_generate(served, target))
    for count in NEIGHBOURS:
        assert asyncio.run(_among(served, target, others[:count], _generate)) == alone, f"beside {count} others"


async def _embed(worker: ModelWorker, row: list[int]) -> torch.Tensor:
    async for event in worker.submit_embed([row], "mean", True).events():
        assert event.error is None
        if event.result is not None:
            return event.result
    raise AssertionError("the ticket ended without a result")


@pytest.mark.parametrize(("family", "precision"), ENCODERS)
def test_embeddings_do_not_depend_on_batch_mates(worker, family, precision):
    _same_embedding_beside_any(worker(family, precision))


def _same_embedding_beside_any(served: ModelWorker) -> None:
    target, *others = _prompts(served.info.vocab_size, 1 + max(NEIGHBOURS), seed=4)
    alone = asyncio.run(_embed(served, target))
    for count in NEIGHBOURS:
        assert torch.equal(asyncio.run(_among(served, target, others[:count], _embed)), alone), f"beside {count} others"


# The products' path on a CPU without AMX (AVX-512 VNNI and BF16: a Zen 4's), taken here with the tiles left out,
# for an encoder and both kinds of decoder at the precisions whose products it computes.
WITHOUT_TILES = [(name, p) for name in ("bert", "gpt2", "t5") for p in ("int8", "int8-static", *HERE)]


@pytest.mark.skipif(not native.has_flags(("amx_tile",)), reason="no tiles on this CPU: its own path is tested above")
@pytest.mark.parametrize(("name", "precision"), WITHOUT_TILES)
def test_without_tiles_answers_do_not_depend_on_batch_mates(worker, name, precision):
    with native.tiles_left_out():
        served = worker(name, precision)
        _same_tokens_beside_any(served) if name in LM_CASES else _same_embedding_beside_any(served)
    ops = set().union(*served.model.backend.kernel_ops.values())
    assert ops & {i8.OP, *bf16.OPS}, "the products ran on onnxruntime's ops, not on the path without tiles"
