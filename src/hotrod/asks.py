"""What a build asks of the loader through a graph's properties: the arithmetic of the CPU kernels that change a
graph's answers (bf16 attention, bf16 products). The precisions write it (`hotrod.precisions`), so the build's
verification, which loads the graph as a user would, measures it; the kernels read it where the CPU runs them
(`hotrod.runtime.attention`, `hotrod.runtime.bf16`). Neither side imports the other for it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

PLAIN = "fp32"  # onnxruntime's own arithmetic: nothing asked
# Attention products: fp32 (onnxruntime's kernel), bf16 (hotrod's, on AMX tiles where the CPU has AMX-BF16, on
# AVX-512 without them) or int8 (hotrod's, on AVX-512 VNNI; bf16's path on a CPU without VNNI).
ATTENTION_KEY = "hotrod.attention"
ATTENTIONS = (PLAIN, "bf16", "int8")
# An fp32 graph's products: fp32 (onnxruntime's) or bf16 (hotrod's, on AMX-BF16 tiles).
PRODUCTS_KEY = "hotrod.products"
PRODUCTS = (PLAIN, "bf16")


def ask(model: onnx.ModelProto, key: str, arithmetic: str) -> onnx.ModelProto:
    """`model` asking for `arithmetic` where it is loaded, under `key` (ATTENTION_KEY or PRODUCTS_KEY; nothing for
    fp32)."""
    if arithmetic != PLAIN:
        from onnx import helper

        helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, key: arithmetic})
    return model
