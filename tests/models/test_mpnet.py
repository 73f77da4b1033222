"""MPNet's own variations, beyond the table's case (whose rows are a few tokens long, all within the exact
relative-position buckets): distances in the log-spaced buckets and past 128, where the bucket stops
changing, on every backend and through the fused graph; the bucket table against transformers' bucketing;
the packed way over such rows; a relative bias that the parity tests do depend on; and int8 builds
of every head within the task gates BERT's are held to."""

from __future__ import annotations

import copy
import dataclasses

import onnx
import pytest
import torch
from transformers.models.mpnet.modeling_mpnet import MPNetEncoder as HFEncoder

import hotrod
from hotrod.models.mpnet import MAX_DISTANCE, Layers
from tests.zoo import (
    CASES,
    assert_hidden_matches,
    assert_int8_within_gate,
    build_checkpoint,
    int8_gates,
    load_on,
    prompt_batch,
)

CASE = CASES["mpnet"]
# The heads and gates of tests/verification/test_task_measures.py's int8 test (which runs BERT's), on MPNet.
GATED = int8_gates(CASE)
LONG = (300, 170)  # distances up to 299: every log-spaced bucket, and the last one past 128


def _long_config():
    """Positions for LONG, and weights drawn wider than the table's (the relative bias's among them: at
    the default 0.02 it moves the hidden states by less than 1e-3)."""
    made = CASE.config()
    made.max_position_embeddings = max(LONG) + 2
    made.initializer_range = 0.1
    return made


@pytest.fixture(scope="module")
def long_case(tmp_path_factory):
    case = dataclasses.replace(CASE, name="mpnet-long", config=_long_config)
    root = tmp_path_factory.mktemp("mpnet-long")
    checkpoint = build_checkpoint(case, root / "checkpoint", seed=2)
    artifact = hotrod.optimize(checkpoint, root / "artifact", progress=False, verify_examples=0)
    reference = case.hf_class.from_pretrained(checkpoint).eval()
    return case, checkpoint, artifact, reference


def test_the_bucket_table_is_transformers_bucketing():
    distances = torch.arange(-3 * MAX_DISTANCE, 3 * MAX_DISTANCE + 1)
    layers = Layers(CASE.config())
    ours = layers.distance_buckets[distances.clamp(-MAX_DISTANCE, MAX_DISTANCE) + MAX_DISTANCE]
    assert torch.equal(ours, HFEncoder.relative_position_bucket(distances))


def test_long_rows_match_transformers(long_case, backend):
    assert_hidden_matches(long_case, backend, LONG)


def test_the_fused_graph_reads_buckets_and_computes_no_logarithm(long_case):
    _, _, artifact, _ = long_case
    ops = {node.op_type for path in artifact.glob("*.onnx") for node in onnx.load(str(path)).graph.node}
    assert "Log" not in ops
    assert ops & {"Attention", "MultiHeadAttention"}


def test_the_packed_way_equals_the_padded_way_over_long_rows(long_case):
    case, checkpoint, _, _ = long_case
    ids, mask = prompt_batch(case, (*LONG, 3), seed=5)
    real = mask.bool()
    model = hotrod.load(checkpoint, backend="torch", static=True, precision="fp32")
    padded = model(input_ids=ids, attention_mask=mask).last_hidden_state
    model.backend.packed = model.backend.module.packed_graphs()  # on a GPU by default; here by hand
    packed = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.count_nonzero(packed[~real]) == 0
    torch.testing.assert_close(packed[real], padded[real], atol=1e-5, rtol=0)


def test_the_relative_bias_moves_the_hidden_states(long_case):
    """Without the bias transformers' answer moves far past the 1e-4 the parity tests allow, so those tests
    hold hotrod's bias to transformers'."""
    case, checkpoint, _, reference = long_case
    ids, mask = prompt_batch(case, LONG, seed=4)
    real = mask.bool()
    ours = load_on(checkpoint, "torch")(input_ids=ids, attention_mask=mask).last_hidden_state
    unbiased = copy.deepcopy(reference)
    torch.nn.init.zeros_(unbiased.encoder.relative_attention_bias.weight)
    with torch.no_grad():
        without = unbiased(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (ours[real] - without[real]).abs().max() > 1e-3  # 1.2e-2 here


@pytest.mark.parametrize("task", list(GATED))
def test_int8_builds_of_every_head_keep_within_the_task_gate(tmp_path, task):
    assert_int8_within_gate(*GATED[task], tmp_path)
