"""hotrod's bf16 attention kernel (AMX; without tiles, AVX512_BF16's VDPBF16PS or AVX-512F's FMAs: every test
on each path this CPU can take): softmax(Q K^T scale + mask) V with Q, K, V and the numerators rounded to bf16 and everything else in
fp32, over odd head sizes, lengths, masks and thread counts; a row alone the same as in any padded batch; only
graphs whose build asked for it rewritten, and only the nodes it computes; a fallback wherever the CPU or the
build lacks it; a loaded int8 encoder close to its fp32-attention self."""

from __future__ import annotations

from collections.abc import Iterator

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import hotrod
from hotrod import precisions
from hotrod.asks import ATTENTION_KEY, ask
from hotrod.runtime import attention, bf16, i8, native
from tests.runtime.test_i8 import loaded_on_and_off
from tests.runtime.test_rows import _copy
from tests.zoo import CASES, prompt_batch

amx = pytest.mark.skipif(not attention.available(),
                         reason="no AMX-BF16 nor AVX-512 on this CPU: onnxruntime's kernel runs")
pytestmark = pytest.mark.usefixtures("products_path", "attention_path")


@pytest.fixture(params=("own", "fp32-fmas"))
def attention_path(request) -> Iterator[str]:
    """Without tiles, the path on VDPBF16PS where this CPU has it, and with it left out the one on FMAs."""
    if request.param == "own":
        yield request.param
        return
    if attention.path() != attention.PAIRS:
        pytest.skip("no path on VDPBF16PS here to leave out: this CPU's own is the other")
    with attention.pairs_left_out():
        yield request.param


def graph(heads: int, mask: bool = True, asked: bool = True, mask_type: int = TensorProto.FLOAT,
          **attrs) -> onnx.ModelProto:
    """q, k, v [B, S, W] (and an additive mask m) -> ONNX's Attention -> y."""
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["b", None, "w"]) for name in "qkv"]
    if mask:
        inputs.append(helper.make_tensor_value_info("m", mask_type, None))
    node = helper.make_node("Attention", ["q", "k", "v", *(["m"] if mask else [])], ["y"],
                            **({"q_num_heads": heads, "kv_num_heads": heads} | attrs))
    model = helper.make_model(helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 23)])
    return ask(model, ATTENTION_KEY, "bf16") if asked else model


def multi_head(heads: int, head: int, bias: bool = True, transposed: bool = True, **attrs) -> onnx.ModelProto:
    """q [B, S, W]; k, v [B, S_k, W] reshaped to [B, S_k, H, D] and transposed to [B, H, S_k, D] (and an additive
    bias m) -> com.microsoft's MultiHeadAttention -> y, as T5's encoders are exported."""
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["b", None, heads * head]) for name in "qkv"]
    shape = numpy_helper.from_array(np.array([0, -1, heads, head], np.int64), "split_heads")
    nodes = []
    for name in "kv":
        nodes.append(helper.make_node("Reshape", [name, "split_heads"], [f"{name}4"]))
        if transposed:
            nodes.append(helper.make_node("Transpose", [f"{name}4"], [f"{name}t"], perm=[0, 2, 1, 3]))
    if bias:
        inputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, None))
    kv = ["kt", "vt"] if transposed else ["k4", "v4"]
    nodes.append(helper.make_node("MultiHeadAttention", ["q", *kv, "", "", *(["m"] if bias else [])], ["y"],
                                  domain="com.microsoft", **({"num_heads": heads} | attrs)))
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, None)], [shape]), opset_imports=[helper.make_opsetid("", 17),
                                                                 helper.make_opsetid("com.microsoft", 1)])
    return ask(model, ATTENTION_KEY, "bf16")


def rewritten(model: onnx.ModelProto) -> onnx.ModelProto:
    out = _copy(model)
    assert attention.rewrite(out) == 1
    return out


def run(model: onnx.ModelProto, feeds: dict, threads: int = 2, library: bool = True) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if library:
        native.use_library(options)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def inputs(batch: int, seq: int, heads: int, head: int, seed: int = 0, kv_seq: int | None = None) -> dict:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, seq, heads * head), dtype=np.float32)
    k, v = (rng.standard_normal((batch, kv_seq or seq, heads * head), dtype=np.float32) for _ in range(2))
    return {"q": q, "k": k, "v": v}


