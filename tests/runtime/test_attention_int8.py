"""hotrod's int8 attention (AVX-512 VNNI; `int8-full`'s): softmax(Q K^T scale + mask) V with each row of Q, K and V
quantized to int8 with its own scale and the numerators, times their key's V scale, to uint8 per row, over odd head
sizes, lengths, masks and thread counts; a row alone the same as in any padded batch; NaN where fp32's would be;
the path taken only where the build asked for it and the CPU has VNNI, bf16's otherwise."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from hotrod import precisions
from hotrod.asks import ATTENTION_KEY, ask
from hotrod.runtime import attention
from tests.runtime.test_attention import assert_rows_alone_as_in_a_batch, graph, inputs, padding_mask, run
from tests.runtime.test_attention_quantized import folded, quantized, unfolded
from tests.runtime.test_rows import _copy

vnni = pytest.mark.skipif(not attention.quads_ready(), reason="no AVX-512 VNNI on this CPU: bf16's path runs")


def int8_graph(heads: int, mask: bool = True, **attrs) -> onnx.ModelProto:
    return ask(graph(heads, mask=mask, asked=False, **attrs), ATTENTION_KEY, "int8")


def rewritten(model: onnx.ModelProto) -> onnx.ModelProto:
    out = _copy(model)
    assert attention.rewrite(out) == 1
    assert next(a.i for a in out.graph.node[0].attribute if a.name == "tiles") == attention.QUADS
    return out


def _rows(x: np.ndarray, offset: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Each last-axis row as int8 values (plus `offset`) and its scale, as the kernel quantizes it (float32)."""
    top = np.abs(x).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inverse = np.where(top > 0, np.float32(127) / top, 0).astype(np.float32)
    return np.rint(x * inverse).astype(np.float64) + offset, (top / np.float32(127)).astype(np.float64)


def reference(feeds: dict, heads: int, scale: float | None = None) -> np.ndarray:
    """The kernel's arithmetic in float64 from its integers: scores from int8 rows, e^(s - max) exactly, the
    numerators times their key's V scale quantized to uint8 with each row's largest as 255."""
    q, k, v = feeds["q"], feeds["k"], feeds["v"]
    batch, seq, width = q.shape
    head = width // heads

    def heads_first(x: np.ndarray) -> np.ndarray:
        return x.reshape(batch, x.shape[1], heads, head).transpose(0, 2, 1, 3)

    (q8, sq), (k8, sk), (v8, sv) = (_rows(heads_first(x)) for x in (q, k, v))
    scores = (q8 @ k8.transpose(0, 1, 3, 2)) * sk.transpose(0, 1, 3, 2) * (sq * (scale or 1 / np.sqrt(head)))
    if "m" in feeds:
        scores = scores + feeds["m"]
    e = np.exp(scores - scores.max(-1, keepdims=True))
    weights = e * sv.transpose(0, 1, 3, 2)
    top = weights.max(-1, keepdims=True)
    out = (np.rint(weights * 255 / top) @ v8) * (top / 255 / e.sum(-1, keepdims=True))
    return out.transpose(0, 2, 1, 3).reshape(batch, seq, width)


@vnni
@pytest.mark.parametrize("batch,seq,heads,head,masked", [
    (1, 1, 2, 64, True), (2, 5, 3, 32, True), (1, 17, 2, 48, False), (2, 64, 4, 64, True), (3, 65, 2, 16, True),
    (1, 130, 2, 100, False), (2, 37, 1, 128, True), (1, 9, 4, 8, True),
])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_kernels_arithmetic_over_odd_head_sizes_lengths_and_masks(batch, seq, heads, head, masked, threads):
    feeds = inputs(batch, seq, heads, head)
    if masked:
        feeds["m"] = padding_mask([seq - i for i in range(batch)], seq)
    model = int8_graph(heads, mask=masked)
    fast = run(rewritten(model), feeds, threads=threads)
    # a numerator's byte may round the other way than float64's (the kernel's e^x is good to 8e-5): a step of
    # one 255th of the row's heaviest weight times a value, here and there; on average far closer than fp32's
    ours = reference(feeds, heads)
    np.testing.assert_allclose(fast, ours, atol=1e-2, rtol=0)
    assert np.abs(fast - ours).mean() < 3e-4
    slow = run(model, feeds, library=False)  # onnxruntime's fp32 attention
    np.testing.assert_allclose(fast, slow, atol=0.15, rtol=0)
    cosine = (fast * slow).sum(-1) / (np.linalg.norm(fast, axis=-1) * np.linalg.norm(slow, axis=-1))
    assert cosine.min() > 0.995


