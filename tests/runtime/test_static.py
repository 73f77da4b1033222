"""The static engine beyond fp32 (which the whole parity table runs as backend "static"): half precision
and int8 weights close to fp32, measured fp16 islands, recordings that repeat, and CUDA graphs on a GPU."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import hotrod
from hotrod.runtime.cast import overflowing_modules
from tests.zoo import CASES, assert_same_tokens, prompt_batch

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_each_engine_precision_has_its_dtype_and_linear_layers_here():
    """The engine maps the registry's fields (`hotrod.precisions`) to torch: a dtype for each engine
    precision, a quantizing layer for every way of storing linears but a plain cast."""
    from hotrod import precisions
    from hotrod.runtime.static import QUANTIZERS, EngineOptions

    assert set(QUANTIZERS) == set(precisions.LINEAR_FORMATS) - {precisions.CAST}
    dtypes = {name: EngineOptions(device="cpu", precision=name).dtype for name in precisions.names(lambda p: p.engine)}
    assert dtypes == {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                      "int8-weight": torch.bfloat16, "fp8": torch.bfloat16}


def _logits(model, case_name):
    ids, mask = prompt_batch(CASES[case_name], (7, 3, 5))
    if CASES[case_name].kind == "seq2seq":
        return model(ids, attention_mask=mask, decoder_input_ids=ids[:, :4]).logits
    return model(ids, attention_mask=mask).logits[mask.bool()]


@pytest.mark.parametrize("precision", ["bf16", "fp16", "int8-weight"])
def test_lower_precisions_stay_close_to_fp32(zoo, lm_case, precision):
    checkpoint = zoo.at_trained_scale(lm_case)
    reference = _logits(hotrod.load(checkpoint, backend="torch"), lm_case)
    model = hotrod.load(checkpoint, backend="torch", static=True, precision=precision)
    got = _logits(model, lm_case)
    assert got.dtype == torch.float32 and got.isfinite().all()
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), reference.flatten(), dim=0)
    assert cosine > 0.999
    agree = (got.argmax(-1) == reference.argmax(-1)).float().mean()
    assert agree > 0.9


def test_a_repeated_generate_replays_what_it_recorded(zoo, lm_case):
    model = hotrod.load(zoo.checkpoint(lm_case), backend="torch", static=True, precision="bf16")
    ids, mask = prompt_batch(CASES[lm_case], (7, 3, 5))
    first = model.generate(ids, attention_mask=mask, max_new_tokens=8)
    for _ in range(2):  # the first call's buffers are fresh; from the second on they come back in one order
        model.generate(ids, attention_mask=mask, max_new_tokens=8)
    stats = model.backend.recorded.stats
    captured, eager = stats.captured, stats.eager
    assert_same_tokens(model.generate(ids, attention_mask=mask, max_new_tokens=8), first)
    assert (stats.captured, stats.eager) == (captured, eager)  # the same buffers, so the same keys
    assert model.backend.pool.lent == 0  # every cache buffer went back


def test_fp16_islands_of_an_overflowing_t5_are_measured_and_kept(zoo, tmp_path):
    from hotrod.build.graphs import build_module
    from hotrod.source import open_source

    module = build_module(open_source(zoo.checkpoint("t5_v1_1")))
    block = module.decoder.block[1].layer[-1].DenseReluDense
    with torch.no_grad():  # a gated product past fp16's range, as large T5 checkpoints have
        block.wi_0.weight.mul_(3e3)
        block.wi_1.weight.mul_(3e3)
        block.wo.weight.mul_(1e-6)
    ids, mask = prompt_batch(CASES["t5_v1_1"], (7,))
    graphs = module.graphs()

    def run():
        hidden = graphs["encoder"](ids, mask)
        graphs["decoder_init"](ids[:, :3], mask, hidden)

    assert overflowing_modules(module, run) == ["decoder.block.1.layer.2.DenseReluDense"]


@cuda_only
@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_cuda_graphs_replay_the_same_tokens_as_eager_fp32(zoo, name):
    eager = zoo.model(name, "torch")
    model = hotrod.load(zoo.checkpoint(name), backend="torch", device="cuda", precision="fp32")
    ids, mask = prompt_batch(CASES[name], (7, 3, 5))
    expected = eager.generate(ids, attention_mask=mask, max_new_tokens=12)
    for _ in range(3):
        assert_same_tokens(model.generate(ids, attention_mask=mask, max_new_tokens=12), expected)
    assert model.backend.recorded.stats.replayed > 0


def test_bad_engine_settings_are_one_line(zoo):
    from hotrod.errors import HotrodError
    from hotrod.runtime.static import EngineOptions, prepare

    with pytest.raises(HotrodError, match="unknown torch precision 'int3'"):
        hotrod.load(zoo.checkpoint("gpt2"), backend="torch", static=True, precision="int3")
    with pytest.raises(HotrodError, match="graphs must be >= 0"):
        EngineOptions(device="cpu", graphs=-1)
    with pytest.raises(HotrodError, match="keep_fp32 names 'no.such.module'"):
        prepare(torch.nn.Linear(2, 2), EngineOptions(device="cpu", precision="fp16", keep_fp32=("no.such.module",)))


def _ops_per_step(model, case_name) -> Counter:
    """The torch ops one more decoding step adds (each a kernel launch on a GPU, views aside)."""
    ids, mask = prompt_batch(CASES[case_name], (7,))

    def ops(new_tokens: int) -> Counter:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            model.generate(ids, attention_mask=mask, min_new_tokens=new_tokens, max_new_tokens=new_tokens)
        return Counter(e.name for e in prof.events()
                       if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))

    model.generate(ids, attention_mask=mask, max_new_tokens=3)
    return ops(3) - ops(2)


@pytest.mark.parametrize("name", ["gpt2", "t5_v1_1"])
def test_a_half_precision_step_builds_its_mask_once_and_fuses_what_it_can(zoo, name):
    model = hotrod.load(zoo.checkpoint(name), backend="torch", static=True, precision="bf16")
    layers = getattr(model.config, "num_decoder_layers", None) or model.config.num_hidden_layers
    ops = _ops_per_step(model, name)
    # positions and keys once a step, not once a layer (T5's position bias takes two more)
    assert ops["aten::arange"] <= (2 if name == "gpt2" else 4)
    if name == "gpt2":
        assert ops["aten::addmm"] == 4 * layers  # the bias inside each product
        assert ops["aten::gelu"] == layers and ops["aten::tanh"] == 0  # gelu_new as one kernel
    else:
        assert ops["aten::rms_norm"] == 3 * layers + 1 and ops["aten::pow"] == 0
        assert ops["aten::gelu"] == layers
