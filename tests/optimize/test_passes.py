"""Fusion and quantization passes, on every family of the table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import hotrod
from hotrod.kinds import spec as kind_spec
from hotrod.optimize.quantize import prune_initializers
from tests.zoo import CASES, LAYERS, prompt_batch

# The fused operators each family's graphs must contain (ONNX Runtime's optimizer output). On the CPU,
# residual + norm and bias + GELU stay standard ops (`hotrod.optimize.fusion.SLOWER_ON_CPU`).
EXPECTED_FUSIONS = {
    "gpt2": {"LayerNormalization", "FastGelu"},
    "t5": {"SimplifiedLayerNormalization"},
    "mt5": {"SimplifiedLayerNormalization", "FastGelu"},
    "bert": {"LayerNormalization", "FastGelu"},
    "roberta": {"LayerNormalization", "FastGelu"},
    "xlm-roberta": {"LayerNormalization", "FastGelu"},
    "electra": {"LayerNormalization", "FastGelu"},
    "distilbert": {"LayerNormalization", "FastGelu"},
    "modernbert": {"LayerNormalization", "Gelu", "RotaryEmbedding"},
    "mpnet": {"LayerNormalization", "Gelu"},
    "deberta-v2": {"LayerNormalization", "Gelu"},
    "bart": {"LayerNormalization", "Gelu"},
    "mbart": {"LayerNormalization", "Gelu"},
    "marian": {"LayerNormalization"},  # swish: no fused op of its own
    "m2m_100": {"LayerNormalization"},  # relu
    "pegasus": {"LayerNormalization"},  # relu
}
# Encoder-decoders whose encoder self-attention reads K and V split into heads (T5's relative positions go
# with it): its MultiHeadAttention stays; the BART-like encoders' becomes ONNX's Attention on the CPU.
HEADS_SPLIT_ENCODERS = {"t5", "mt5"}
SLOWER_ON_CPU = {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "BiasGelu"}
# ... except in the graph that runs every decoding step, where residual + RMS norm are fused (fewer nodes a step).
STEP_FUSIONS = {"SkipSimplifiedLayerNormalization"}
# Logit (or hidden state) cosine to fp32 each precision must keep on the tiny random models.
MIN_COSINE = {"int8": 0.999, "int4": 0.95}
QUANTIZED_OPS = {"int8": {"DynamicQuantizeMatMul", "MatMulInteger"}, "int4": {"MatMulNBits"},
                 "int4-b128": {"MatMulNBits"}, "int4-b256": {"MatMulNBits"}}
BLOCK_SIZE = {"int4": 32, "int4-b128": 128, "int4-b256": 256}


def graph_ops(path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path)).graph.node}


def test_every_family_has_expected_fusions():
    assert {case.family for case in CASES.values()} <= set(EXPECTED_FUSIONS)


def test_fused_op_counts_are_recorded_and_present(zoo, case):
    artifact = zoo.artifact(case)
    graphs = json.loads((artifact / "manifest.json").read_text())["graphs"]
    expected = EXPECTED_FUSIONS[CASES[case].family]
    for name, entry in graphs.items():
        counts = entry["fused_ops"]
        assert counts, f"{name} has no fused operators"
        ops = graph_ops(artifact / entry["file"])
        assert set(counts) <= ops
        assert expected & set(counts), f"{name}: expected some of {expected}, got {counts}"
        steps = name == kind_spec(CASES[case].kind).step_graph
        slower = SLOWER_ON_CPU - STEP_FUSIONS if steps else SLOWER_ON_CPU
        assert not slower & ops, f"{name}: a fusion whose CPU kernel is slower than the plain ops"
        if steps and "SimplifiedLayerNormalization" in graphs[name]["fused_ops"]:
            assert STEP_FUSIONS & ops, f"{name}: a decoding step's residual adds and RMS norms are fused"
    layer_norms = sum(graphs[g]["fused_ops"].get("LayerNormalization", 0) for g in graphs)
    if CASES[case].family in ("gpt2", "bert", "roberta", "xlm-roberta", "electra", "distilbert"):
        assert layer_norms >= 2 * 2 + 1  # two per layer and the final (or embedding) one, for the 2-layer models


def test_a_gpu_build_keeps_the_fused_norms(zoo, tmp_path):
    out = hotrod.optimize(zoo.checkpoint("gpt2"), tmp_path / "gpu", device="cuda", verify_examples=0, progress=False)
    fused = json.loads((out / "manifest.json").read_text())["graphs"]["decoder"]["fused_ops"]
    assert fused.get("SkipLayerNormalization", 0) >= 2 * 2 - 1  # two per layer, less the first


def test_attention_is_one_fused_node_per_attention_block(zoo, case):
    """Each attention block is one attention node fed by one QKV MatMul: a GroupQueryAttention over the
    in-place cache for a decoder step's self-attention, ONNX's Attention for an encoder model's
    self-attention and a BART-like encoder's (the zoo builds for the CPU, `hotrod.optimize.fusion.onnx_attention`),
    a MultiHeadAttention everywhere else (T5's encoder, whose k and v reach it as [B, N, S, H], a
    seq2seq model's first step and every cross-attention)."""
    artifact = zoo.artifact(case)
    graphs = json.loads((artifact / "manifest.json").read_text())["graphs"]
    config = CASES[case].config()
    layers = getattr(config, "num_hidden_layers", None) or config.num_layers
    decoder_layers = getattr(config, "num_decoder_layers", None) or getattr(config, "decoder_layers", None) or layers
    expected = {  # graph: (GroupQueryAttention, MultiHeadAttention, Attention)
        "encoder": (0, 0, layers), "decoder_init": (0, 2 * decoder_layers, 0),
        "decoder": (decoder_layers, decoder_layers, 0)}
    if CASES[case].kind == "decoder":
        expected["decoder"] = (layers, 0, 0)
    if CASES[case].kind == "seq2seq" and CASES[case].family in HEADS_SPLIT_ENCODERS:
        expected["encoder"] = (0, layers, 0)
    for name, entry in graphs.items():
        counts = tuple(entry["fused_ops"].get(op, 0) for op in ("GroupQueryAttention", "MultiHeadAttention", "Attention"))
        assert counts == expected[name], name
        model = onnx.load(str(artifact / entry["file"]))
        assert "Softmax" not in {n.op_type for n in model.graph.node}
        producers = {out: node for node in model.graph.node for out in node.output}
        for node in (n for n in model.graph.node if n.op_type.endswith("Attention")):
            query = producers[node.input[0]]
            if node.op_type == "GroupQueryAttention":  # fed the QKV projection itself, packed
                assert not node.input[1] and not node.input[2] and query.op_type != "Split", query.op_type
            elif node.op_type == "Attention":  # q, k and v: the parts of one Split of the QKV projection,
                parts = [_unrotated(name, producers) for name in node.input[:3]]  # q and k perhaps rotated
                query = producers[parts[0]]
                assert query.op_type == "Split" and list(query.output) == parts, query.op_type
            else:
                if query.op_type == "Reshape":  # a cross Q: the rows folded onto their sources' query axis
                    query = producers[query.input[0]]
                if query.op_type == "Add":  # a projection with a bias (the BART-like cross Q): its MatMul before it
                    query = next(producers[name] for name in query.input if name in producers)
                assert query.op_type in ("Split", "MatMul"), query.op_type  # Split of one QKV MatMul, or cross Q


def _unrotated(name: str, producers: dict) -> str:
    node = producers.get(name)
    return node.input[0] if node is not None and node.op_type == "RotaryEmbedding" else name


def test_rotary_embeddings_are_one_node_per_query_and_key(zoo):
    graphs = json.loads((zoo.artifact("modernbert") / "manifest.json").read_text())["graphs"]
    assert graphs["encoder"]["fused_ops"]["RotaryEmbedding"] == 2 * CASES["modernbert"].config().num_hidden_layers


def test_info_lists_fused_ops(zoo, capsys):
    from hotrod.cli import main

    assert main(["info", str(zoo.artifact("gpt2"))]) == 0
    assert "LayerNormalization x" in capsys.readouterr().out


def test_no_fusion_option_keeps_the_plain_graph(zoo, tmp_path):
    out = hotrod.optimize(zoo.checkpoint("gpt2"), tmp_path / "plain", fusion=False, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["fusion"] is False
    fused = manifest["graphs"]["decoder"]["fused_ops"]
    assert fused.get("GroupQueryAttention") == LAYERS  # the exporter's own, there either way
    assert not {"SkipLayerNormalization", "FastGelu", "BiasGelu"} & set(fused)
    assert "SkipLayerNormalization" not in graph_ops(out / "decoder.onnx")


def _outputs(model, case_name):
    case = CASES[case_name]
    ids, mask = prompt_batch(case, (6, 4))
    if case.kind == "encoder":
        return model(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    if case.kind == "seq2seq":
        return model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :3]).logits
    return model(input_ids=ids, attention_mask=mask).logits[mask.bool()]


@pytest.fixture(scope="module")
def quantized(zoo, tmp_path_factory):
    """(case, precision) -> its artifact; precision "fp32" gives the reference the others are judged against."""
    made = {}

    def build(case_name: str, precision: str):
        checkpoint = zoo.at_trained_scale(case_name)
        if precision == "fp32" and checkpoint == zoo.checkpoint(case_name):
            return zoo.artifact(case_name)
        if (case_name, precision) not in made:
            out = tmp_path_factory.mktemp(f"{case_name}-{precision}")
            made[case_name, precision] = hotrod.optimize(checkpoint, out, precision=precision, force=True,
                                                         progress=False, verify_examples=0)
        return made[case_name, precision]

    return build


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("case_name", ["gpt2", "t5_v1_1", "bert", "modernbert", "bart", "mbart", "marian", "m2m_100",
                                       "pegasus"])
def test_quantized_outputs_stay_within_tolerance(zoo, quantized, case_name, precision):
    artifact = quantized(case_name, precision)
    reference = _outputs(hotrod.load(quantized(case_name, "fp32")), case_name)
    actual = _outputs(hotrod.load(artifact), case_name)
    cosine = torch.nn.functional.cosine_similarity(reference.flatten(), actual.flatten(), dim=0)
    assert cosine >= MIN_COSINE[precision]
    assert not torch.equal(reference, actual), "quantization changed nothing"


@pytest.mark.parametrize("precision", ["int8", "int4", "int4-b128", "int4-b256"])
def test_quantized_artifact_holds_quantized_weights_only(zoo, quantized, precision):
    artifact = quantized("gpt2", precision)
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["options"]["precision"] == precision
    assert manifest["weights"]["embeddings"] == "fp32" and precision in manifest["weights"]["lm_head"]
    ops = graph_ops(artifact / "decoder.onnx")
    assert ops & QUANTIZED_OPS[precision]
    if precision in BLOCK_SIZE:
        blocks = {helper.get_attribute_value(a) for node in onnx.load(str(artifact / "decoder.onnx")).graph.node
                  if node.op_type == "MatMulNBits" for a in node.attribute if a.name == "block_size"}
        assert blocks == {BLOCK_SIZE[precision]}
    fp32_size = (zoo.artifact("gpt2") / "decoder.onnx").stat().st_size
    if BLOCK_SIZE.get(precision, 0) <= CASES["gpt2"].config().n_embd:  # a wider block pads the tiny rows out
        assert (artifact / "decoder.onnx").stat().st_size < 0.6 * fp32_size  # the fp32 originals are gone
    ids, mask = prompt_batch(CASES["gpt2"], (5, 3))
    out = hotrod.load(artifact).generate(ids, attention_mask=mask, max_new_tokens=4, num_beams=2)
    assert out.shape[0] == 2 and out.shape[1] <= 9


def _session_ops(path) -> set[str]:
    """The op types of the graph as onnxruntime runs it, after its own optimizations at session start."""
    import tempfile

    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as scratch:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(Path(scratch) / "placed.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return {n.op_type for n in onnx.load(options.optimized_model_filepath, load_external_data=False).graph.node}


@pytest.mark.parametrize(("precision", "converted", "fused"), [
    ("int8", True, "MatMulIntegerToFloat"),  # per-row activation scales: fused at opset 23
    ("int8-call", True, "DynamicQuantizeMatMul"),  # onnxruntime's per-call quantization: fused too
    ("int4", True, "MatMulNBits"),
    ("int8-static", False, "MatMulIntegerToFloat"),  # QDQ graphs keep opset 17: see hotrod.optimize.fusion
])
def test_cpu_encoders_get_onnx_attention_where_their_precision_allows(zoo, quantized, precision, converted, fused):
    artifact = quantized("bert", precision)
    model = onnx.load(str(artifact / "encoder.onnx"), load_external_data=False)
    ops = {n.op_type for n in model.graph.node}
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    assert (("Attention" in ops, "MultiHeadAttention" in ops, opset) ==
            ((True, False, 23) if converted else (False, True, 17)))
    counts = json.loads((artifact / "manifest.json").read_text())["graphs"]["encoder"]["fused_ops"]
    assert counts.get("Attention" if converted else "MultiHeadAttention") == LAYERS
    running = _session_ops(artifact / "encoder.onnx")
    assert fused in running and "MatMulInteger" not in running


def test_prune_initializers_drops_only_unused_weights():
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    used = numpy_helper.from_array(np.ones((2, 2), np.float32), "used")
    unused = numpy_helper.from_array(np.ones((2, 2), np.float32), "unused")
    node = helper.make_node("MatMul", ["x", "used"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], [used, unused])
    pruned = prune_initializers(helper.make_model(graph))
    assert [t.name for t in pruned.graph.initializer] == ["used"]


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("case_name", ["gpt2", "t5_v1_1", "bert", "modernbert", "bart", "mbart", "marian", "m2m_100",
                                       "pegasus"])
def test_no_weight_escapes_quantization(quantized, case_name, precision):
    """Every MatMul left in fp32 multiplies two activations (attention is inside the fused op)."""
    artifact = quantized(case_name, precision)
    for graph in artifact.glob("*.onnx"):
        model = onnx.load(str(graph))
        constants = {t.name for t in model.graph.initializer}
        constants |= {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
        fp32_weights = [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in constants]
        assert not fp32_weights, f"{graph.name}: {fp32_weights}"


def _split_into_attention(sizes, extra_reader=False, axis=-1, k_is_output=False) -> onnx.ModelProto:
    """qkv -> Split(sizes) -> GroupQueryAttention, as the exporter writes it; optionally a second reader of k."""
    nodes = [helper.make_node("Split", ["qkv", "sizes"], ["q", "k", "v"], axis=axis),
             helper.make_node("GroupQueryAttention", ["q", "k", "v", "past_k", "past_v", "seqlens", "total"],
                              ["out", "present_k", "present_v"], domain="com.microsoft", num_heads=2, kv_num_heads=2)]
    if extra_reader:
        nodes.append(helper.make_node("Identity", ["k"], ["k_copy"]))
    outputs = [helper.make_tensor_value_info("k", onnx.TensorProto.FLOAT, None)] if k_is_output else []
    graph = helper.make_graph(nodes, "g", [], outputs, initializer=[
        onnx.numpy_helper.from_array(np.array(sizes, np.int64), "sizes")])
    return helper.make_model(graph)


@pytest.mark.parametrize(("sizes", "extra_reader", "axis", "k_is_output", "packs"), [
    ((16, 16, 16), False, -1, False, True),
    ((16, 16, 16), False, 2, False, True),
    ((16, 8, 8), False, -1, False, False),  # grouped heads: not the op's packed layout here
    ((16, 16, 16), True, -1, False, False),  # k is read elsewhere too
    ((16, 16, 16), False, -1, True, False),  # k is a graph output
    ((16, 16, 16), False, 1, False, False),  # not the hidden axis
])
def test_pack_qkv_folds_only_an_equal_split_nothing_else_reads(sizes, extra_reader, axis, k_is_output, packs):
    from hotrod.optimize.fusion import pack_qkv

    model = pack_qkv(_split_into_attention(sizes, extra_reader, axis, k_is_output))
    attention = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    ops = [n.op_type for n in model.graph.node]
    if packs:
        assert list(attention.input[:3]) == ["qkv", "", ""] and "Split" not in ops
        assert not model.graph.initializer  # the split's sizes went with it
    else:
        assert list(attention.input[:3]) == ["q", "k", "v"] and "Split" in ops


def _self_attention(sizes=(16, 16, 16), bias=True, padding_mask=False, present=False, unidirectional=0,
                    extra_nodes=(), scale=0.25) -> onnx.ModelProto:
    """x -> Split(sizes) -> MultiHeadAttention(q, k, v[, bias]) -> y, in opset 17."""
    f32 = onnx.TensorProto.FLOAT
    inputs = ["q", "k", "v", "", "mask" if padding_mask else "", "bias" if bias else ""]
    outputs = ["y", "present_k", "present_v"] if present else ["y"]
    nodes = [helper.make_node("Split", ["x", "sizes"], ["q", "k", "v"], axis=-1),
             helper.make_node("MultiHeadAttention", inputs, outputs, domain="com.microsoft", num_heads=2,
                              scale=scale, unidirectional=unidirectional), *extra_nodes]
    graph_inputs = [helper.make_tensor_value_info("x", f32, [2, 5, sum(sizes)])]
    if bias:
        graph_inputs.append(helper.make_tensor_value_info("bias", f32, [2, 1, 5, 5]))
    if padding_mask:
        graph_inputs.append(helper.make_tensor_value_info("mask", onnx.TensorProto.INT32, [2, 5]))
    graph = helper.make_graph(nodes, "g", graph_inputs, [helper.make_tensor_value_info(o, f32, None) for o in outputs],
                              initializer=[onnx.numpy_helper.from_array(np.array(sizes, np.int64), "sizes")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def _run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], feeds)[0]


@pytest.mark.parametrize(("bias", "scale"), [(True, 0.25), (False, 0.25), (True, 0.0)])  # 0: 1/sqrt(head size)
def test_onnx_attention_computes_what_multihead_attention_did(bias, scale):
    from hotrod.optimize.fusion import onnx_attention

    rng = np.random.default_rng(0)
    mask = np.where(rng.random((2, 1, 5, 5)) < 0.3, -1e4, 0.0).astype(np.float32)  # some keys masked per row
    feeds = {"x": rng.standard_normal((2, 5, 48)).astype(np.float32), **({"bias": mask} if bias else {})}
    before = _run(_self_attention(bias=bias, scale=scale), feeds)
    model = onnx_attention(_self_attention(bias=bias, scale=scale))
    attention = [n for n in model.graph.node if n.op_type == "Attention"]
    assert len(attention) == 1 and attention[0].domain == ""
    assert "MultiHeadAttention" not in {n.op_type for n in model.graph.node}
    assert next(o.version for o in model.opset_import if o.domain == "") == 23
    np.testing.assert_allclose(_run(model, feeds), before, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", [
    {"sizes": (16, 8, 8)},  # q, k, v of other widths (grouped heads)
    {"padding_mask": True},  # a key padding mask: the contrib op's own input
    {"present": True},  # a KV cache out
    {"unidirectional": 1},  # causal
    {"extra_nodes": (helper.make_node("DequantizeLinear", ["y", "s"], ["d"]),)},  # static int8's QDQ
])
def test_onnx_attention_leaves_what_it_cannot_convert(variant):
    from hotrod.optimize.fusion import onnx_attention

    model = onnx_attention(_self_attention(**variant))
    assert "MultiHeadAttention" in {n.op_type for n in model.graph.node}
    assert next(o.version for o in model.opset_import if o.domain == "") == 17


def test_onnx_attention_moves_reduction_axes_to_inputs_at_the_bump():
    """From opset 18 a reduction takes its axes as an input: the bump rewrites it, and it computes the same."""
    import onnxruntime as ort

    from hotrod.optimize.fusion import onnx_attention

    def graph() -> onnx.ModelProto:
        model = _self_attention(extra_nodes=(helper.make_node("ReduceMax", ["y"], ["m"], axes=[-1], keepdims=1),))
        model.graph.output.append(helper.make_tensor_value_info("m", onnx.TensorProto.FLOAT, None))
        return model

    def run(model: onnx.ModelProto) -> np.ndarray:
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["m"], feeds)[0]

    feeds = {"x": np.random.default_rng(1).standard_normal((2, 5, 48)).astype(np.float32),
             "bias": np.zeros((2, 1, 5, 5), np.float32)}
    model = onnx_attention(graph())
    assert next(o.version for o in model.opset_import if o.domain == "") == 23
    node = next(n for n in model.graph.node if n.op_type == "ReduceMax")
    assert len(node.input) == 2 and not [a for a in node.attribute if a.name == "axes"]
    np.testing.assert_array_equal(run(model), run(graph()))


def test_onnx_attention_names_the_parts_of_a_split_without_sizes():
    """From opset 18 a Split with no sizes must say how many parts it makes; the bump adds it."""
    from hotrod.optimize.fusion import onnx_attention

    plain = helper.make_node("Split", ["x"], ["a", "b"], axis=1)
    model = onnx_attention(_self_attention(extra_nodes=(plain,)))
    split = next(n for n in model.graph.node if list(n.output) == ["a", "b"])
    assert helper.get_attribute_value(next(a for a in split.attribute if a.name == "num_outputs")) == 2
    assert "Attention" in {n.op_type for n in model.graph.node}
