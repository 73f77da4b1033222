"""The precision registry: the one list, and what each entry tells the options, the manifest and the floor.

The tables here are what hotrod said before the registry existed, so a change to them is a change to
artifacts' manifests (old artifacts must still read the same) or to the CLI's choices.
"""

from __future__ import annotations

import dataclasses

import pytest

import hotrod
from hotrod import precisions
from hotrod.errors import HotrodError
from hotrod.options import ENGINE_PRECISIONS, PRECISIONS, OptimizeOptions

PER_BLOCK = "fp32, quantized to int8 per block inside MatMulNBits (accuracy level 4)"
MANIFEST_WEIGHTS = {  # precision -> (MatMul weights and LM head, activations), calibrated with "entropy"
    "fp32": ("fp32", "fp32"),
    "fp16": ("fp16", "fp16"),
    "bf16": ("bf16", "bf16"),
    "int8": ("int8 per-channel, 7-bit range (dynamic)", "uint8 per row, symmetric, range measured on every call (dynamic)"),
    "int8-call": ("int8 per-channel, 7-bit range (int8-call, dynamic)",
                  "uint8 per-tensor, range measured on every call (dynamic)"),
    "int8-static": ("int8 per-channel, 7-bit range (int8-static, QDQ)", "uint8 per-tensor, static ranges calibrated with entropy"),
    "int8-full": ("int8 per-channel, 7-bit range (int8-full, QDQ)",
                  "uint8 per-tensor, static ranges calibrated with entropy; attention's operands int8 per row"),
    "bf16-products": ("fp32 (rounded to bf16 as the graph is loaded where the CPU has AMX-BF16 or AVX-512 BF16)",
                      "fp32, rounded to bf16 for each product where the CPU has AMX-BF16 or AVX-512 BF16"),
    "int8-weight": ("int8 block-32 symmetric (int8-weight, MatMulNBits)", PER_BLOCK),
    "int4": ("int4 block-32 symmetric (MatMulNBits)", PER_BLOCK),
    "int4-b128": ("int4 block-128 symmetric (int4-b128, MatMulNBits)", PER_BLOCK),
    "int4-b256": ("int4 block-256 symmetric (int4-b256, MatMulNBits)", PER_BLOCK),
}
WEIGHT_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0, "int8-call": 1.0, "int8-static": 1.0,
                "int8-full": 1.0, "bf16-products": 2.0,
                "int8-weight": 1.0 + 4 / 32, "int4": 0.5 + 4 / 32, "int4-b128": 0.5 + 4 / 128,
                "int4-b256": 0.5 + 4 / 256}


ENGINE_WEIGHTS = {  # precision -> the torch engine artifact's (linear weights, other weights and activations)
    "fp32": ("fp32", "fp32"),
    "fp16": ("fp16", "fp16"),
    "bf16": ("bf16", "bf16"),
    "int8-weight": ("int8 per output channel, symmetric, bf16 scales", "bf16"),
    "fp8": ("fp8 e4m3 per output channel, fp32 scales (torch._scaled_mm)", "bf16"),
}


def test_one_list_in_the_order_the_cli_shows():
    assert PRECISIONS == precisions.names(lambda p: p.onnx) == tuple(MANIFEST_WEIGHTS)
    assert ENGINE_PRECISIONS == tuple(ENGINE_WEIGHTS)
    assert precisions.names() == (*MANIFEST_WEIGHTS, "fp8")  # fp8 is the torch engine's only


def test_each_engine_precision_describes_its_artifacts_weights():
    for name, (linear, other) in ENGINE_WEIGHTS.items():
        assert precisions.get(name).describe_engine() == {"linear_weights": linear, "other_weights": other,
                                                           "activations": other}


ENGINE_CASTS = {  # precision -> (the engine's torch dtype, how it stores linear weights, measured fp32 islands)
    "fp32": ("float32", precisions.CAST, False),
    "fp16": ("float16", precisions.CAST, True),
    "bf16": ("bfloat16", precisions.CAST, False),
    "int8-weight": ("bfloat16", precisions.INT8_PER_CHANNEL, False),
    "fp8": ("bfloat16", precisions.FP8_PER_CHANNEL, False),
}


def test_what_the_static_engine_reads_of_each_precision():
    """The engine, its builds and `hotrod.load` ask these fields, never a precision's name."""
    engine = {p.name: (p.torch_dtype, p.engine_linears, p.measures_islands) for p in precisions.REGISTRY.values()
              if p.engine}
    assert engine == ENGINE_CASTS
    others = [p for p in precisions.REGISTRY.values() if not p.engine]
    assert not any(p.torch_dtype or p.engine_linears or p.measures_islands for p in others)
    with pytest.raises(ValueError, match="torch_dtype"):
        precisions.Full(name="fp64", weight_bytes=8.0, engine=True)
    with pytest.raises(ValueError, match="engine_linears"):
        precisions.Full(name="fp32", weight_bytes=4.0, engine=True, torch_dtype="float32", engine_linears="int3")


def test_the_engine_refuses_onnxruntimes_precisions_and_fp8_off_its_gpus():
    assert precisions.get("int4").engine_refusal("cuda").startswith("int4 is onnxruntime's (quantized graphs)")
    assert precisions.get("fp8").engine_refusal("cpu").startswith("fp8 runs through torch._scaled_mm")
    assert all(precisions.get(name).engine_refusal("cpu") is None for name in ENGINE_PRECISIONS if name != "fp8")