def padding_mask(lengths: list[int], seq: int, rows: int | None = None) -> np.ndarray:
    """[B, 1, rows, S]: 0 for a row's tokens, float32's lowest after them (hotrod's exports' masks)."""
    keep = np.arange(seq)[None, :] < np.array(lengths)[:, None]
    mask = np.where(keep, 0.0, np.finfo(np.float32).min).astype(np.float32)[:, None, None, :]
    return np.ascontiguousarray(np.broadcast_to(mask, (len(lengths), 1, rows or seq, seq)))


def reference(feeds: dict, heads: int, scale: float | None = None) -> np.ndarray:
    """The kernel's arithmetic in float64: inputs and numerators rounded to bf16, the rest exact."""
    def bf16(x: np.ndarray) -> np.ndarray:
        return x.astype(ml_dtypes.bfloat16).astype(np.float64)

    q, k, v = feeds["q"], feeds["k"], feeds["v"]
    batch, seq, width = q.shape
    head = width // heads

    def heads_first(x: np.ndarray) -> np.ndarray:
        return bf16(x).reshape(batch, x.shape[1], heads, head).transpose(0, 2, 1, 3)

    scores = (heads_first(q) @ heads_first(k).transpose(0, 1, 3, 2)) * (scale or 1 / np.sqrt(head))
    if "m" in feeds:
        scores = scores + feeds["m"]
    numerators = np.exp(scores - scores.max(-1, keepdims=True))
    out = (bf16(numerators) @ heads_first(v)) / numerators.sum(-1, keepdims=True)
    return out.transpose(0, 2, 1, 3).reshape(batch, seq, width)


@amx
@pytest.mark.parametrize("batch,seq,heads,head,masked", [
    (1, 1, 2, 64, True), (2, 5, 3, 32, True), (1, 17, 2, 48, False), (2, 64, 4, 64, True), (3, 65, 2, 16, True),
    (1, 130, 2, 100, False), (2, 37, 1, 128, True), (1, 9, 4, 8, True),
])
def test_the_kernels_arithmetic_over_odd_head_sizes_lengths_and_masks(batch, seq, heads, head, masked):
    feeds = inputs(batch, seq, heads, head)
    if masked:
        feeds["m"] = padding_mask([seq - i for i in range(batch)], seq)
    model = graph(heads, mask=masked)
    fast = run(rewritten(model), feeds)
    np.testing.assert_allclose(fast, reference(feeds, heads), atol=2e-3, rtol=0)
    np.testing.assert_allclose(fast, run(model, feeds, library=False), atol=3e-2, rtol=0)  # fp32 attention


@amx
def test_a_bias_per_head_and_query_and_a_given_scale():
    feeds = inputs(2, 11, 3, 32, seed=1)
    feeds["m"] = np.random.default_rng(2).standard_normal((1, 3, 11, 11)).astype(np.float32)
    model = graph(3, scale=0.3)
    np.testing.assert_allclose(run(rewritten(model), feeds), reference(feeds, 3, 0.3), atol=2e-3, rtol=0)


@amx
@pytest.mark.parametrize("threads", [1, 3])
def test_a_row_is_the_same_alone_in_any_padded_batch_and_at_any_thread_count(threads):
    assert_rows_alone_as_in_a_batch(rewritten(graph(4)), threads)


def assert_rows_alone_as_in_a_batch(model: onnx.ModelProto, threads: int) -> None:
    """Three rows of 9, 70 and 33 tokens, padded into one batch on `threads` threads, each the same alone."""
    batch = inputs(3, 70, 4, 64, seed=3)
    batch["m"] = padding_mask([9, 70, 33], 70)
    together = run(model, batch, threads=threads)
    for row, length in enumerate([9, 70, 33]):
        alone = {name: np.ascontiguousarray(batch[name][row:row + 1, :length]) for name in "qkv"}
        alone["m"] = padding_mask([length], length)
        assert np.array_equal(run(model, alone, threads=2), together[row:row + 1, :length])


@amx
@pytest.mark.parametrize("kv_seq", [None, 23])
@pytest.mark.parametrize("scale", [1.0, None])
def test_multi_head_attention_on_transposed_keys_with_a_position_bias(kv_seq, scale):
    """T5's form: keys and values [B, H, S, D] from a Transpose, the op reading them from before it; a bias per
    head, query and key (T5's relative positions plus its padding), T5's scale of 1 or the default."""
    feeds = inputs(2, 19, 4, 32, seed=4, kv_seq=kv_seq)
    feeds["m"] = np.random.default_rng(5).standard_normal((1, 4, 19, kv_seq or 19)).astype(np.float32)
    feeds["m"] = feeds["m"] + padding_mask([kv_seq or 19, 7], kv_seq or 19, rows=19)
    model = multi_head(4, 32, **({"scale": scale} if scale else {}))
    out = _copy(model)
    assert attention.rewrite(out) == 1
    assert [node.op_type for node in out.graph.node] == ["Reshape", "Reshape", attention.OP]  # the Transposes go
    fast, slow = run(out, feeds), run(model, feeds, library=False)
    np.testing.assert_allclose(fast, reference(feeds, 4, scale), atol=2e-3, rtol=0)
    cosine = (fast * slow).sum(-1) / (np.linalg.norm(fast, axis=-1) * np.linalg.norm(slow, axis=-1))
    assert cosine.min() > 0.999  # onnxruntime's fp32 op: the same attention, unscaled scores rounded to bf16


