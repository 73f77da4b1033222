"""DeBERTa-v2's own variations, beyond the table's case (v3's shape, rows a few tokens long): the bucket
tables against transformers' relative positions; the exported graph at two lengths, the longer past every
bucket; DeBERTa-v2's other switches (separate position projections, absolute positions, token types, an
embedding projection, no bucketing, the ConvLayer) with its classification head; the packed way; a relative
bias that the parity tests do depend on; and int8 builds of every head within the task gates BERT's are held to."""

from __future__ import annotations

import copy
import dataclasses

import onnx
import pytest
import torch
import transformers
from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

import hotrod
from hotrod.models.deberta_attention import RelativePositions, relative_span
from tests.zoo import (
    CASES,
    HIDDEN,
    assert_hidden_matches,
    assert_int8_within_gate,
    build_checkpoint,
    head_case,
    int8_gates,
    load_on,
    prompt_batch,
)

CASE = CASES["deberta_v2"]
# The heads and gates of tests/verification/test_task_measures.py's int8 test (which runs BERT's), on DeBERTa.
# The answers' checkpoint has absolute positions: without them (v3's shape) a tiny random model gives a
# repeated word nearly the same start and end logits wherever it stands, and int8's error (no larger than
# BERT's on the bare model) flips spans between such near-ties, 0.79 to 1.0 over six seeds.
GATED = int8_gates(CASE, position_biased_input=True)
SHORT, LONG = (6, 4), (45, 23)  # LONG: distances up to 44, past max_relative_positions (16)
V2 = dict(share_att_key=False, position_biased_input=True, type_vocab_size=2, embedding_size=HIDDEN // 2,
          norm_rel_ebd="none", position_buckets=-1, max_relative_positions=-1, conv_kernel_size=3,
          pooler_hidden_act="tanh")


@pytest.mark.parametrize("buckets, max_relative", [(8, 16), (7, 16), (256, 512), (-1, 16), (-1, -1)])
def test_the_index_tables_are_transformers_relative_positions(buckets, max_relative):
    config = transformers.DebertaV2Config(position_buckets=buckets, max_relative_positions=max_relative,
                                          max_position_embeddings=64)
    span = relative_span(config)[2]
    length = 1200
    theirs = build_relative_position(torch.zeros(1, length, 1), torch.zeros(1, length, 1), buckets,
                                     relative_span(config)[1])[0]
    c2p, p2c = RelativePositions(config)(torch.zeros(1, length))
    assert torch.equal(c2p, (theirs + span).clamp(0, 2 * span - 1))
    assert torch.equal(p2c, (-theirs + span).clamp(0, 2 * span - 1))


def _wide(base, **changes):
    """Weights drawn wider than the table's: at the default 0.02 the relative scores barely move anything."""
    def config():
        made = base.config()
        made.initializer_range = 0.2
        for key, value in changes.items():
            setattr(made, key, value)
        return made

    return config


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (case, checkpoint, artifact, reference): v3's shape (bare) and v2's switches (a classifier)."""
    cases = {"v3": dataclasses.replace(CASE, name="deberta-v3", config=_wide(CASE)),
             "v2": dataclasses.replace(head_case(CASE, "cls"), name="deberta-v2-cls",
                                       config=_wide(head_case(CASE, "cls"), **V2))}
    out = {}
    for name, case in cases.items():
        root = tmp_path_factory.mktemp(case.name)
        checkpoint = build_checkpoint(case, root / "checkpoint", seed=3)
        artifact = hotrod.optimize(checkpoint, root / "artifact", progress=False, verify_examples=0)
        out[name] = case, checkpoint, artifact, case.hf_class.from_pretrained(checkpoint).eval()
    return out


@pytest.mark.parametrize("lengths", [SHORT, LONG], ids=["short", "long"])
def test_one_exported_graph_serves_both_lengths(built, backend, lengths):
    assert_hidden_matches(built["v3"], backend, lengths)


def test_the_graph_is_dynamic_reads_index_tables_and_computes_no_logarithm(built):
    *_, artifact, _ = built["v3"]
    graph = onnx.load(str(artifact / "encoder.onnx")).graph
    ops = {node.op_type for node in graph.node}
    assert "Log" not in ops and "GatherElements" in ops
    assert ops & {"Attention", "MultiHeadAttention"}
    assert [d.dim_param for d in graph.input[0].type.tensor_type.shape.dim] == ["batch", "sequence"]


def test_v2_switches_and_the_context_pooler_match_transformers(built, backend):
    case, checkpoint, artifact, reference = built["v2"]
    assert reference.deberta.encoder.conv is not None and reference.deberta.embeddings.embed_proj is not None
    model = load_on(artifact if backend == "onnxruntime" else checkpoint, backend)
    for lengths in (SHORT, LONG):
        ids, mask = prompt_batch(case, lengths, seed=6)
        types = (torch.arange(ids.shape[1]) >= 3).long().expand_as(ids) * mask
        with torch.no_grad():
            expected = reference(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        got = model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_the_relative_scores_move_the_hidden_states(built):
    """With other relative embeddings transformers' answer moves far past the 1e-4 the parity tests allow,
    so those tests hold hotrod's disentangled scores to transformers'."""
    case, checkpoint, _, reference = built["v3"]
    ids, mask = prompt_batch(case, LONG, seed=4)
    real = mask.bool()
    ours = load_on(checkpoint, "torch")(input_ids=ids, attention_mask=mask).last_hidden_state
    other = copy.deepcopy(reference)
    torch.nn.init.normal_(other.encoder.rel_embeddings.weight, std=0.2, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        moved = other(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (ours[real] - moved[real]).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["v3", "v2"])
def test_the_packed_way_equals_the_padded_way(built, name):
    case, checkpoint, _, _ = built[name]
    ids, mask = prompt_batch(case, (*LONG, 3), seed=5)
    real = mask.bool()
    model = hotrod.load(checkpoint, backend="torch", static=True, precision="fp32")
    field = "logits" if case.task else "last_hidden_state"
    padded = model(input_ids=ids, attention_mask=mask)[field]
    model.backend.packed = model.backend.module.packed_graphs()  # on a GPU by default; here by hand
    packed = model(input_ids=ids, attention_mask=mask)[field]
    if padded.dim() == 3:  # hidden states: zeros at padded positions on the packed way
        assert torch.count_nonzero(packed[~real]) == 0
        padded, packed = padded[real], packed[real]
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)


@pytest.mark.parametrize("task", list(GATED))
def test_int8_builds_of_every_head_keep_within_the_task_gate(tmp_path, task):
    assert_int8_within_gate(*GATED[task], tmp_path)
