"""Resolving generation arguments as transformers does: precedence, lengths, defaults and refusals."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GenerationConfig

import hotrod
from hotrod.generation.config import MAX_NEW_TOKENS_CAP, merge, resolve
from tests.zoo import CASES, assert_same_tokens, load_on, prompt_batch


def resolved(prompt_length: int = 5, max_positions: int | None = None, model=None, user=None, **kwargs):
    return resolve(merge(model, user, kwargs), prompt_length, max_positions)


def test_defaults_are_transformers_defaults():
    s = resolved(max_new_tokens=1)
    assert (s.num_beams, s.do_sample, s.top_k, s.top_p, s.temperature, s.repetition_penalty, s.length_penalty) == (
        1, False, 50, 1.0, 1.0, 1.0, 1.0)


def test_max_new_tokens_wins_over_max_length():
    assert resolved(max_length=9, max_new_tokens=3).max_length == 5 + 3


def test_max_length_counts_the_prompt():
    assert resolved(max_length=9).max_length == 9


def test_precedence_model_config_then_user_config_then_kwargs():
    model = GenerationConfig(num_beams=2, top_k=7, max_new_tokens=4)
    user = GenerationConfig(num_beams=3)
    s = resolved(model=model, user=user, max_new_tokens=6)
    assert (s.num_beams, s.top_k, s.max_length) == (3, 7, 5 + 6)


def test_a_keyword_argument_none_turns_the_setting_off_as_in_transformers():
    model = GenerationConfig(top_k=7, top_p=0.5, temperature=0.7, repetition_penalty=1.3, eos_token_id=3,
                             num_beams=2, max_new_tokens=4)
    s = resolved(model=model, top_k=None, top_p=None, temperature=None, repetition_penalty=None, eos_token_id=None,
                 num_beams=None, max_new_tokens=None)
    assert (s.top_k, s.top_p, s.temperature, s.repetition_penalty, s.eos_token_ids, s.num_beams) == (
        0, 1.0, 1.0, 1.0, (), 1)
    assert s.max_length == 5 + 20  # no length set anywhere now: transformers' 20 new tokens


def test_pad_defaults_to_the_first_eos():
    s = resolved(eos_token_id=[7, 8])
    assert (s.eos_token_ids, s.pad_token_id) == ((7, 8), 7)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
    (dict(max_new_tokens=-3), "max_new_tokens must be >= 1"),
    (dict(max_new_tokens=2.5), "max_new_tokens must be an integer"),
    (dict(max_new_tokens=True), "max_new_tokens must be an integer"),
    (dict(max_new_tokens=MAX_NEW_TOKENS_CAP + 1), "beyond the limit"),
    (dict(max_length=5), "leaves no room"),
    (dict(max_length=5 + MAX_NEW_TOKENS_CAP + 1), "beyond the limit"),
    (dict(num_beams=0), "num_beams must be >= 1"),
    (dict(top_p=0.0), "top_p must be in"),
    (dict(top_p=1.5), "top_p must be in"),
    (dict(top_k=-1), "top_k must be >= 0"),
    (dict(do_sample=True, temperature=0.0), "temperature must be > 0"),
    (dict(do_sample=True, temperature=1e-300), "temperature must be at least"),  # NaN in the draw
    (dict(do_sample=True, temperature=float("inf")), "temperature must be a finite number"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be >= 0.0001"),
    (dict(repetition_penalty=1e-39), "repetition_penalty must be >= 0.0001"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty must be a finite number"),
    (dict(length_penalty=float("nan")), "length_penalty must be a finite number"),
    (dict(early_stopping="sometimes"), "early_stopping must be"),
    (dict(num_return_sequences=3, num_beams=2), "must not exceed num_beams"),
    (dict(min_new_tokens=-1), "min_new_tokens must be >= 0"),
])
def test_bad_values_are_refused(kwargs, message):
    with pytest.raises(hotrod.HotrodError, match=message):
        resolved(**kwargs)


@pytest.mark.parametrize("name, value", [("eos_token_id", 100), ("eos_token_id", -1), ("eos_token_id", [3, 250]),
                                         ("eos_token_id", "2"), ("eos_token_id", True), ("pad_token_id", 100),
                                         ("decoder_start_token_id", -3), ("pad_token_id", 2.0)])
def test_a_token_id_outside_the_vocabulary_is_refused(name, value):
    with pytest.raises(hotrod.HotrodError, match=rf"{name} .* is not a token id"):
        resolve(merge(None, None, {name: value, "max_new_tokens": 2}), 5, None, vocab_size=100)


def test_token_ids_may_be_numpy_integers():
    import numpy as np

    s = resolve(merge(None, None, {"eos_token_id": np.int64(0), "pad_token_id": np.int32(7), "max_new_tokens": 2}),
                5, None, 100)
    assert (s.eos_token_ids, s.pad_token_id) == ((0,), 7) and type(s.eos_token_ids[0]) is int
    assert resolve(merge(None, None, {"eos_token_id": [np.int64(5), 99], "max_new_tokens": 2}), 5, None,
                   100).eos_token_ids == (5, 99)


def test_positions_limit_counts_prompt_and_new_tokens():
    assert resolved(prompt_length=60, max_positions=64, max_new_tokens=4).max_length == 64
    with pytest.raises(hotrod.HotrodError, match="exceeds the model's 64 positions"):
        resolved(prompt_length=60, max_positions=64, max_new_tokens=5)


def test_unknown_argument_is_refused_by_name():
    with pytest.raises(hotrod.HotrodError, match="unknown argument 'no_such_option'"):
        merge(None, None, {"no_such_option": 1})


@pytest.mark.parametrize("kwargs", [dict(return_dict_in_generate=True), dict(output_scores=True),
                                    dict(use_cache=False)])
def test_unsupported_output_options_are_refused(kwargs):
    with pytest.raises(hotrod.HotrodError, match="does not support"):
        merge(None, None, kwargs)


@pytest.mark.parametrize("config, message", [
    ({"max_new_tokens": 2}, "generation_config must be a transformers GenerationConfig, got dict"),
    (GenerationConfig(return_dict_in_generate=True, output_scores=True), "return_dict_in_generate=True"),
    (GenerationConfig(max_time=0.0), "max_time=0.0, which hotrod does not support"),
    (GenerationConfig(stop_strings=["x"]), "stop_strings"),
    (GenerationConfig(dola_layers="low"), "dola_layers"),
    (GenerationConfig(token_healing=True), "token_healing"),
])
def test_a_callers_generation_config_is_read_whole_or_refused(config, message):
    with pytest.raises(hotrod.HotrodError, match=message):
        merge(None, config, {})


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=[1]), "temperature must be a finite number"),
    (dict(top_p="0.5"), "top_p must be a finite number"),
    (dict(repetition_penalty={}), "repetition_penalty must be a finite number"),
    (dict(do_sample="no"), "do_sample must be true or false"),
    (dict(max_time=1.0), "max_time=1.0, which hotrod does not support"),
])
def test_values_of_the_wrong_type_are_refused_in_one_line(kwargs, message):
    with pytest.raises(hotrod.HotrodError, match=message):
        resolved(**kwargs)


def test_compatible_output_options_are_accepted():
    values = merge(None, None, dict(use_cache=True, return_dict_in_generate=False, output_scores=False))
    assert "use_cache" not in values


# -- through a model, against transformers ----------------------------------------------------------


@pytest.fixture
def prompt():
    return prompt_batch(CASES["gpt2"], (5, 3))


@pytest.mark.parametrize("kwargs", [dict(max_length=9), dict(max_length=9, max_new_tokens=3), {}],
                         ids=["max_length", "max_new_tokens_wins", "default_max_length"])
def test_lengths_match_transformers(zoo, lm_case, backend, kwargs):
    ids, mask = prompt_batch(CASES[lm_case], (5, 3))
    expected = zoo.hf_generate(lm_case, ids, mask, **kwargs)
    assert_same_tokens(zoo.model(lm_case, backend).generate(ids, attention_mask=mask, **kwargs), expected)


def test_generation_config_object_is_accepted_and_kwargs_override_it(zoo, backend, prompt):
    ids, mask = prompt
    model = zoo.model("gpt2", backend)
    config = GenerationConfig(num_beams=3, max_new_tokens=4)
    expected = model.generate(ids, attention_mask=mask, num_beams=3, max_new_tokens=4)
    assert_same_tokens(model.generate(ids, attention_mask=mask, generation_config=config), expected)
    assert model.generate(ids, attention_mask=mask, generation_config=config, max_new_tokens=2).shape[1] == 5 + 2
    assert config.max_new_tokens == 4, "the caller's GenerationConfig was modified"


def test_unknown_generate_kwarg_is_refused(zoo, backend, prompt):
    with pytest.raises(hotrod.HotrodError, match="unknown argument 'frobnicate'"):
        zoo.model("gpt2", backend).generate(prompt[0], frobnicate=True)


def test_model_generation_config_is_not_changed_by_a_call(zoo, backend, prompt):
    model = zoo.model("gpt2", backend)
    before = model.generation_config.to_dict()
    model.generate(prompt[0], attention_mask=prompt[1], num_beams=2, max_new_tokens=2)
    assert model.generation_config.to_dict() == before


def test_generation_config_json_of_the_checkpoint_is_honoured(zoo, backend, tmp_path):
    """Defaults written into the checkpoint's generation_config.json apply, as in transformers."""
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    GenerationConfig(bos_token_id=0, eos_token_id=0, num_beams=3, max_new_tokens=5, repetition_penalty=1.4,
                     length_penalty=0.5).save_pretrained(source)
    ids, mask = prompt_batch(CASES["gpt2"], (5, 3))
    reference = CASES["gpt2"].hf_class.from_pretrained(source).eval()
    with torch.no_grad():
        expected = reference.generate(ids, attention_mask=mask)
    model = load_on(hotrod.optimize(source, tmp_path / "art", progress=False) if backend == "onnxruntime"
                    else source, backend)
    assert_same_tokens(model.generate(ids, attention_mask=mask), expected)


