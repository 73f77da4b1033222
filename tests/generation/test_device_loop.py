"""The decoding loop that keeps its tokens on the device: transformers' tokens, fewer reads by the host.

On a CPU the loop runs when told to (`applies`), on CPU tensors: the same code a GPU's logits take, so
the parity table's non-beam scenarios check it here, on every language model and backend.
"""

from __future__ import annotations

import pytest
import torch

from hotrod.generation import device_loop
from hotrod.generation.chain_pick import ChainPick
from tests.generation.test_parity import BATCH, SCENARIOS, SINGLE, frequent_tokens, generate_ours
from tests.zoo import CASES, VOCAB, assert_same_tokens, prompt_batch

NOT_BEAM = [name for name, scenario in SCENARIOS.items() if scenario.kwargs.get("num_beams", 1) == 1]


@pytest.fixture
def on_device(monkeypatch) -> list[int]:
    """Every generation takes the device loop; the host looks every 3 steps. Returns the answers it read."""
    looks: list[int] = []
    finished = device_loop.all_finished

    def counted(left):
        looks.append(1)
        return finished(left)

    monkeypatch.setattr(device_loop, "applies", lambda logits: True)
    monkeypatch.setattr(device_loop, "READ_EVERY", 3)
    monkeypatch.setattr(device_loop, "all_finished", counted)
    return looks


@pytest.mark.parametrize("lengths", [SINGLE, BATCH], ids=["single", "batch"])
@pytest.mark.parametrize("scenario", NOT_BEAM)
def test_device_loop_matches_transformers(zoo, lm_case, backend, lengths, scenario, on_device):
    spec = SCENARIOS[scenario]
    ids, mask = prompt_batch(CASES[lm_case], lengths)
    kwargs = dict(spec.kwargs)
    if spec.stop_often:
        kwargs["eos_token_id"] = frequent_tokens(zoo, lm_case, ids, mask)
    expected = zoo.hf_generate(lm_case, ids, mask, seed=spec.seed, **kwargs)
    actual = generate_ours(zoo.model(lm_case, backend), ids, mask, spec.seed, **kwargs)
    assert_same_tokens(actual, expected)


@pytest.mark.parametrize("kwargs", [dict(min_new_tokens=5), dict(suppress_tokens=[4, 5]), dict(bad_words_ids=[[6]])],
                         ids=["min_new_tokens", "suppress_tokens", "bad_words"])
def test_held_back_ids_match_the_host_loop(zoo, lm_case, kwargs, on_device):
    """Greedy settings that hold fixed ids back at some steps: processed there, the raw argmax elsewhere."""
    ids, mask = prompt_batch(CASES[lm_case], BATCH)
    model = zoo.model(lm_case, "static")
    first = model.generate(ids, attention_mask=mask, max_new_tokens=1)[:, -1].tolist()  # would end rows at once
    kwargs = dict(max_new_tokens=9, eos_token_id=first, **kwargs)
    expected = zoo.hf_generate(lm_case, ids, mask, **kwargs)
    assert_same_tokens(model.generate(ids, attention_mask=mask, **kwargs), expected)


def test_the_host_reads_every_few_steps_and_cuts_the_steps_past_the_end(zoo, backend, on_device):
    ids, mask = prompt_batch(CASES["gpt2"], BATCH)
    model = zoo.model("gpt2", backend)
    free = model.generate(ids, attention_mask=mask, max_new_tokens=20)
    assert len(on_device) <= 20 // 3  # an answer read after every 3rd step at most
    start = ids.shape[1]
    # every row ends on its first token: the host asks at its first look and reads the answer at its second,
    # and cuts the steps between
    eos = sorted(set(free[:, start].tolist()))
    on_device.clear()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=20, eos_token_id=eos)
    assert len(on_device) == 1
    assert out.shape[1] == start + 1
    assert_same_tokens(out, zoo.hf_generate("gpt2", ids, mask, max_new_tokens=20, eos_token_id=eos))


def test_the_output_ends_past_the_last_rows_first_eos():
    out = torch.tensor([[9, 1, 2, 3, 3, 3], [9, 4, 4, 5, 3, 3], [9, 3, 3, 3, 3, 3]])
    assert device_loop.ended(out, 1, torch.tensor([3])) == 5
    assert device_loop.ended(out, 1, torch.tensor([7])) == 6  # no row ended: all of it
    assert device_loop.ended(out[:2], 1, torch.tensor([2, 5])) == 4


def test_chains_cover_no_step_a_processor_changes():
    from hotrod.generation.config import merge, resolve
    from hotrod.generation.sampling import held_back

    fixed_ids = (dict(min_new_tokens=3), dict(forced_eos_token_id=5), dict(forced_bos_token_id=6),
                 dict(suppress_tokens=[4]), dict(bad_words_ids=[[7]]), dict())
    for fixed in fixed_ids:
        s = resolve(merge(None, None, {"max_new_tokens": 20, "eos_token_id": 2, **fixed}), 1, None, vocab_size=12)
        for length in range(1, s.max_length):
            steps = device_loop.chain_length(s, length, 8)
            assert steps in (1, 2, 4, 8) and length + steps <= s.max_length
            if steps > 1:  # no forced step inside a chain
                assert all(held_back(s, at) is not None for at in range(length, length + steps))
            longer = min(2 * steps, 8)  # the longest such chain: twice as long would pass an end or a forced step
            assert longer == steps or length + longer > s.max_length or \
                any(held_back(s, at) is None for at in range(length, length + longer))
    sampled = resolve(merge(None, None, {"max_new_tokens": 20, "do_sample": True}), 1, None, vocab_size=12)
    assert device_loop.chain_length(sampled, 1, 8) == 1