def test_each_precision_describes_itself_as_manifests_always_have():
    for name, (weights, activations) in MANIFEST_WEIGHTS.items():
        attention = {"attention": "bf16 products where the CPU has AMX-BF16 or AVX-512 (hotrod's kernel), fp32 elsewhere"}
        int8_attention = {"attention": "int8 products where the CPU has AVX-512 VNNI (hotrod's kernel: Q, K and V per "
                                       "row, the softmax's numerators uint8 per row), bf16 where it has AVX-512 or "
                                       "AMX-BF16 only, fp32 elsewhere"}
        products = {"products": "bf16 operands, fp32 sums, where the CPU has AMX-BF16 or AVX-512 BF16 (hotrod's kernel), "
                                "fp32 elsewhere"}
        assert precisions.get(name).describe("entropy") == {
            "matmul_weights": weights, "lm_head": weights, "embeddings": "fp32", "activations": activations,
            **(attention if name in ("int8", "int8-static", "bf16-products") else {}),
            **(int8_attention if name == "int8-full" else {}),
            **(products if name == "bf16-products" else {})}
    with pytest.raises(ValueError, match="attention"):
        precisions.Full(name="fp32", weight_bytes=4.0, attention="int4")
    with pytest.raises(ValueError, match="products"):
        precisions.Full(name="fp32", weight_bytes=4.0, products="int4")


def test_what_the_pipeline_and_the_floor_read():
    assert precisions.names(lambda p: p.needs_feeds) == ("fp16", "bf16", "int8-static", "int8-full")
    assert precisions.names(lambda p: not p.converts) == ("fp32",)
    assert precisions.names(lambda p: p.candidate) == ("fp32", "fp16", "bf16", "int8", "int8-static", "bf16-products",
                                                       "int4", "int4-b128", "int4-b256")
    assert {name: precisions.get(name).weight_bytes for name in PRECISIONS} == WEIGHT_BYTES
    assert precisions.names(lambda p: p.compute == "int8") == ("int8", "int8-call", "int8-static", "int8-full",
                                                                    "int8-weight", "int4", "int4-b128", "int4-b256")
    assert precisions.names(lambda p: p.compute == "half") == ("fp16", "bf16", "bf16-products")


def test_only_half_and_hotrods_bf16_products_ask_for_kernels():
    assert all(precisions.get(name).has_kernels("cpu") for name in PRECISIONS
               if name not in ("fp16", "bf16", "bf16-products"))


def test_bf16_products_ask_for_hotrods_kernels_where_the_cpu_has_them(monkeypatch):
    from hotrod.runtime import bf16

    chosen = precisions.get("bf16-products")
    model, extra = chosen.lower(_graph())
    assert extra == {} and {p.key: p.value for p in model.metadata_props} == {
        precisions.ATTENTION_KEY: "bf16", precisions.PRODUCTS_KEY: "bf16"}
    assert not chosen.has_kernels("cuda")
    monkeypatch.setattr(bf16, "available", lambda: False)
    assert not chosen.has_kernels("cpu") and "AMX-BF16" in chosen.cpu_refusal()


def _graph():
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    return helper.make_model(graph)


@pytest.mark.parametrize("call, message", [
    (lambda: precisions.get("fp4"), "unknown precision 'fp4'; choose from fp32, fp16, bf16, int8, int8-call, int8-static, int8-full"),
    (lambda: precisions.half("int8"), "unknown half precision 'int8'; choose from fp16, bf16"),
])
def test_an_unknown_name_lists_the_known_ones(call, message):
    with pytest.raises(HotrodError, match=message):
        call()


def test_fp32_leaves_a_graph_as_it_is():
    sentinel = object()
    assert precisions.get("fp32").lower(sentinel) == (sentinel, {})


# -- the options object of `hotrod.optimize` ------------------------------------------------------------


def test_keyword_arguments_become_the_options_object():
    base = OptimizeOptions(precision="int8", verify_examples=4)
    assert OptimizeOptions.of(None, precision="int8", verify_examples=4) == base
    assert OptimizeOptions.of(base) is base
    assert OptimizeOptions.of(base, max_drop=0.5) == dataclasses.replace(base, max_drop=0.5)
    assert base.export().to_dict() == {"precision": "int8", "device": "cpu", "opset": base.export().opset,
                                       "fusion": True, "calibration_method": "minmax", "backend": "onnxruntime"}
    assert OptimizeOptions(precision="fp16", backend="torch").export().to_dict() == {
        "backend": "torch", "precision": "fp16", "device": "cpu"}
    assert OptimizeOptions(precision="auto").export().precision == "fp32"
    with pytest.raises(TypeError):
        OptimizeOptions.of(None, precison="int8")
    with pytest.raises(HotrodError, match="must be an OptimizeOptions"):
        hotrod.optimize("unused", "unused", "int8")  # type: ignore[arg-type]


@pytest.mark.parametrize("changes, message", [
    ({"precision": "fp4"}, "unknown precision 'fp4'"),
    ({"precision": "fp8"}, "fp8 is the torch engine's precision"),
    ({"device": "tpu"}, "unknown device 'tpu'"),
    ({"calibration_method": "kl"}, "unknown calibration method 'kl'"),
    ({"backend": "torch", "precision": "int8-static"}, "int8-static is onnxruntime's"),
    ({"precision": "bf16-products", "device": "cuda"}, "bf16-products is built for cpu only; on cuda choose among fp32,"),
    ({"backend": "tensorflow"}, "unknown backend"),
    ({"verify_examples": -1}, "verify_examples must be >= 0"),
    ({"verify_examples": 2.5}, "verify_examples must be a whole number"),
    ({"precision": "auto", "verify_examples": 0}, "verify_examples with precision 'auto' must be >= 1"),
    ({"max_drop": 2}, "max_drop must be <= 1"),
    ({"max_drop": float("nan")}, "max_drop must be a finite number"),
])
def test_bad_options_are_one_line_at_construction(changes, message):
    with pytest.raises(HotrodError, match=message):
        OptimizeOptions(**changes)
