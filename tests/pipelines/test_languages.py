"""Target languages resolved through the tokenizer as transformers' users resolve them, and what generate()
and `hotrod generate` make of them; every refusal is one line naming the code or the field.

The tokenizers are transformers' own classes built offline (mBART-50's and NLLB's build without files), or
one with M2M100's `__fr__` tokens (its own class needs sentencepiece); their language ids fall inside the
tiny zoo models' vocabulary, so generation is compared with transformers' at the same forced BOS.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

import hotrod
from hotrod.errors import HotrodError
from hotrod.pipelines.languages import forced_bos, language_token, languages
from tests.test_cli import assert_one_error_line, ok, run
from tests.zoo import VOCAB, assert_same_tokens

PROMPT = torch.tensor([[5, 9, 12, 40, 61, 2]])


def mbart50() -> transformers.PreTrainedTokenizerBase:
    return transformers.MBart50Tokenizer()  # its 52 codes at ids 5..56, `lang_code_to_id` as on the hub


def nllb(codes: tuple[str, ...] = ("eng_Latn", "fra_Latn", "deu_Latn")) -> transformers.PreTrainedTokenizerBase:
    return transformers.NllbTokenizer(extra_special_tokens=list(codes))  # codes at ids 5.. (all 202 without codes)


def m2m100_like(specials: tuple[str, ...] = ("__en__", "__fr__", "__de__")) -> transformers.PreTrainedTokenizerBase:
    """M2M100's layout: each language a special token `__code__` (its own tokenizer class needs sentencepiece)."""
    words = ["<s>", "<pad>", "</s>", "<unk>", "__en__", "__fr__", "__de__", "hello", "world"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>", pad_token="<pad>",
                                                additional_special_tokens=list(specials))


# -- the resolution ------------------------------------------------------------------------------------


def test_each_familys_codes_resolve_as_transformers_users_resolve_them():
    tokenizer = mbart50()
    assert language_token(tokenizer, "fr_XX") == tokenizer.lang_code_to_id["fr_XX"] == 12
    assert language_token(tokenizer, "de_DE") == tokenizer.convert_tokens_to_ids("de_DE") == 7
    tokenizer = nllb()
    assert language_token(tokenizer, "fra_Latn") == tokenizer.convert_tokens_to_ids("fra_Latn") == 6
    tokenizer = m2m100_like()  # get_lang_id("fr") is the token "__fr__"'s id
    assert language_token(tokenizer, "fr") == tokenizer.convert_tokens_to_ids("__fr__") == 5
    assert languages(tokenizer) == {"en": 4, "fr": 5, "de": 6}
    assert len(languages(mbart50())) == 52 and len(languages(transformers.NllbTokenizer())) == 202


def test_only_a_language_token_is_a_target():
    for code in ("</s>", "<s>", "hello", "fr", "__fr__", "FR_xx"):
        with pytest.raises(HotrodError, match=f"target_language: '{code}' is not a language of this model's "
                                              r"tokenizer \(it has ar_AR, cs_CZ, .* and 44 more\)"):
            language_token(mbart50(), code)
    with pytest.raises(HotrodError, match=r"'hello' is not a language .* \(it has en, fr, de\)"):
        language_token(m2m100_like(), "hello")


def test_a_tokenizer_without_language_tokens_is_refused_naming_the_field(zoo):
    plain = transformers.AutoTokenizer.from_pretrained(zoo.checkpoint("bart"))  # RoBERTa's specials only
    with pytest.raises(HotrodError, match="target_language: this model's tokenizer has no language tokens"):
        language_token(plain, "fr_XX")
    # "__x__"-shaped words of the vocabulary that are not special tokens are no languages either
    with pytest.raises(HotrodError, match="has no language tokens"):
        language_token(m2m100_like(specials=()), "fr")
    with pytest.raises(HotrodError, match="target_language: this model has no tokenizer"):
        language_token(None, "fr_XX")


@pytest.mark.parametrize("code", [5, "", None, ["fr_XX"]])
def test_a_code_that_is_no_string_is_refused(code):
    with pytest.raises(HotrodError, match="target_language: a language code is a non-empty string"):
        language_token(mbart50(), code)


def test_a_language_outside_the_models_vocabulary_is_refused():
    tokenizer = transformers.NllbTokenizer()  # 202 codes: zul_Latn is token 206
    assert language_token(tokenizer, "zul_Latn", vocab_size=207) == 206
    with pytest.raises(HotrodError, match=r"'zul_Latn' is token 206, outside the model's vocabulary \[0, 100\)"):
        language_token(tokenizer, "zul_Latn", vocab_size=VOCAB)


def test_a_code_and_a_different_forced_bos_are_refused():
    tokenizer = mbart50()
    assert forced_bos(tokenizer, None, 9) == 9 and forced_bos(tokenizer, None, None) is None
    assert forced_bos(tokenizer, "fr_XX", 12) == 12 == forced_bos(tokenizer, "fr_XX", None)
    with pytest.raises(HotrodError, match="'fr_XX' is token 12, but forced_bos_token_id is 9; give one of the two"):
        forced_bos(tokenizer, "fr_XX", 9)


