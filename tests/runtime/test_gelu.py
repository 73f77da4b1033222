"""The int8 products' GELU epilogue (`hotrod/native/gelu.h`) against onnxruntime's own Gelu, to the bit: a
sweep over every range of float32 (one bit pattern in 4,099), and every float around the erf's split between
its polynomial and its exponential side and around its clamp, both signs, with zeros, subnormals, infinities
and NaN."""

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


def _onnxruntime(x: np.ndarray, attrs: dict) -> np.ndarray:
    attrs = dict(attrs)
    domain = attrs.pop("domain", "")
    node = helper.make_node("Gelu", ["x"], ["y"], domain=domain, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
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
