"""llama.cpp as a peer: the GGUF file hotrod writes, and llama.cpp's answers on it against transformers'.

The file itself is checked with gguf alone; running it needs llama-cpp-python (`make test-peers`
installs it), and those tests skip with that reason where it is absent.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import transformers

from hotrod.bench import gguf_file
from hotrod.bench.case import Case
from hotrod.kinds import spec as kind_spec
from tests.zoo import CASES

gguf = pytest.importorskip("gguf")
needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                 reason="llama-cpp-python is not installed (make test-peers installs it)")
SUPPORTED = ["gpt2", "t5", "mt5", "bert"]


def _model(zoo, name: str):
    kind = CASES[name].kind
    return getattr(transformers, kind_spec(kind).auto_class).from_pretrained(zoo.checkpoint(name)).eval()


@pytest.mark.parametrize("name", SUPPORTED)
def test_every_weight_is_written_under_gguf_names(zoo, tmp_path, name):
    model = _model(zoo, name)
    path = tmp_path / "model.gguf"
    gguf_file.write(model, path)
    reader = gguf.GGUFReader(str(path))
    names = {tensor.name for tensor in reader.tensors}
    assert "token_embd.weight" in names and all(not n.startswith(("transformer.", "encoder.layer")) for n in names)
    tied = model.config.tie_word_embeddings
    assert ("output.weight" in names) == (not tied and name != "bert")  # a tied head reuses the embedding
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    assert arch == {"gpt2": "gpt2", "bert": "bert"}.get(CASES[name].model_type, "t5")


def test_gpt2_conv1d_weights_are_stored_out_by_in(zoo, tmp_path):
    model = _model(zoo, "gpt2")
    gguf_file.write(model, tmp_path / "model.gguf")
    tensors = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "model.gguf")).tensors}
    c_fc = model.transformer.h[0].mlp.c_fc.weight  # Conv1D: [in, out]
    written = torch.from_numpy(tensors["blk.0.ffn_up.weight"].data.copy())
    assert torch.equal(written, c_fc.detach().t())


def test_a_t5_decoder_deeper_than_its_encoder_is_refused_with_the_reason(zoo, tmp_path):
    with pytest.raises(ValueError, match="decoder of 3 layers over an encoder of 2"):
        gguf_file.write(_model(zoo, "t5_v1_1"), tmp_path / "model.gguf")


def test_a_family_llama_cpp_has_no_layout_for_is_one_line(zoo, tmp_path):
    with pytest.raises(ValueError, match="no GGUF layout for model_type 'roberta'"):
        gguf_file.write(_model(zoo, "roberta"), tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


def _case(zoo, name: str, lengths=(6,), new_tokens: int = 5) -> Case:
    kind = CASES[name].kind
    return Case(name, str(zoo.checkpoint(name)), kind, lengths, 0 if kind == "encoder" else new_tokens)


@needs_llama
@pytest.mark.parametrize("name", ["gpt2", "t5", "mt5"])
def test_f32_tokens_are_transformers_tokens(zoo, name):
    from hotrod.bench import llamacpp
    from hotrod.bench.runners import pytorch_runner

    case = _case(zoo, name)
    model = _model(zoo, name)
    ids, mask = case.inputs(model.config.vocab_size)
    runner = llamacpp.Runner(llamacpp.quantized(case.source, case.kind, "F32", 1), case, ids, mask, 1)
    expected = pytorch_runner(model, case.kind, ids, mask, case.generate_kwargs())()
    assert torch.equal(runner.call(), expected)
    assert torch.equal(runner.call(), expected)  # a second call starts from a cleared cache
    assert runner.generate(1).shape[1] == expected.shape[1] - case.new_tokens + 1


@needs_llama
def test_f32_hidden_states_of_a_padding_free_batch_are_transformers(zoo):
    from hotrod.bench import llamacpp

    case = _case(zoo, "bert", lengths=(7, 3, 5))
    model = _model(zoo, "bert")
    ids, mask = case.inputs(model.config.vocab_size)
    runner = llamacpp.Runner(llamacpp.quantized(case.source, case.kind, "F32", 1), case, ids, mask, 1)
    ours = runner.call()
    with torch.inference_mode():
        theirs = model(input_ids=ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    assert torch.allclose(ours[keep], theirs[keep], atol=1e-3)
    assert torch.count_nonzero(ours[~keep]) == 0


@needs_llama
def test_bench_times_each_format_and_skips_batched_generation_with_its_reason(zoo, tmp_path, bench_peer):
    single, batched = bench_peer(zoo.checkpoint("gpt2"), tmp_path / "bench", "llamacpp", "--batch", "1,2", "--seq",
                                 "4", "--new-tokens", "2")
    assert {"llama.cpp Q8_0", "llama.cpp Q4_0", "llama.cpp Q4_K_M"} <= set(single["systems"])
    assert single["systems"]["llama.cpp Q8_0"]["format"] == "Q8_0"
    assert single["systems"]["llama.cpp Q4_0"]["precision"] == "int4"  # held to hotrod int4's floor
    assert "batch 1" in batched["skipped"]["llama.cpp Q4_0"]