def test_generation_settings_kept_in_config_json_apply(zoo, backend, tmp_path):
    """An older checkpoint without generation_config.json keeps its settings in config.json; transformers
    reads them from there, and so does hotrod (and the artifact records them)."""
    source = zoo.copy_checkpoint("bart", tmp_path / "ckpt")
    (source / "generation_config.json").unlink(missing_ok=True)
    config = json.loads((source / "config.json").read_text())
    settings = dict(num_beams=3, max_length=9, min_length=4, no_repeat_ngram_size=2)
    (source / "config.json").write_text(json.dumps({**config, **settings}))
    ids, mask = prompt_batch(CASES["bart"], (5, 3))
    reference = CASES["bart"].hf_class.from_pretrained(source).eval()
    with torch.no_grad():
        expected = reference.generate(ids, attention_mask=mask)
    assert expected.shape[1] == 9
    model = load_on(hotrod.optimize(source, tmp_path / "art", progress=False) if backend == "onnxruntime"
                    else source, backend)
    assert {k: getattr(model.generation_config, k) for k in settings} == settings
    assert_same_tokens(model.generate(ids, attention_mask=mask), expected)


def test_eos_none_decodes_past_the_models_eos_as_transformers(zoo, backend, tmp_path):
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    ids, mask = prompt_batch(CASES["gpt2"], (5, 3))
    reference = CASES["gpt2"].hf_class.from_pretrained(source).eval()
    with torch.no_grad():
        first = int(reference.generate(ids, attention_mask=mask, max_new_tokens=1)[0, -1])
    settings = json.loads((source / "generation_config.json").read_text())
    (source / "generation_config.json").write_text(json.dumps({**settings, "eos_token_id": first}))
    reference = CASES["gpt2"].hf_class.from_pretrained(source).eval()
    model = load_on(hotrod.optimize(source, tmp_path / "art", progress=False) if backend == "onnxruntime"
                    else source, backend)
    for kwargs in ({}, {"eos_token_id": None}):
        with torch.no_grad():
            expected = reference.generate(ids, attention_mask=mask, max_new_tokens=6, **kwargs)
        assert_same_tokens(model.generate(ids, attention_mask=mask, max_new_tokens=6, **kwargs), expected)


