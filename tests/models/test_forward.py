"""fp32 forward parity with transformers, per family and backend: logits for LMs, hidden states for encoders."""

from __future__ import annotations

import pytest
import torch

from tests.zoo import CASES, prompt_batch

ATOL = 1e-4
SINGLE, BATCH = (7,), (7, 3, 5)


def decoder_inputs(batch: int, length: int = 4, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(2, 100, (batch, length), generator=generator)


def run_both(zoo, name: str, backend: str, **inputs):
    """(transformers' output, hotrod's output) for the same inputs."""
    with torch.no_grad():
        theirs = zoo.reference(name)(**inputs)
    ours = zoo.model(name, backend)(**inputs)
    return theirs, ours


def assert_close_where(ours: torch.Tensor, theirs: torch.Tensor, keep: torch.Tensor | None = None,
                       atol: float = ATOL):
    assert ours.shape == theirs.shape
    assert ours.dtype == torch.float32
    if keep is not None:
        ours, theirs = ours[keep.bool()], theirs[keep.bool()]
    torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)


@pytest.mark.parametrize("lengths", [SINGLE, BATCH], ids=["single", "padded_batch"])
def test_lm_logits_match_transformers(zoo, lm_case, backend, lengths):
    ids, mask = prompt_batch(CASES[lm_case], lengths)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if CASES[lm_case].kind == "seq2seq":
        inputs["decoder_input_ids"] = decoder_inputs(len(lengths))
    theirs, ours = run_both(zoo, lm_case, backend, **inputs)
    # Decoder-only rows are left padded: logits at pad positions are meaningless on both sides.
    keep = mask if CASES[lm_case].kind == "decoder" else None
    assert_close_where(ours.logits, theirs.logits, keep, CASES[lm_case].atol)


def test_lm_logits_without_attention_mask(zoo, lm_case, backend):
    ids, _ = prompt_batch(CASES[lm_case], (6, 6))
    inputs = {"input_ids": ids}
    if CASES[lm_case].kind == "seq2seq":
        inputs["decoder_input_ids"] = decoder_inputs(2)
    theirs, ours = run_both(zoo, lm_case, backend, **inputs)
    assert_close_where(ours.logits, theirs.logits, atol=CASES[lm_case].atol)


def assert_read_as_transformers(zoo, name: str, backend: str) -> None:
    """By position (`out[0]`, as the pooling snippets on model cards read it), as a mapping, as a tuple; a
    seq2seq model's third positional argument is decoder_input_ids, as transformers' T5 and BART take it."""
    ids, mask = prompt_batch(CASES[name], BATCH)
    third = [decoder_inputs(len(BATCH))] if CASES[name].kind == "seq2seq" else []
    with torch.no_grad():  # (GPT-2's second positional argument is past_key_values)
        theirs = zoo.reference(name)(ids, mask, *third) if third else zoo.reference(name)(ids, attention_mask=mask)
    ours = zoo.model(name, backend)(ids, mask, *third)
    assert list(ours) == ours.keys() and len(ours) == len(ours.keys()) and ours.keys()[0] in ours
    assert ours[0] is ours[ours.keys()[0]] is getattr(ours, ours.keys()[0])
    assert ours.to_tuple() == tuple(ours.values()) and dict(ours.items()).keys() == set(ours.keys())
    assert_close_where(ours[0], theirs[0], mask if CASES[name].kind != "seq2seq" else None, CASES[name].atol)
    with pytest.raises(KeyError):
        ours["past_key_values"]


def test_lm_outputs_are_read_as_transformers_outputs(zoo, lm_case, backend):
    assert_read_as_transformers(zoo, lm_case, backend)


def test_encoder_outputs_are_read_as_transformers_outputs(zoo, encoder_case, backend):
    assert_read_as_transformers(zoo, encoder_case, backend)


def test_seq2seq_encoder_output_matches_transformers(zoo, seq2seq_case, backend):
    ids, mask = prompt_batch(CASES[seq2seq_case], BATCH)
    theirs, ours = run_both(zoo, seq2seq_case, backend, input_ids=ids, attention_mask=mask,
                            decoder_input_ids=decoder_inputs(len(BATCH)))
    assert_close_where(ours.encoder_last_hidden_state, theirs.encoder_last_hidden_state, mask)


def test_seq2seq_long_inputs_match_transformers(zoo, seq2seq_case, backend):
    """Distances past the exact relative-position buckets: the log-spaced and the clamped ones."""
    ids, mask = prompt_batch(CASES[seq2seq_case], (200, 120))
    theirs, ours = run_both(zoo, seq2seq_case, backend, input_ids=ids, attention_mask=mask,
                            decoder_input_ids=decoder_inputs(2, length=150))
    assert_close_where(ours.logits, theirs.logits, atol=CASES[seq2seq_case].atol)


@pytest.mark.parametrize("lengths", [SINGLE, BATCH], ids=["single", "padded_batch"])
def test_encoder_hidden_states_match_transformers(zoo, encoder_case, backend, lengths):
    ids, mask = prompt_batch(CASES[encoder_case], lengths)
    theirs, ours = run_both(zoo, encoder_case, backend, input_ids=ids, attention_mask=mask)
    assert_close_where(ours.last_hidden_state, theirs.last_hidden_state, mask)
    assert ours["last_hidden_state"] is ours.last_hidden_state


def test_bert_token_type_ids_match_transformers(zoo, backend):
    ids, mask = prompt_batch(CASES["bert"], BATCH)
    types = torch.zeros_like(ids)
    types[:, 2:] = 1
    theirs, ours = run_both(zoo, "bert", backend, input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert_close_where(ours.last_hidden_state, theirs.last_hidden_state, mask)
    _, without = run_both(zoo, "bert", backend, input_ids=ids, attention_mask=mask)
    assert not torch.allclose(without.last_hidden_state, ours.last_hidden_state), "token_type_ids were ignored"


def test_zero_token_types_pass_through_a_family_without_them(zoo, backend):
    """A BERT-style tokenizer's all-zero token_type_ids change nothing for DistilBERT (other values are
    refused: tests/test_model.py)."""
    ids, mask = prompt_batch(CASES["distilbert"], BATCH)
    model = zoo.model("distilbert", backend)
    plain = model(input_ids=ids, attention_mask=mask).last_hidden_state
    typed = model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state
    assert torch.equal(typed, plain)
