"""hotrod's Bf16AttentionQuantized: an int8-static graph's attention whose one reader is the output projection's
QuantizeLinear, the answers quantized inside the kernel, to the bit as Bf16Attention followed by onnxruntime's
QuantizeLinear; taken only where that node quantizes to uint8 with one constant scale and zero point."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hotrod.runtime import attention, native
from tests.runtime.test_attention import amx, graph, inputs, padding_mask, run
from tests.runtime.test_rows import _copy

pytestmark = pytest.mark.usefixtures("products_path")  # on the tiles and without them


def quantized(heads: int, scale: float | np.ndarray, zero_point: int, mask: bool = True,
              also_float: bool = False) -> onnx.ModelProto:
    """graph(heads) with its output y quantized to uint8 (the output yq); `also_float` keeps y an output too."""
    model = graph(heads, mask=mask)
    scale = np.asarray(scale, np.float32)
    model.graph.initializer.extend([numpy_helper.from_array(scale, "s"),
                                    numpy_helper.from_array(np.full(scale.shape, zero_point, np.uint8), "z")])
    model.graph.node.append(helper.make_node("QuantizeLinear", ["y", "s", "z"], ["yq"],
                                             **({"axis": -1} if scale.ndim else {})))
    if not also_float:
        del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("yq", TensorProto.UINT8, None))
    return model


def folded(model: onnx.ModelProto) -> onnx.ModelProto:
    out = _copy(model)
    assert attention.rewrite(out) == 1 and attention.quantize_static(out) == 1
    assert [(n.op_type, n.domain) for n in out.graph.node] == [(attention.QUANTIZED_OP, native.DOMAIN)]
    return out


def unfolded(model: onnx.ModelProto) -> onnx.ModelProto:
    out = _copy(model)
    assert attention.rewrite(out) == 1
    return out


@amx
@pytest.mark.parametrize("batch,seq,heads,head,masked", [
    (1, 1, 2, 64, True), (2, 5, 3, 32, True), (1, 17, 2, 48, False), (3, 65, 2, 16, True), (1, 130, 2, 100, False),
])
@pytest.mark.parametrize("scale,zero_point", [(0.01, 128), (0.003, 0), (0.05, 255), (1e-4, 17)])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_same_bits_as_bf16_attention_then_quantize_linear(batch, seq, heads, head, masked, scale, zero_point,
                                                               threads):
    """Scales that keep the answers in range, and ones that saturate them (1e-4) or clamp them at 0 and 255."""
    feeds = inputs(batch, seq, heads, head, seed=seq)
    if masked:
        feeds["m"] = padding_mask([seq - i for i in range(batch)], seq)
    model = quantized(heads, scale, zero_point, mask=masked)
    ours = run(folded(model), feeds, threads=threads)
    theirs = run(unfolded(model), feeds, threads=threads)  # Bf16Attention, then onnxruntime's QuantizeLinear
    assert ours.dtype == np.uint8 and np.array_equal(ours, theirs)


@amx
def test_a_row_is_the_same_alone_and_in_a_padded_batch():
    model = folded(quantized(4, 0.02, 120))
    batch = inputs(3, 70, 4, 64, seed=3)
    batch["m"] = padding_mask([9, 70, 33], 70)
    together = run(model, batch)
    for row, length in enumerate([9, 70, 33]):
        alone = {name: np.ascontiguousarray(batch[name][row:row + 1, :length]) for name in "qkv"}
        alone["m"] = padding_mask([length], length)
        assert np.array_equal(run(model, alone), together[row:row + 1, :length])


@amx
def test_a_mask_that_does_not_fit_gives_the_zero_point():
    feeds = inputs(1, 6, 2, 32)
    feeds["m"] = np.zeros((1, 1, 6, 5), dtype=np.float32)  # one key short
    assert (run(folded(quantized(2, 0.01, 77)), feeds) == 77).all()


@pytest.mark.parametrize("change", ["per_channel", "also_float", "int8"])
def test_a_quantize_linear_the_kernel_does_not_do_is_left_as_it_is(change):
    """Per-channel scales, floats the graph also outputs, or int8 rather than uint8: the node stays."""
    if change == "per_channel":
        model = quantized(2, np.full(64, 0.01), 128)
    else:
        model = quantized(2, 0.01, 128, also_float=change == "also_float")
    if change == "int8":
        model.graph.initializer[-1].CopyFrom(numpy_helper.from_array(np.array(3, np.int8), "z"))
    out = _copy(model)
    assert attention.rewrite(out) == 1 and attention.quantize_static(out) == 0
    assert [n.op_type for n in out.graph.node] == [attention.OP, "QuantizeLinear"]