def test_a_seq2seq_start_falls_back_to_bos_as_in_transformers(zoo, tmp_path):
    source = zoo.copy_checkpoint("t5", tmp_path / "ckpt")
    for name in ("config.json", "generation_config.json"):
        settings = json.loads((source / name).read_text())
        settings.pop("decoder_start_token_id", None)
        (source / name).write_text(json.dumps({**settings, "bos_token_id": 1}))
    ids, mask = prompt_batch(CASES["t5"], (5, 3))
    reference = CASES["t5"].hf_class.from_pretrained(source).eval()
    with torch.no_grad():
        expected = reference.generate(ids, attention_mask=mask, max_new_tokens=3)
    assert (expected[:, 0] == 1).all()
    assert_same_tokens(load_on(source, "torch").generate(ids, attention_mask=mask, max_new_tokens=3), expected)


UNSUPPORTED = {  # generation_config.json settings, given a token the plain greedy output starts with
    "no_repeat_ngram_size": lambda token: dict(no_repeat_ngram_size=1),
    "bad_words_ids": lambda token: dict(bad_words_ids=[[token]]),
    "suppress_tokens": lambda token: dict(suppress_tokens=[token]),
    "begin_suppress_tokens": lambda token: dict(begin_suppress_tokens=[token]),
    "forced_eos_token_id": lambda token: dict(forced_eos_token_id=token),
}