@pytest.mark.parametrize("change", [dict(unidirectional=1), dict(transposed=False), dict(mask_filter_value=-1.0e4)])
def test_multi_head_attention_the_kernel_does_not_compute_is_left_as_it_is(change):
    """A causal one, keys of a layout not known without shapes (a decoder's cache); an attribute the kernel
    does not read (mask_filter_value applies only to a key padding mask, which it never has: still taken)."""
    model = multi_head(2, 32, **change)
    assert attention.rewrite(_copy(model)) == (1 if "mask_filter_value" in change else 0)
    padded = multi_head(2, 32)
    padded.graph.node[-1].input[4] = "m"  # a key padding mask
    assert attention.rewrite(_copy(padded)) == 0
    cached = multi_head(2, 32)  # a transposed key that is also a graph output (a cache): its Transpose stays
    cached.graph.output.append(helper.make_tensor_value_info("kt", TensorProto.FLOAT, None))
    out = _copy(cached)
    assert attention.rewrite(out) == 1 and [n.op_type for n in out.graph.node].count("Transpose") == 1


@amx
def test_values_are_rounded_to_bf16_to_nearest_even_as_ml_dtypes_rounds():
    """With one key the numerator is 1 and the answer is V itself as the kernel rounded it: ties both ways,
    values that round up across a power of two or to infinity, and NaN, bit for bit as ml_dtypes rounds them;
    subnormals as ml_dtypes keeps them on FMAs, flushed to zero by the bf16 conversion of the other paths."""
    bits = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F807FFF, 0x3FFF8000, 0xBF808000, 0xC0018000,
                     0x7F7FFFFF, 0x00008000, 0x7FC00001, 0x00010000, 0x807F8000], np.uint32)
    rng = np.random.default_rng(9)
    v = np.concatenate([bits.view(np.float32), rng.standard_normal(20).astype(np.float32)]).reshape(1, 1, 32)
    feeds = {"q": rng.standard_normal((1, 1, 32), dtype=np.float32), "k": rng.standard_normal((1, 1, 32),
             dtype=np.float32), "v": v}
    fast = run(rewritten(graph(1, mask=False)), feeds)
    expected = v.astype(ml_dtypes.bfloat16).astype(np.float32)
    if attention.path() != attention.FMAS:  # the bf16 conversion instructions flush them
        expected[np.abs(v) < np.finfo(np.float32).tiny] = 0.0
    finite = ~np.isnan(expected)
    assert np.array_equal(fast[finite].view(np.uint32), expected[finite].view(np.uint32))
    assert np.isnan(fast[~finite]).all()


@amx
@pytest.mark.parametrize("tiles", [4, -1])
def test_a_path_attribute_other_than_0_to_3_gives_nan_not_a_crash(tiles):
    model = rewritten(graph(2, mask=False))
    next(a for a in model.graph.node[0].attribute if a.name == "tiles").i = tiles
    assert np.isnan(run(model, inputs(1, 5, 2, 32))).all()


@amx
def test_a_row_whose_keys_are_all_masked_gets_zeros_not_nan():
    feeds = inputs(1, 6, 2, 32)
    feeds["m"] = np.full((1, 1, 6, 6), -np.inf, dtype=np.float32)
    assert np.array_equal(run(rewritten(graph(2)), feeds), np.zeros_like(feeds["q"]))