def test_the_static_engine_runs_greedy_steps_in_chains(zoo, on_device, monkeypatch):
    """READ_EVERY 3: after the prefill's token, 19 more in chains of 2 and one step; transformers' tokens."""
    ids, mask = prompt_batch(CASES["gpt2"], BATCH)
    model = zoo.model("gpt2", "static")
    chains, steps = [], []
    chain, run = model.backend.chain, model.backend.run
    monkeypatch.setattr(model.backend, "chain", lambda *a: chains.append(len(a[3])) or chain(*a))
    monkeypatch.setattr(model.backend, "run", lambda graph, feeds, **k: steps.append(graph) or run(graph, feeds, **k))
    out = model.generate(ids, attention_mask=mask, max_new_tokens=20, eos_token_id=None, pad_token_id=0)
    assert chains == [2] * 9 and steps == ["decoder"] * 2  # the prefill and the last step
    assert_same_tokens(out, zoo.hf_generate("gpt2", ids, mask, max_new_tokens=20, eos_token_id=None, pad_token_id=0))


@pytest.mark.parametrize("fixed", [
    dict(bad_words_ids=[[4], [9]]), dict(suppress_tokens=[4, 7]), dict(begin_suppress_tokens=[4]),
    dict(min_new_tokens=3), dict(bad_words_ids=[[4]], suppress_tokens=[7], min_new_tokens=3, forced_eos_token_id=5)])
def test_a_chains_pick_is_the_processed_argmax_at_every_step(fixed):
    """Inside a chain, each step's choice is the host loop's: the argmax of the processed scores, NaN logits at
    held-back ids included (a bad word's -inf is added, as transformers' bias; the others are filled)."""
    from hotrod.generation.config import merge, resolve
    from hotrod.generation.sampling import argmax, held_back, process

    s = resolve(merge(None, None, {"max_new_tokens": 8, "eos_token_id": 2, **fixed}), 1, None, vocab_size=12)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(14, 12, generator=generator)
    logits[torch.arange(12), torch.arange(12)] += 10  # row i's raw argmax is token i: every id chosen somewhere
    logits[12, 4], logits[13, 2] = float("nan"), float("nan")
    checked = False
    for length in range(1, s.max_length):
        steps = device_loop.chain_length(s, length, 8)
        if steps == 1:  # one step a call: the host loop's own choice (`choose`)
            continue
        pick = ChainPick(s, length, steps, 12, torch.device("cpu"))
        args = (*pick.bound, *pick.tensors)
        for j in range(steps):
            assert held_back(s, length + j) is not None
            rows = torch.zeros((14, length + j), dtype=torch.long)  # only their length is read
            half = logits.bfloat16()  # as the engine's half precision gives them; the host's are made fp32
            assert torch.equal(pick(logits, j, *args), argmax(process(logits, rows, s, None))), (length, j)
            assert torch.equal(pick(half, j, *args), argmax(process(half.float(), rows, s, None)))
        checked = True
    assert checked


def test_chains_hold_eos_back_under_min_new_tokens(zoo, on_device, monkeypatch):
    """The GPU benchmarks' setting (min_new_tokens = max_new_tokens): EOS held back inside every chain."""
    ids, mask = prompt_batch(CASES["gpt2"], BATCH)
    model = zoo.model("gpt2", "static")
    first = model.generate(ids, attention_mask=mask, max_new_tokens=1)[:, -1].tolist()  # would end rows at once
    chains, chain = [], model.backend.chain
    monkeypatch.setattr(model.backend, "chain", lambda *a: chains.append(len(a[3])) or chain(*a))
    kwargs = dict(max_new_tokens=12, min_new_tokens=12, eos_token_id=first)
    out = model.generate(ids, attention_mask=mask, **kwargs)
    assert chains and out.shape[1] == ids.shape[1] + 12
    assert_same_tokens(out, zoo.hf_generate("gpt2", ids, mask, **kwargs))


@pytest.mark.parametrize("ends", ["often", "at once"])
def test_sampling_leaves_the_generator_as_the_host_loop_does(zoo, lm_case, ends, monkeypatch):
    """Steps past the last EOS drew before the host saw it: the generator is set back, so a second call (and
    anything drawn after) is the host loop's; the output is contiguous, as its is."""
    ids, mask = prompt_batch(CASES[lm_case], BATCH)
    model = zoo.model(lm_case, "static")
    eos = frequent_tokens(zoo, lm_case, ids, mask) if ends == "often" else list(range(VOCAB))
    kwargs = dict(max_new_tokens=12, do_sample=True, temperature=2.0, eos_token_id=eos)

    def twice() -> list[torch.Tensor]:
        torch.manual_seed(5)
        return [model.generate(ids, attention_mask=mask, **kwargs) for _ in range(2)] + [torch.rand(4)]

    host = twice()
    monkeypatch.setattr(device_loop, "applies", lambda logits: True)
    monkeypatch.setattr(device_loop, "READ_EVERY", 3)
    device = twice()
    assert all(torch.equal(a, b) for a, b in zip(host, device)), (host, device)
    assert device[0].is_contiguous() and device[1].is_contiguous()
    if ends == "at once":  # every row ends early (at its first token the processors leave free)
        start = 1 if CASES[lm_case].kind == "seq2seq" else ids.shape[1]
        assert host[0].shape[1] <= start + 4
