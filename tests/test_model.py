"""HotrodModel's input checks (every mistake is a HotrodError) and embed()."""

from __future__ import annotations

import pytest
import torch

import hotrod
from tests.zoo import CASES, HIDDEN, POSITIONS, VOCAB, prompt_batch


def ids(*values: int) -> torch.Tensor:
    return torch.tensor([values])


def prompt(length: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(0))


# Each entry: (model, how to call it, what the message says; None: any wording).
BAD_CALLS = {
    "empty_prompt": ("gpt2", lambda m: m.generate(torch.zeros(1, 0, dtype=torch.long)), "empty prompt"),
    "empty_batch": ("gpt2", lambda m: m.generate(torch.zeros(0, 3, dtype=torch.long)), "empty prompt"),
    "empty_list": ("gpt2", lambda m: m.generate([]), None),
    "no_input": ("gpt2", lambda m: m.generate(), "input_ids is required"),
    "prompt_too_long": ("gpt2", lambda m: m.generate(prompt(POSITIONS + 1), max_new_tokens=1),
                        f"longer than the model's {POSITIONS} positions"),
    "forward_too_long": ("gpt2", lambda m: m(input_ids=prompt(POSITIONS + 1)), "positions"),
    "prompt_plus_new_too_long": ("gpt2", lambda m: m.generate(prompt(POSITIONS - 4), max_new_tokens=5),
                                 "exceeds the model's"),
    "max_new_tokens_negative": ("gpt2", lambda m: m.generate(ids(5, 6), max_new_tokens=-1), "max_new_tokens"),
    "max_new_tokens_zero": ("gpt2", lambda m: m.generate(ids(5, 6), max_new_tokens=0), "max_new_tokens"),
    "max_new_tokens_absurd": ("t5", lambda m: m.generate(ids(5, 6), max_new_tokens=65537), "beyond the limit"),
    "num_beams_zero": ("gpt2", lambda m: m.generate(ids(5, 6), num_beams=0), "num_beams"),
    "top_p_zero": ("gpt2", lambda m: m.generate(ids(5, 6), do_sample=True, top_p=0.0), "top_p"),
    "top_p_above_one": ("gpt2", lambda m: m.generate(ids(5, 6), do_sample=True, top_p=1.5), "top_p"),
    "temperature_zero_sampling": ("gpt2", lambda m: m.generate(ids(5, 6), do_sample=True, temperature=0.0),
                                  "temperature"),
    "token_above_vocab": ("gpt2", lambda m: m.generate(ids(5, VOCAB)), f"token id {VOCAB} is outside"),
    "token_negative": ("t5", lambda m: m.generate(ids(5, -1)), "token id -1 is outside"),
    "decoder_token_above_vocab": ("t5", lambda m: m(input_ids=ids(5, 6), decoder_input_ids=ids(0, VOCAB + 5)),
                                  "outside the vocabulary"),
    "forward_token_above_vocab": ("bert", lambda m: m(input_ids=ids(5, VOCAB)), "outside the vocabulary"),
    "float_ids": ("gpt2", lambda m: m.generate(torch.tensor([[1.0, 2.0]])), "token ids"),
    "bool_ids": ("gpt2", lambda m: m.generate(torch.tensor([[True, False]])), "token ids"),
    "3d_ids": ("gpt2", lambda m: m.generate(torch.ones(1, 2, 3, dtype=torch.long)), "2-D"),
    "ragged_list": ("gpt2", lambda m: m.generate([[5, 6, 7], [8, 9]]), None),
    "text_instead_of_ids": ("gpt2", lambda m: m.generate("hello world"), None),
    "mask_shape": ("gpt2", lambda m: m.generate(ids(5, 6, 7), attention_mask=ids(1, 1)), "mask shape"),
    "token_type_beyond_the_table": ("bert", lambda m: m(input_ids=ids(5, 6), token_type_ids=ids(0, 2)),
                                    "token_type_ids holds 2, but this model takes token types 0 .. 1"),
    "token_type_of_a_single_type_model": ("roberta", lambda m: m(input_ids=ids(5, 6), token_type_ids=ids(1, 0)),
                                          "token_type_ids holds 1, but this model takes token type 0 only"),
    "token_type_without_a_table": ("modernbert", lambda m: m(input_ids=ids(5, 6), token_type_ids=ids(0, 1)),
                                   "token_type_ids holds 1"),
    "generate_on_encoder": ("bert", lambda m: m.generate(ids(5, 6)), "encoder"),
    "token_types_without_types": ("distilbert", lambda m: m(input_ids=ids(5, 6), token_type_ids=ids(0, 1)),
                                  "token_type_ids holds 1, but this model takes token type 0 only"),
    "seq2seq_forward_without_decoder_ids": ("t5", lambda m: m(input_ids=ids(5, 6)), "decoder_input_ids"),
    "encoder_forward_with_decoder_ids": ("bert", lambda m: m(input_ids=ids(5, 6), decoder_input_ids=ids(5)),
                                         "decoder_input_ids: this bert model runs as an encoder"),
    "forward_four_positional": ("t5", lambda m: m(ids(5, 6), ids(1, 1), ids(5), ids(5)), "by name"),
    "bart_head_third_positional": ("bart-mnli", lambda m: m(ids(5, 6), ids(1, 1), ids(2, 5)),
                                   "decoder_input_ids: this bart model runs as an encoder"),
    "decoder_third_positional": ("gpt2", lambda m: m(ids(5, 6), ids(1, 1), ids(0, 0)),
                                 "a decoder model's forward takes input_ids and attention_mask by position"),
    "forward_positional_and_named": ("bert", lambda m: m(ids(5, 6), ids(1, 1), ids(0, 0), token_type_ids=ids(0, 0)),
                                     "by name"),
    "token_types_of_a_decoder": ("gpt2", lambda m: m(input_ids=ids(5, 6), token_type_ids=ids(1, 1)),
                                 "token_type_ids: a decoder model's forward takes none"),
    "right_padded_prompt": ("gpt2", lambda m: m.generate(ids(5, 6, 7), attention_mask=ids(1, 1, 0)),
                            "attention_mask row 0 is padded on the right"),
    "inferred_right_padding": ("gpt2", lambda m: m.generate(ids(5, 6, 1), pad_token_id=1),
                               "attention_mask row 0 is padded on the right"),  # pad 1 differs from EOS 0
    "forward_option_it_lacks": ("bert", lambda m: m(input_ids=ids(5, 6), output_hidden_states=True),
                                "model\\(\\) does not support output_hidden_states="),
    "task_option_it_lacks": ("bert-cls", lambda m: m.classify("hello", truncation=True),
                             "classify\\(\\): got an unexpected keyword argument 'truncation'"),
    "mask_of_twos": ("gpt2", lambda m: m.generate(ids(5, 6), attention_mask=ids(2, 2)),
                     "attention_mask must hold only 0 and 1, got 2"),
    "mask_of_halves": ("bert", lambda m: m(input_ids=ids(5, 6), attention_mask=torch.tensor([[1.0, 0.5]])),
                       "attention_mask must hold only 0 and 1, got 0.5"),
}


