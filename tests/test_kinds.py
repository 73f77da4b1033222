"""The kind specs: what each kind answers, and that generic code asks them instead of naming kinds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from hotrod import kinds
from hotrod.errors import HotrodError
from hotrod.registry import Dims

SRC = Path(kinds.__file__).resolve().parent
# What each kind does: (generates, encodes, continues the prompt).
ANSWERS = {"encoder": (False, True, False), "decoder": (True, False, True), "seq2seq": (True, True, False)}


def test_every_kind_answers_as_it_always_has():
    assert tuple(kinds.KINDS) == tuple(ANSWERS)
    for name, (generates, encodes, continues) in ANSWERS.items():
        spec = kinds.spec(name)
        assert (spec.generates, spec.encodes, spec.continues_prompt) == (generates, encodes, continues)
        assert spec.pads_left == spec.infers_padding == continues


def test_positions_and_spans_follow_the_prompt_only_for_decoders():
    decoder, seq2seq = kinds.spec("decoder"), kinds.spec("seq2seq")
    assert decoder.needs_positions(10, 5) == 15 and kinds.spec("encoder").needs_positions(10, 5) == 10
    assert seq2seq.needs_positions(10, 5) == 10 and seq2seq.needs_positions(3, 8) == 9  # start token + 8
    assert decoder.decoder_prompt(10) == 10 and seq2seq.decoder_prompt(10) == 1
    assert decoder.prompt_span(3, 8) == slice(5, 8) and seq2seq.prompt_span(3, 8) == slice(0, 3)
    rows = torch.tensor([[7, 8, 9, 1, 2]])
    assert decoder.generated(rows, 3).tolist() == [[1, 2]]
    assert seq2seq.generated(rows, 3).tolist() == [[8, 9, 1, 2]]  # after the start token
    assert decoder.history([4, 5], [6], None) == [4, 5, 6] and seq2seq.history([4, 5], [6], 0) == [0, 6]


def test_the_cache_lives_in_the_decoder_layers():
    dims = Dims(vocab_size=10, hidden_size=8, num_layers=3, num_heads=2, head_dim=4, max_positions=None,
                num_decoder_layers=5)
    assert kinds.spec("decoder").cache_layers(dims) == 3 and kinds.spec("seq2seq").cache_layers(dims) == 5


def test_names_select_by_answer_and_an_unknown_kind_lists_the_known():
    assert kinds.names(lambda k: k.generates) == ("decoder", "seq2seq")
    with pytest.raises(HotrodError, match="unknown model kind 'vision'; choose from encoder, decoder, seq2seq"):
        kinds.spec("vision")


def test_no_generic_module_compares_a_kind_name():
    """Family code (`models/`) and the specs themselves may; everything else asks a spec."""
    pattern = re.compile(r"""kind\s*(==|!=|in\s*[(\[])|==\s*["'](encoder|decoder|seq2seq)["']""")
    offenders = [f"{path.relative_to(SRC)}:{number}" for path in SRC.rglob("*.py")
                 if path.parent.name != "models" and path.name != "kinds.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not offenders


def test_each_kind_makes_its_own_state_and_names_its_graphs():
    from hotrod.generation.cache import DecoderState, Seq2SeqState

    dims = Dims(vocab_size=10, hidden_size=8, num_layers=2, num_heads=2, head_dim=4, max_positions=16,
                num_decoder_layers=2)
    assert isinstance(kinds.spec("decoder").new_state(None, dims, None, 8), DecoderState)
    assert isinstance(kinds.spec("seq2seq").new_state(None, dims, 0, 8), Seq2SeqState)
    with pytest.raises(HotrodError, match="neither decoder_start_token_id nor bos_token_id is set"):
        kinds.spec("seq2seq").new_state(None, dims, None, 8)
    with pytest.raises(HotrodError, match="does not generate"):
        kinds.spec("encoder").new_state(None, dims, None, 8)
    graphs = {name: tuple(kinds.spec(name).contracts(dims)) for name in kinds.KINDS}
    assert graphs == {"encoder": ("encoder",), "decoder": ("decoder",),
                      "seq2seq": ("encoder", "decoder_init", "decoder")}
