"""The int8 products' GELU epilogue (`hotrod/native/gelu.h`) against onnxruntime's own Gelu, to the bit: a
sweep over every range of float32 (one bit pattern in 4,099), and every float around the erf's split between
its polynomial and its exponential side and around its clamp, both signs, with zeros, subnormals, infinities
and NaN. int8-static's GELU (`gelu_static.h`, a table within a bound of it, the bytes checked against a margin)
against onnxruntime's Gelu and QuantizeLinear, byte for byte, over the same floats and over quotients crowded
around the half-way points where the margin sends a group back to the exact arithmetic."""

from __future__ import annotations

import ctypes

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from hotrod.runtime import i8, native
from tests.runtime.test_i8 import GELUS

amx = pytest.mark.skipif(not i8.available(), reason="no AMX here: onnxruntime's ops run the products")


def _all_around(low: float, high: float) -> np.ndarray:
    """Every float32 in [low, high] and its negation."""
    start, stop = np.array([low, high], np.float32).view(np.uint32)
    values = np.arange(start, stop + 1, dtype=np.uint32).view(np.float32)
    return np.concatenate([values, -values])


def _inputs() -> np.ndarray:
    sweep = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    split, clamp = 0.921875 * np.sqrt(2), 3.925 * np.sqrt(2)  # |x / sqrt 2| at the split and at the clamp
    special = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-38, np.inf, -np.inf, np.nan, 3e38, -3e38], np.float32)
    return np.concatenate([sweep, _all_around(split * 0.98, split * 1.02), _all_around(clamp * 0.995, clamp * 1.005),
                           special]).astype(np.float32)


def _onnxruntime(x: np.ndarray, attrs: dict, quantized: tuple[float, int] | None = None) -> np.ndarray:
    """onnxruntime's Gelu of x; then its QuantizeLinear to uint8 at (scale, zero point) where `quantized` says."""
    attrs = dict(attrs)
    domain = attrs.pop("domain", "")
    nodes, initializers, out = [helper.make_node("Gelu", ["x"], ["y"], domain=domain, **attrs)], [], TensorProto.FLOAT
    if quantized is not None:
        nodes.append(helper.make_node("QuantizeLinear", ["y", "s", "z"], ["q"]))
        initializers = [helper.make_tensor("s", TensorProto.FLOAT, [], [quantized[0]]),
                        helper.make_tensor("z", TensorProto.UINT8, [], [quantized[1]])]
        out = TensorProto.UINT8
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info(nodes[-1].output[0], out, [None])], initializers)
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@amx
@pytest.mark.parametrize("gelu", GELUS.values(), ids=GELUS.keys())
def test_the_epilogues_gelu_is_onnxruntimes_over_every_range_to_the_bit(gelu):
    x = _inputs()
    ours = np.empty_like(x)
    function = ctypes.CDLL(str(native.library())).hotrod_gelu_values
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    assert function(x.ctypes.data, x.size, ours.ctypes.data) == 0
    theirs = _onnxruntime(x, gelu)
    same = (ours.view(np.uint32) == theirs.view(np.uint32)) | (np.isnan(ours) & np.isnan(theirs))
    assert same.all(), f"{(~same).sum()} values differ, first at x = {x[~same][:3]}"


def _library() -> ctypes.CDLL:
    library = ctypes.CDLL(str(native.library()))
    library.hotrod_gelu_near_values.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    library.hotrod_gelu_static_values.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int32,
                                                  ctypes.c_void_p]
    library.hotrod_gelu_static_values.restype = ctypes.c_int64
    return library


@amx
def test_the_tables_gelu_is_within_its_bound_of_onnxruntimes_and_exact_past_the_clamp():
    x = np.concatenate([_inputs(), np.linspace(-7, 7, 1_000_003, dtype=np.float32)])
    near = np.empty_like(x)
    assert _library().hotrod_gelu_near_values(x.ctypes.data, x.size, near.ctypes.data) == 0
    theirs = _onnxruntime(x, GELUS["com.microsoft"])
    below = np.abs(x) < 3.925 * np.sqrt(2) * 1.0001
    assert np.abs(near[below].astype(np.float64) - theirs[below]).max() <= 2e-6  # gelu_static.h's bound
    past = ~below & ~np.isnan(x)
    near, theirs = near[past], theirs[past]
    same = (near.view(np.uint32) == theirs.view(np.uint32)) | (np.isnan(near) & np.isnan(theirs))
    assert same.all(), f"{(~same).sum()} values past the clamp differ, first at x = {x[past][~same][:3]}"


def _crowded(scale: float, zero_point: int) -> np.ndarray:
    """x whose GELU lies on, or within a few float steps of, a half-way quotient at `scale` (the points where a
    byte changes), found on onnxruntime's own GELU between two grid points that straddle one."""
    grid = np.linspace(-6, 8, 200_001, dtype=np.float32)
    quotients = _onnxruntime(grid, GELUS["com.microsoft"]).astype(np.float64) / scale
    crossing = np.nonzero(np.floor(quotients[:-1] + 0.5) != np.floor(quotients[1:] + 0.5))[0]
    low, high = grid[crossing], grid[crossing + 1]
    below = np.floor(quotients[crossing] + 0.5)  # low's side: every step keeps low on it
    for _ in range(30):  # bisection on the grid's own floats
        middle = ((low.astype(np.float64) + high) / 2).astype(np.float32)
        above = np.floor(_onnxruntime(middle, GELUS["com.microsoft"]).astype(np.float64) / scale + 0.5) != below
        low, high = np.where(above, low, middle), np.where(above, middle, high)
    steps = np.arange(-8, 9, dtype=np.int32)
    return (low.view(np.int32)[:, None] + steps[None, :]).ravel().view(np.float32)


@amx
@pytest.mark.parametrize(("scale", "zero_point"), [(0.05, 3), (0.0137, 0), (0.4, 128), (1e-3, 255), (7.5, 12)])
def test_the_static_epilogues_bytes_are_onnxruntimes_gelu_then_quantize_linear(scale, zero_point):
    x = np.concatenate([_inputs(), np.linspace(-7, 40, 500_001, dtype=np.float32), _crowded(scale, zero_point)])
    ours = np.empty(x.size, np.uint8)
    again = _library().hotrod_gelu_static_values(x.ctypes.data, x.size, scale, zero_point, ours.ctypes.data)
    theirs = _onnxruntime(x, GELUS["com.microsoft"], (scale, zero_point))
    assert (ours == theirs).all(), f"{(ours != theirs).sum()} bytes differ, first at x = {x[ours != theirs][:3]}"
    assert 0 < again < x.size / 16  # groups inside the margin went back to the exact arithmetic, not all of them


@amx
def test_the_static_epilogue_refuses_a_zero_point_out_of_range():
    x = np.zeros(16, np.float32)
    q = np.empty(16, np.uint8)
    assert _library().hotrod_gelu_static_values(x.ctypes.data, 16, 0.1, 256, q.ctypes.data) == -1