@pytest.mark.parametrize("bad", list(BAD_CALLS))
def test_bad_input_raises_hotrod_error(zoo, backend, bad):
    name, call, message = BAD_CALLS[bad]
    with pytest.raises(hotrod.HotrodError, match=message):
        call(zoo.model(name, backend))


def test_hotrod_error_is_a_value_error():
    assert issubclass(hotrod.HotrodError, ValueError)


# -- embed ------------------------------------------------------------------------------------------

EMBEDDABLE = ["bert", "roberta", "modernbert", "t5"]  # encoders, and the encoder of a seq2seq model


def reference_hidden(zoo, name: str, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    reference = zoo.reference(name)
    encoder = reference.get_encoder() if CASES[name].kind == "seq2seq" else reference
    with torch.no_grad():
        return encoder(input_ids=ids, attention_mask=mask).last_hidden_state


def pooled(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    if pooling == "cls":
        return hidden[:, 0]
    weights = mask[:, :, None].float()
    return (hidden * weights).sum(1) / weights.sum(1)


def unpadded(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    return [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]


@pytest.mark.parametrize("pooling", ["mean", "cls"])
@pytest.mark.parametrize("name", EMBEDDABLE)
def test_embed_equals_pooled_transformers_hidden_states(zoo, backend, name, pooling):
    ids, mask = prompt_batch(CASES[name], (6, 2, 9, 4))
    expected = pooled(reference_hidden(zoo, name, ids, mask), mask, pooling)
    actual = zoo.model(name, backend).embed(unpadded(ids, mask), pooling=pooling, batch_size=3)
    assert actual.shape == (4, HIDDEN)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=0)


def test_embed_normalize_gives_unit_vectors_in_the_same_direction(zoo, encoder_case, backend):
    model = zoo.model(encoder_case, backend)
    rows = unpadded(*prompt_batch(CASES[encoder_case], (5, 3, 8)))
    raw, unit = model.embed(rows), model.embed(rows, normalize=True)
    torch.testing.assert_close(unit.norm(dim=-1), torch.ones(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(unit, raw / raw.norm(dim=-1, keepdim=True), atol=1e-5, rtol=0)


@pytest.mark.parametrize("batch_size", [1, 2, 32])
def test_embed_mixed_lengths_equal_one_by_one_in_order(zoo, encoder_case, backend, batch_size):
    model = zoo.model(encoder_case, backend)
    rows = unpadded(*prompt_batch(CASES[encoder_case], (9, 2, 6, 2, 12), seed=3))
    one_by_one = torch.cat([model.embed([row]) for row in rows])
    torch.testing.assert_close(model.embed(rows, batch_size=batch_size), one_by_one, atol=1e-5, rtol=0)


def test_embed_accepts_tensors(zoo, encoder_case, backend):
    model = zoo.model(encoder_case, backend)
    row = [5, 9, 12, 7]
    expected = model.embed([row])
    torch.testing.assert_close(model.embed(torch.tensor([row])), expected)
    torch.testing.assert_close(model.embed(torch.tensor(row)), expected)


def test_embed_accepts_a_flat_list_of_ids_like_a_1d_tensor(zoo, backend):
    model = zoo.model("bert", backend)
    torch.testing.assert_close(model.embed([5, 9, 12, 7]), model.embed(torch.tensor([5, 9, 12, 7])))


def test_embed_texts_go_through_the_tokenizer(zoo, backend):
    model = zoo.model("bert", backend)
    texts = ["hello world", "the quick brown fox jumps over the lazy dog", "a tiny model"]
    batch = model.tokenizer(texts, padding=True, return_tensors="pt")
    expected = pooled(reference_hidden(zoo, "bert", batch["input_ids"], batch["attention_mask"]),
                      batch["attention_mask"], "mean")
    torch.testing.assert_close(model.embed(texts), expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(model.embed(texts[1]), expected[1:2], atol=1e-4, rtol=0)


def _without_tokenizer(model: hotrod.HotrodModel) -> hotrod.HotrodModel:
    """The same model as one loaded from a checkpoint without tokenizer files."""
    import copy

    bare = copy.copy(model)
    bare.tokenizer = None
    return bare


BAD_EMBEDS = {
    "unknown_pooling": ("bert", lambda m: m.embed([[5, 6]], pooling="max"), "pooling"),
    "decoder_model": ("gpt2", lambda m: m.embed([[5, 6]]), "decoder-only"),
    "nothing": ("bert", lambda m: m.embed([]), "nothing to embed"),
    "empty_text": ("bert", lambda m: m.embed(["hello", "  "]), "empty text"),
    "empty_row": ("bert", lambda m: m.embed([[5, 6], []]), "empty prompt"),
    "text_without_tokenizer": ("roberta", lambda m: _without_tokenizer(m).embed(["hello"]), "no tokenizer"),
    "batch_size_zero": ("bert", lambda m: m.embed([[5, 6]], batch_size=0), "batch_size"),
    "id_above_vocab": ("roberta", lambda m: m.embed([[5, VOCAB]]), "outside the vocabulary"),
    "row_too_long": ("bert", lambda m: m.embed([list(range(5, 5 + POSITIONS + 1))]), "positions"),
}


@pytest.mark.parametrize("bad", list(BAD_EMBEDS))
def test_bad_embed_raises_hotrod_error(zoo, backend, bad):
    name, call, message = BAD_EMBEDS[bad]
    with pytest.raises(hotrod.HotrodError, match=message):
        call(zoo.model(name, backend))


def test_long_text_is_truncated_to_the_positions(zoo, backend):
    model = zoo.model("bert", backend)
    vector = model.embed(["hello world " * 100])
    assert vector.shape == (1, HIDDEN) and torch.isfinite(vector).all()


@pytest.mark.parametrize("kwargs, message", [
    (dict(static=True), "static applies to the torch backend's engine, not to onnxruntime"),
    (dict(threads=1.5), "threads must be an integer >= 0, got 1.5"),
    (dict(threads=100000), "threads must be at most 256"),
    (dict(profile="no"), "profile must be true or false, got 'no'"),
    (dict(static="yes", backend="torch"), "static must be true or false, got 'yes'"),
])
def test_load_options_that_would_change_nothing_or_fail_later_are_refused(zoo, kwargs, message):
    with pytest.raises(hotrod.HotrodError, match=message):
        hotrod.load(zoo.artifact("gpt2"), **kwargs)