@amx
@pytest.mark.parametrize("where", ["q", "m"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_nan_or_infinite_score_gives_its_row_nan_as_fp32_attention_does(where, value):
    """A NaN query value, or a NaN or +inf in the mask, makes the scores of that row unusable: its answer is
    NaN (onnxruntime's fp32 op gives NaN too), never a finite row that left the key out; the other rows are as
    they were."""
    feeds = inputs(1, 48, 2, 32, seed=8)
    feeds["m"] = np.zeros((1, 1, 48, 48), dtype=np.float32)
    clean = run(rewritten(graph(2)), feeds)
    if where == "q":
        feeds["q"][0, 5, 3] = value  # head 0's query of row 5
    else:
        feeds["m"][0, 0, 5, 19] = value  # row 5's score of key 19, in every head
    out = run(rewritten(graph(2)), feeds)
    heads = slice(0, 32) if where == "q" else slice(None)
    if where == "q" and np.isinf(value):  # an infinite query value gives infinite or NaN scores in its head
        assert not np.isfinite(out[0, 5, heads]).all()
    else:
        assert np.isnan(out[0, 5, heads]).all()
    rest = np.ones(48, bool)
    rest[5] = False
    np.testing.assert_array_equal(out[0, rest], clean[0, rest])


@amx
def test_a_mask_that_does_not_fit_gives_nan_not_a_read_past_it():
    feeds = inputs(1, 6, 2, 32)
    feeds["m"] = np.zeros((1, 1, 6, 5), dtype=np.float32)  # one key short
    assert np.isnan(run(rewritten(graph(2)), feeds)).all()


def test_only_a_graph_whose_build_asked_is_rewritten():
    assert attention.rewrite(_copy(graph(2, asked=False))) == 0
    model = _copy(graph(2))
    assert attention.rewrite(model) == 1
    (node,) = model.graph.node
    assert (node.op_type, node.domain, [a.name for a in node.attribute]) == (attention.OP, native.DOMAIN,
                                                                             ["num_heads", "scale", "tiles"])
    assert helper.get_attribute_value(node.attribute[2]) == attention.path()  # its path, kept for the session


@amx
def test_a_session_keeps_its_path_when_the_tiles_are_left_out_after_it_loaded(products_path):
    """Each op is told its path as its graph is rewritten: a session loaded on the tiles keeps its bits while
    graphs loaded after the tiles were left out take the AVX-512 path (they sum in a different order)."""
    if products_path != "own" or not attention.on_tiles():
        pytest.skip("no tiles to leave out on this path")
    feeds = inputs(2, 40, 2, 64, seed=5)
    model = rewritten(graph(2, mask=False))
    options = ort.SessionOptions()
    native.use_library(options)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    before = session.run(None, feeds)[0]
    with native.tiles_left_out():
        without = run(rewritten(graph(2, mask=False)), feeds)
        assert np.array_equal(session.run(None, feeds)[0], before)
    np.testing.assert_allclose(without, before, atol=1e-3, rtol=0)
    assert not np.array_equal(without, before)


@pytest.mark.parametrize("change", [dict(is_causal=1), dict(kv_num_heads=1), dict(softcap=30.0),
                                    dict(mask_type=TensorProto.BOOL)])
def test_what_the_kernel_does_not_compute_is_left_as_it_is(change):
    model = graph(2, **change)
    assert attention.rewrite(_copy(model)) == 0


def test_the_int8_precision_asks_for_it_and_its_manifest_says_so():
    int8 = precisions.get("int8")
    assert int8.attention == "bf16" and "attention" in int8.describe()
    assert precisions.get("int8-static").attention == "bf16" and "attention" not in precisions.get("fp32").describe()
    model = ask(graph(2, asked=False), ATTENTION_KEY, int8.attention)
    assert {p.key: p.value for p in model.metadata_props}[ATTENTION_KEY] == "bf16"


def split_heads(heads: int, head: int, sizes: list[int] | None = None, axis: int = -1,
                fused: str | None = None) -> onnx.ModelProto:
    """x [B, S, W] -> Split into q, k, v (`sizes`, or three equal parts) -> MultiHeadAttention -> y, as
    onnxruntime's fusion leaves an int8-static or fp32 encoder (`fused`: the Split taken into hotrod's product op
    of that name)."""
    width = heads * head
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", None, 3 * width])
    sizes_init = numpy_helper.from_array(np.array(sizes or [width] * 3, np.int64), "sizes")
    if fused:
        split = helper.make_node(fused, ["x"], ["q", "k", "v"], domain=native.DOMAIN, N=3 * width)
    else:
        split = helper.make_node("Split", ["x", "sizes"], ["q", "k", "v"], axis=axis)
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain="com.microsoft", num_heads=heads)
    model = helper.make_model(helper.make_graph([split, node], "g", [x], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, None)], [sizes_init]), opset_imports=[helper.make_opsetid("", 17),
                                                                      helper.make_opsetid("com.microsoft", 1)])
    return ask(model, ATTENTION_KEY, "bf16")