@pytest.mark.parametrize("setting", list(UNSUPPORTED))
def test_unsupported_generation_config_is_not_silently_ignored(zoo, tmp_path, setting):
    """A checkpoint asking for a processor hotrod lacks must give transformers' tokens or a clear error."""
    ids, mask = prompt_batch(CASES["gpt2"], (5, 3))
    plain = zoo.hf_generate("gpt2", ids, mask, max_new_tokens=8)
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    GenerationConfig(bos_token_id=0, eos_token_id=0, max_new_tokens=8,
                     **UNSUPPORTED[setting](int(plain[0, 5]))).save_pretrained(source)
    reference = CASES["gpt2"].hf_class.from_pretrained(source).eval()
    with torch.no_grad():
        expected = reference.generate(ids, attention_mask=mask)
    assert not torch.equal(expected, plain), "the setting should change transformers' output"
    model = hotrod.load(source, backend="torch")
    try:
        actual = model.generate(ids, attention_mask=mask)
    except hotrod.HotrodError:
        return
    assert_same_tokens(actual, expected)


def test_a_generation_config_passed_second_is_the_config_as_in_transformers(zoo):
    """transformers' generate(inputs, generation_config, ..., attention_mask=): the config second, the mask by
    name; a mask given second is refused in one line saying so."""
    model = zoo.model("gpt2", "torch")
    ids = torch.tensor([[5, 6, 7, 8]])
    config = GenerationConfig(max_new_tokens=3, do_sample=False, pad_token_id=0)
    positional = model.generate(ids, config)
    assert torch.equal(positional, model.generate(ids, generation_config=config))
    assert torch.equal(positional, zoo.reference("gpt2").generate(ids, config))
    assert positional.shape[1] == ids.shape[1] + 3
    mask = torch.ones_like(ids)
    assert torch.equal(model.generate(ids, config, attention_mask=mask), positional)  # the mask by name, as there
    with pytest.raises(hotrod.HotrodError, match="got Tensor .*pass a mask as attention_mask="):
        model.generate(ids, mask)
