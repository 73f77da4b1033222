"""The GPU form of in-place attention: built for cuda, run here on onnxruntime's CPU provider.

Both forms share one graph contract, so the decoding loop, the server's slots and the cache buffers
are the same code; these tests check that the rewritten graph computes what GroupQueryAttention does,
that it still writes the cache buffers in place, and that a CPU build is refused on a GPU.
"""

from __future__ import annotations

import dataclasses
import json

import onnx
import onnxruntime as ort
import pytest
import torch

import hotrod
from hotrod.serve.messages import Params
from hotrod.serve.runner import GenerationRunner
from hotrod.source import cache_dir
from tests.zoo import CASES, LM_CASES, assert_same_tokens, build_checkpoint, prompt_batch

DECODERS = [name for name, case in CASES.items() if case.kind == "decoder"]


@pytest.fixture(scope="module", params=LM_CASES)
def built(request, zoo, tmp_path_factory):
    """(case name, the CPU artifact, the same checkpoint built for cuda)."""
    out = tmp_path_factory.mktemp("portable") / request.param
    hotrod.optimize(zoo.checkpoint(request.param), out, device="cuda", progress=False, verify_examples=4)
    return request.param, zoo.artifact(request.param), out


def _decoder(artifact) -> onnx.ModelProto:
    return onnx.load(str(artifact / "decoder.onnx"))


def _ops(artifact) -> list[str]:
    return [node.op_type for node in _decoder(artifact).graph.node]


def test_gpu_build_has_no_in_place_kernel_and_writes_the_cache_in_place(built):
    _, cpu, gpu = built
    model = _decoder(gpu)
    ops, cpu_ops = _ops(gpu), _ops(cpu)
    assert "GroupQueryAttention" not in ops and cpu_ops.count("GroupQueryAttention")
    attention = cpu_ops.count("GroupQueryAttention") + cpu_ops.count("MultiHeadAttention")
    assert ops.count("MultiHeadAttention") == attention
    assert ops.count("ScatterND") == 2 * cpu_ops.count("GroupQueryAttention")
    inputs = {i.name for i in model.graph.input}
    outputs = {o.name for o in model.graph.output}
    for node in (n for n in model.graph.node if n.op_type == "ScatterND"):
        # past in, present out, nothing between: the buffer bound to both is updated where it lies
        assert node.input[0].startswith("past_key_values.") and node.input[0] in inputs
        assert node.output[0].startswith("present.") and node.output[0] in outputs
        assert node.input[0].removeprefix("past_key_values.") == node.output[0].removeprefix("present.")
    fused = json.loads((gpu / "manifest.json").read_text())["graphs"]["decoder"]["fused_ops"]
    assert fused.get("MultiHeadAttention") == attention and "GroupQueryAttention" not in fused


def test_gpu_build_generates_what_the_cpu_build_does(built):
    name, cpu, gpu = built
    ids, mask = prompt_batch(CASES[name], (3, 7, 1, 5))
    kwargs = {"attention_mask": mask, "max_new_tokens": 9, "do_sample": False}
    expected = hotrod.load(cpu).generate(ids, **kwargs)
    assert_same_tokens(hotrod.load(gpu, device="cpu").generate(ids, **kwargs), expected)


def test_gpu_build_forward_matches_the_cpu_build(built):
    name, cpu, gpu = built
    ids, mask = prompt_batch(CASES[name], (6, 2, 4))
    extra = {"decoder_input_ids": ids[:, :3]} if CASES[name].kind == "seq2seq" else {}
    expected = hotrod.load(cpu)(ids, attention_mask=mask, **extra).logits
    actual = hotrod.load(gpu, device="cpu")(ids, attention_mask=mask, **extra).logits
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


def test_gpu_build_serves_rows_of_different_ages_in_one_batch(built):
    """A row that takes a free slot in a running batch (`place`) decodes as it would alone."""
    name, _, gpu = built
    model = hotrod.load(gpu, device="cpu")
    settings = GenerationRunner(model).options([1], Params(max_new_tokens=20)).settings
    ids, mask = prompt_batch(CASES[name], (4, 6))
    running = model.decoding_state(settings)
    _, logits = running.start(ids, mask, 1)
    tokens = logits.argmax(-1)
    for _ in range(3):
        tokens = running.step(tokens).argmax(-1)
    running.release([0])
    newcomer = model.decoding_state(settings)
    late_ids, late_mask = prompt_batch(CASES[name], (5,), seed=1)
    _, late_logits = newcomer.start(late_ids, late_mask, 1)
    running.place(newcomer, [(0, 0)])
    late = [int(late_logits.argmax(-1))]
    for _ in range(4):
        step = running.step(torch.tensor([late[-1], int(tokens[1])]))
        late.append(int(step[0].argmax()))
        tokens = step.argmax(-1)
    alone = model.generate(late_ids, attention_mask=late_mask, max_new_tokens=5, do_sample=False, min_new_tokens=5)
    start = late_ids.shape[1] if model.kind == "decoder" else 1
    assert late == alone[0, start:].tolist()


def test_cpu_build_is_refused_on_a_gpu(zoo):  # the zoo's heads are 8 wide: its CPU builds hold the kernel
    for name in LM_CASES:
        with pytest.raises(hotrod.HotrodError, match=r"built for the CPU.*hotrod optimize --device cuda"):
            hotrod.load(zoo.artifact(name), device="cuda")


def test_a_checkpoint_loaded_for_a_gpu_is_exported_for_it(zoo):
    """`load(checkpoint, device=...)` exports for that device: what stops it here is the missing GPU
    provider, not a CPU build."""
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has onnxruntime's CUDA provider")
    with pytest.raises(hotrod.HotrodError, match="CUDAExecutionProvider"):
        hotrod.load(zoo.checkpoint(DECODERS[0]), device="cuda")
    [built] = [p for p in cache_dir().iterdir() if p.name.endswith("-fp32-cuda")]
    assert "GroupQueryAttention" not in {node.op_type for node in _decoder(built).graph.node}


def test_head_sizes_the_cpu_kernel_refuses_get_the_portable_form(zoo, tmp_path):
    """onnxruntime's CPU GroupQueryAttention takes only head sizes that are multiples of 8: a GPT-2 with
    heads of 6 is built in the portable form, and generates exactly as transformers does."""
    base = CASES[DECODERS[0]]
    config = base.config()
    config.n_embd, config.n_head = 24, 4
    case = dataclasses.replace(base, name="odd_heads", config=lambda: config)
    checkpoint = build_checkpoint(case, tmp_path / "checkpoint")
    out = hotrod.optimize(checkpoint, tmp_path / "art", progress=False, verify_examples=2)
    ops = {node.op_type for node in _decoder(out).graph.node}
    assert "GroupQueryAttention" not in ops and "ScatterND" in ops
    ids, mask = prompt_batch(case, (5, 2, 8))
    reference = case.hf_class.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        expected = reference.generate(ids, attention_mask=mask, max_new_tokens=7, do_sample=False)
    actual = hotrod.load(out).generate(ids, attention_mask=mask, max_new_tokens=7, do_sample=False)
    assert_same_tokens(actual, expected)