@amx
def test_multi_head_attention_on_one_fused_products_three_parts():
    """An int8-static encoder's form: query, key and value the three equal parts of one Split of the last
    axis, all [B, S, H x D]; the op reads them as they are."""
    model = split_heads(4, 32)
    out = rewritten(model)
    assert [node.op_type for node in out.graph.node] == ["Split", attention.OP]
    feeds = inputs(2, 21, 4, 32, seed=6)
    x = np.concatenate([feeds[name] for name in "qkv"], axis=-1)
    np.testing.assert_allclose(run(out, {"x": x}), reference(feeds, 4), atol=2e-3, rtol=0)
    for product in (i8.SPLIT_OP, bf16.SPLIT_OP):  # int8-static's and bf16-products' fused Q/K/V products
        assert rewritten(split_heads(4, 32, fused=product)).graph.node[-1].op_type == attention.OP


@pytest.mark.parametrize("change", [dict(sizes=[128, 96, 160]), dict(axis=1), dict(axis=0)])
def test_parts_the_kernel_cannot_read_as_the_query_are_left_as_they_are(change):
    """Keys or values not as wide as the query, or a Split of another axis (their layout unknown)."""
    assert attention.rewrite(_copy(split_heads(4, 32, **change))) == 0


def test_parts_are_taken_only_where_their_sizes_are_known_equal():
    unsized = split_heads(4, 32)  # num_outputs alone: the last part is narrower where the width does not divide
    del unsized.graph.node[0].input[1:]
    unsized.graph.node[0].attribute.append(helper.make_attribute("num_outputs", 3))
    assert attention.rewrite(_copy(unsized)) == 0
    listed = split_heads(4, 32)  # before opset 13 the sizes are an attribute: taken where they are equal
    del listed.graph.node[0].input[1:]
    listed.graph.node[0].attribute.append(helper.make_attribute("split", [128] * 3))
    assert attention.rewrite(_copy(listed)) == 1


@amx
@pytest.mark.parametrize("name", ["bert", "roberta", "distilbert"])
def test_a_loaded_int8_encoder_attends_on_the_kernel_close_to_fp32_attention(zoo, tmp_path, name, monkeypatch):
    model, plain = loaded_on_and_off(zoo, tmp_path, name, attention, monkeypatch)
    ids, mask = prompt_batch(CASES[name], (7, 4))
    fast = model(ids, attention_mask=mask).last_hidden_state
    slow = plain(ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    cosine = (fast[real] * slow[real]).sum(-1) / (fast[real].norm(dim=-1) * slow[real].norm(dim=-1))
    assert cosine.min() > 0.999
    span = mask[1].bool()  # the short row alone, unpadded: the same bits
    alone = model(ids[1:2, span], attention_mask=mask[1:2, span]).last_hidden_state
    assert np.array_equal(alone.numpy(), fast[1:2, span].numpy())


@amx
def test_a_loaded_int8_static_encoder_attends_on_the_kernel_close_to_fp32_attention(zoo, tmp_path, monkeypatch):
    """int8-static asks for it too: its QDQ graph's MultiHeadAttention on the fused product's three parts."""
    model, plain = loaded_on_and_off(zoo, tmp_path, "bert", attention, monkeypatch, precision="int8-static")
    ids, mask = prompt_batch(CASES["bert"], (7, 4))
    fast = model(ids, attention_mask=mask).last_hidden_state
    slow = plain(ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    cosine = (fast[real] * slow[real]).sum(-1) / (fast[real].norm(dim=-1) * slow[real].norm(dim=-1))
    assert cosine.min() > 0.999


@amx
@pytest.mark.parametrize("name", ["t5", "mt5"])
def test_a_loaded_int8_t5_encoder_attends_on_the_kernel_with_the_same_tokens(zoo, tmp_path, name, monkeypatch):
    out = hotrod.optimize(zoo.at_trained_scale(name), tmp_path / name, precision="int8", force=True,
                          progress=False, verify_examples=0)
    model = hotrod.load(out)
    assert attention.OP in model.backend.kernel_ops["encoder"]
    monkeypatch.setattr(attention, "available", lambda: False)
    plain = hotrod.load(out)
    ids, mask = prompt_batch(CASES[name], (7, 4))
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=8),
                       plain.generate(ids, attention_mask=mask, max_new_tokens=8))
    fast, slow = (m(ids, attention_mask=mask, decoder_input_ids=ids[:, :3]).encoder_last_hidden_state
                  for m in (model, plain))
    real = mask.bool()
    cosine = (fast[real] * slow[real]).sum(-1) / (fast[real].norm(dim=-1) * slow[real].norm(dim=-1))
    assert cosine.min() > 0.999