@vnni
def test_closer_to_its_own_arithmetic_than_to_fp32s():
    """The reference is the kernel's arithmetic, not a loose bound around any attention: fp32's answers lie well
    outside the tolerance the kernel keeps to it."""
    feeds = inputs(2, 96, 4, 64, seed=7)
    feeds["m"] = padding_mask([96, 50], 96)
    model = int8_graph(4)
    fast, ours = run(rewritten(model), feeds), reference(feeds, 4)
    distance = np.abs(fast - ours).max()
    assert distance < np.abs(run(model, feeds, library=False) - ours).max() / 4
    assert np.abs(fast - ours).mean() < 1e-3


@vnni
def test_a_bias_per_head_and_query_and_a_given_scale():
    feeds = inputs(2, 11, 3, 32, seed=1)
    feeds["m"] = np.random.default_rng(2).standard_normal((1, 3, 11, 11)).astype(np.float32)
    model = int8_graph(3, scale=0.3)
    fast, ours = run(rewritten(model), feeds), reference(feeds, 3, 0.3)
    np.testing.assert_allclose(fast, ours, atol=1e-2, rtol=0)
    assert np.abs(fast - ours).mean() < 3e-4


@vnni
@pytest.mark.parametrize("threads", [1, 3])
def test_a_row_is_the_same_alone_in_any_padded_batch_and_at_any_thread_count(threads):
    """Every scale is a row's own: padded keys' values, batch-mates and the other queries of a block change none."""
    assert_rows_alone_as_in_a_batch(rewritten(int8_graph(4)), threads)


@vnni
def test_nan_where_fp32_attention_gives_nan_and_zeros_where_every_key_is_masked():
    feeds = inputs(1, 6, 2, 32, seed=5)
    feeds["q"][0, 2, 3] = np.nan  # query row 2 of head 0
    feeds["v"][0, 4, 40] = np.inf  # value row 4 of head 1
    mask = np.zeros((1, 1, 6, 6), np.float32)
    mask[0, 0, 5] = -np.inf  # query row 5 sees no key
    feeds["m"] = mask
    out = run(rewritten(int8_graph(2)), feeds)
    assert np.isnan(out[0, 2, :32]).all() and np.isnan(out[0, :, 32:]).all()
    assert (out[0, 5, :32] == 0).all()
    rest = np.ones((6, 32), bool)
    rest[[2, 5]] = False
    assert np.isfinite(out[0, :, :32][rest]).all()


def test_the_path_the_build_asked_for_where_this_cpu_runs_it(monkeypatch):
    """int8 attention on VNNI; without it the op takes bf16's path (closer to fp32 than what was measured); a graph
    that asked for nothing keeps onnxruntime's attention; the precision that asks for it says so."""
    assert attention.asked(int8_graph(2)) == "int8" and attention.asked(graph(2)) == "bf16"
    assert attention.asked(graph(2, asked=False)) is None
    assert attention.rewrite(_copy(graph(2, asked=False))) == 0
    monkeypatch.setattr(attention, "quads_ready", lambda: True)
    assert attention.path("int8") == attention.QUADS and attention.path("bf16") != attention.QUADS
    monkeypatch.setattr(attention, "quads_ready", lambda: False)
    assert attention.path("int8") == attention.path("bf16")
    assert {attention.path(arithmetic) for arithmetic in attention.ARITHMETICS} <= {
        attention.TILES, attention.PAIRS, attention.FMAS, attention.QUADS}
    full = precisions.get("int8-full")
    assert full.attention == "int8" and not full.candidate and full.needs_feeds


@vnni
@pytest.mark.parametrize("batch,seq,heads,head", [(1, 1, 2, 64), (2, 5, 3, 32), (3, 65, 2, 16), (1, 130, 2, 100)])
@pytest.mark.parametrize("scale,zero_point", [(0.01, 128), (1e-4, 17)])
def test_quantized_inside_the_kernel_the_same_bits_as_int8_attention_then_quantize_linear(batch, seq, heads, head,
                                                                                         scale, zero_point):
    """int8-full's graphs quantize the attention's answers for the output projection inside the kernel, as
    int8-static's do; the same bits as the int8 attention's floats through onnxruntime's QuantizeLinear."""
    feeds = inputs(batch, seq, heads, head, seed=seq)
    feeds["m"] = padding_mask([seq - i for i in range(batch)], seq)
    model = ask(quantized(heads, scale, zero_point), ATTENTION_KEY, "int8")
    ours, theirs = folded(model), unfolded(model)
    assert {a.i for n in (*ours.graph.node, *theirs.graph.node) for a in n.attribute if a.name == "tiles"} == {
        attention.QUADS}
    assert np.array_equal(run(ours, feeds), run(theirs, feeds))
