"""W10 (translation, Marian's shape) and W11 (summarization, BART-large-cnn's shape) through the harness on
tiny stand-ins of the same families: every case runs (greedy, beam 4, a batch of unequal sources), every
system is told the same search and at fp32 gives PyTorch's tokens, and the full-size definitions are the
ones benchmarks/WORKLOADS.md states."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from hotrod.bench import ct2, harness, openvino_peer, peers, workloads
from hotrod.bench.case import BEAM_SEARCH, Case
from tests.bench.test_head_workloads import run_bench

# Wider weights than the default 0.02 (as the test zoo's BART-like cases): the tiny models' logits lie far
# apart, so the systems' rounding does not flip a token.
TINY = {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 2,
        "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 64,
        "init_std": 0.3}
TINY_VOCAB = 91  # Marian's pad (and decoder start) is its last id


def _tiny(config, model_class, **changes):
    return model_class(type(config)(**{**config.to_dict(), **TINY, **changes}))


def _tiny_marian():
    return _tiny(workloads.marian_en_de_config(), transformers.MarianMTModel, vocab_size=TINY_VOCAB,
                 decoder_vocab_size=TINY_VOCAB, pad_token_id=TINY_VOCAB - 1, decoder_start_token_id=TINY_VOCAB - 1)


def _tiny_bart():
    return _tiny(workloads.bart_large_cnn_config(), transformers.BartForConditionalGeneration, vocab_size=90)


@pytest.fixture
def tiny_workloads(monkeypatch, tmp_path, no_floor_measurement, short_settle):
    """W10 and W11 as defined (their cases, beams and search), on tiny models, short rows and few new tokens."""
    monkeypatch.setenv("HOTROD_CACHE", str(tmp_path / "cache"))
    w10, w11 = workloads.WORKLOADS["W10"], workloads.WORKLOADS["W11"]
    shapes = tuple(dataclasses.replace(s, lengths=tuple(max(2, n // 6) for n in s.lengths[:5])) for s in w10.shapes)
    tiny = {"W10": dataclasses.replace(w10, build=_tiny_marian, new_tokens=5, shapes=shapes),
            "W11": dataclasses.replace(w11, build=_tiny_bart, lengths=(24,), new_tokens=5)}
    monkeypatch.setattr(harness, "WORKLOADS", {**workloads.WORKLOADS, **tiny})


def test_w10_runs_greedy_beam_and_a_batch_beside_ctranslate2(tiny_workloads, tmp_path):
    results = run_bench(tmp_path, "W10", "ctranslate2", "fp32,int8")
    assert [(r["case"]["name"], r["case"]["num_beams"]) for r in results] == [
        ("W10-greedy", 1), ("W10-beam4", 4), ("W10-b16", 1)]
    assert len(results[2]["case"]["lengths"]) == 5 and len(set(results[2]["case"]["lengths"])) > 1
    for result in results:
        systems = result["systems"]
        assert set(systems) == {"pytorch", "hotrod fp32", "hotrod int8", "ctranslate2 fp32", "ctranslate2 int8"}, \
            result["skipped"]
        assert systems["hotrod fp32"]["agreement"] == 1.0
        assert systems["ctranslate2 fp32"]["agreement"] > 0.99  # the same weights, ids and search: its tokens
        assert systems["ctranslate2 int8"]["compute_type"] == "int8_float32"  # CTranslate2's int8 on the CPU
        assert all(0.0 <= f["agreement"] <= 1.0 and f["tokens_per_s"] > 0 for f in systems.values())


def test_w11_beam_search_beside_ctranslate2(tiny_workloads, tmp_path):
    [result] = run_bench(tmp_path, "W11", "ctranslate2", "fp32")
    assert result["case"]["name"] == "W11" and result["case"]["num_beams"] == 4
    systems = result["systems"]
    assert systems["hotrod fp32"]["agreement"] == 1.0 and systems["ctranslate2 fp32"]["agreement"] > 0.99
    assert "beam 4" in (tmp_path / "bench" / "report.md").read_text()


_OPENVINO = openvino_peer.problem("cpu")


@pytest.mark.skipif(_OPENVINO is not None, reason=f"OpenVINO's environment is not here: {_OPENVINO}")
def test_w11_runs_on_openvino_with_the_same_beams(tiny_workloads, tmp_path):
    """optimum-intel's OVModelForSeq2SeqLM searches with the case's beams (its int4 needs wider rows than
    the tiny model's, so only its int8 is asked to answer)."""
    [result] = run_bench(tmp_path, "W11", "openvino", "fp32")
    assert 0.0 <= result["systems"]["openvino int8"]["agreement"] <= 1.0, result["skipped"]


def test_full_size_definitions():
    w10, w11 = workloads.WORKLOADS["W10"], workloads.WORKLOADS["W11"]
    assert w10.new_tokens == 48 and w11.new_tokens == 64 and w11.lengths == (512,) and w11.num_beams == 4
    assert [(s.suffix, s.num_beams) for s in w10.shapes] == [("greedy", 1), ("beam4", 4), ("b16", 1)]
    assert w10.shapes[0].lengths == w10.shapes[1].lengths == (32,)
    batch = w10.shapes[2].lengths
    assert len(batch) == 16 and all(8 <= n <= 64 for n in batch) and batch == workloads._w10_lengths()
    marian = workloads.marian_en_de_config()
    assert (marian.d_model, marian.encoder_layers, marian.decoder_layers, marian.encoder_attention_heads,
            marian.encoder_ffn_dim, marian.vocab_size) == (512, 6, 6, 8, 2048, 58101)
    assert (marian.pad_token_id, marian.decoder_start_token_id, marian.eos_token_id) == (58100, 58100, 0)
    assert marian.activation_function == "swish" and marian.scale_embedding and marian.share_encoder_decoder_embeddings
    bart = workloads.bart_large_cnn_config()
    assert (bart.d_model, bart.encoder_layers, bart.decoder_layers, bart.encoder_attention_heads,
            bart.encoder_ffn_dim, bart.vocab_size, bart.max_position_embeddings) == (1024, 12, 12, 16, 4096, 50264, 1024)
    for config in (marian, bart):  # what the saved checkpoint's generation config will hold: no search settings
        generation = transformers.GenerationConfig.from_model_config(config)
        assert generation.forced_eos_token_id is None and generation.forced_bos_token_id is None
        assert not generation.no_repeat_ngram_size and generation.length_penalty in (None, 1.0)
        assert generation.num_beams in (None, 1) and not generation.bad_words_ids


def test_every_system_is_told_the_same_search():
    greedy = Case("c", "src", "seq2seq", (4,), 6)
    assert greedy.generate_kwargs() == {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False, "num_beams": 1}
    beams = dataclasses.replace(greedy, num_beams=4).generate_kwargs()
    assert beams == {**greedy.generate_kwargs(), "num_beams": 4, **BEAM_SEARCH}
    assert ct2.search_options(beams) == {"beam_size": 4, "length_penalty": 1.0, "no_repeat_ngram_size": 0}
    assert ct2.search_options(greedy.generate_kwargs())["beam_size"] == 1


def test_a_pad_id_past_the_specials_is_never_a_source_token():
    case = Case("c", "src", "seq2seq", (40, 30, 35))
    ids, mask = case.inputs(6, pad=5)
    assert not (ids[mask.bool()] == 5).any() and (ids[mask.bool()] == 4).any()
    plain = case.inputs(6)
    for pad in (None, 0, 1):  # pads among the first ids are never drawn: the rows stay as they were
        assert all(torch.equal(a, b) for a, b in zip(case.inputs(6, pad=pad), plain))


def test_llamacpp_refuses_a_beam_case_in_one_line():
    case = Case("c", "src", "decoder", (4,), 2, num_beams=4)
    ids, mask = case.inputs(10)
    with pytest.raises(ValueError, match="greedy"):
        peers.builders("llamacpp", case, ids, mask, "cpu", 1)["llama.cpp Q8_0"]()