# -- generate(target_language=...) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mbart_model(zoo):
    model = hotrod.load(zoo.checkpoint("mbart"), backend="torch")
    model.tokenizer = mbart50()
    return model


@pytest.mark.parametrize("code, token, beams", [("de_DE", 7, 1), ("fr_XX", 12, 3)])
def test_generate_with_a_target_language_is_transformers_with_its_forced_bos(zoo, mbart_model, code, token, beams):
    out = mbart_model.generate(PROMPT, max_new_tokens=6, num_beams=beams, target_language=code)
    assert out[0, 1] == token  # after the start token, the language
    assert_same_tokens(out, zoo.hf_generate("mbart", PROMPT, None, max_new_tokens=6, num_beams=beams,
                                            forced_bos_token_id=token))
    assert_same_tokens(out, mbart_model.generate(PROMPT, max_new_tokens=6, num_beams=beams, forced_bos_token_id=token))


def test_nllb_codes_on_an_m2m100_model(zoo):
    """NLLB-200 is an M2M100 model with NLLB's tokenizer; M2M100's own tokenizer names "fr" as "__fr__"."""
    model = hotrod.load(zoo.checkpoint("m2m_100"), backend="torch")
    for tokenizer, code, token in ((nllb(), "fra_Latn", 6), (m2m100_like(), "fr", 5)):
        model.tokenizer = tokenizer
        out = model.generate(PROMPT, max_new_tokens=5, target_language=code)
        assert out[0, 1] == token
        assert_same_tokens(out, zoo.hf_generate("m2m_100", PROMPT, None, max_new_tokens=5, forced_bos_token_id=token))


def test_generate_refuses_what_the_tokenizer_cannot_resolve(zoo, mbart_model):
    with pytest.raises(ValueError, match="target_language: 'xx_YY' is not a language"):
        mbart_model.generate(PROMPT, max_new_tokens=2, target_language="xx_YY")
    with pytest.raises(ValueError, match="'fr_XX' is token 12, but forced_bos_token_id is 7"):
        mbart_model.generate(PROMPT, max_new_tokens=2, target_language="fr_XX", forced_bos_token_id=7)
    plain = zoo.model("mbart", "torch")  # the zoo's RoBERTa-like tokenizer has no languages
    with pytest.raises(ValueError, match="target_language: this model's tokenizer has no language tokens"):
        plain.generate(PROMPT, max_new_tokens=2, target_language="fr_XX")
    # None names no language: the model's own forced BOS, as without the keyword
    assert_same_tokens(mbart_model.generate(PROMPT, max_new_tokens=3, target_language=None),
                       mbart_model.generate(PROMPT, max_new_tokens=3))


# -- hotrod generate --target-language ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def mbart50_checkpoint(zoo, tmp_path_factory):
    directory = tmp_path_factory.mktemp("mbart50") / "mbart50"
    shutil.copytree(zoo.checkpoint("mbart"), directory)
    mbart50().save_pretrained(directory)
    return directory


def test_the_command_takes_a_target_language(capsys, mbart50_checkpoint, mbart_model):
    ids = " ".join(map(str, PROMPT[0].tolist()))
    base = ("generate", mbart50_checkpoint, "--backend", "torch", "--max-new-tokens", 4, "--json")
    printed = json.loads(ok(capsys, *base, ids, "--ids", "--target-language", "de_DE"))
    assert printed[0]["token_ids"] == mbart_model.generate(PROMPT, max_new_tokens=4, forced_bos_token_id=7)[0].tolist()
    same = json.loads(ok(capsys, *base, ids, "--ids", "--forced-bos-token-id", 7))
    assert same == printed
    text = json.loads(ok(capsys, *base, "hello world", "--target-language", "fr_XX"))  # through the tokenizer
    assert text[0]["token_ids"][1] == 12


@pytest.mark.parametrize("flags, match", [
    (("--target-language", "xx_YY"), "target_language: 'xx_YY' is not a language of this model's tokenizer"),
    (("--target-language", "fr_XX", "--forced-bos-token-id", 7), "'fr_XX' is token 12, but forced_bos_token_id is 7"),
    (("--forced-bos-token-id", VOCAB), f"forced_bos_token_id {VOCAB} is not a token id"),
])
def test_the_command_refuses_in_one_line(capsys, mbart50_checkpoint, flags, match):
    assert_one_error_line(*run(capsys, "generate", mbart50_checkpoint, "--backend", "torch", "5 9 12", "--ids",
                               "--max-new-tokens", 2, *flags), 1, match)


def test_the_command_refuses_a_language_for_a_model_without_them(capsys, zoo):
    assert_one_error_line(*run(capsys, "generate", zoo.checkpoint("bart"), "--backend", "torch", "5 9", "--ids",
                               "--target-language", "fr_XX"), 1, "tokenizer has no language tokens")
