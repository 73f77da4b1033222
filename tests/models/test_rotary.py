"""Rotary embeddings (`hotrod.models.rotary.RotaryEmbedding`): transformers' rotate-half rotation in PyTorch,
and one ONNX Runtime RotaryEmbedding node computing the same on export."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch
from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

from hotrod.contracts import FLOAT32, GraphIO, TensorSpec
from hotrod.export.onnx import export_graph
from hotrod.models.rotary import RotaryEmbedding, rotary_tables

HEADS, HEAD_DIM, THETA = 4, 8, 10_000.0


def _transformers(x: torch.Tensor) -> torch.Tensor:
    batch, seq, _ = x.shape
    cos, sin = rotary_tables(seq, HEAD_DIM, THETA)
    cos, sin = torch.cat((cos, cos), dim=-1)[None], torch.cat((sin, sin), dim=-1)[None]
    heads = x.view(batch, seq, HEADS, HEAD_DIM).transpose(1, 2)
    turned, _ = apply_rotary_pos_emb(heads, heads, cos, sin)
    return turned.transpose(1, 2).reshape(batch, seq, HEADS * HEAD_DIM)


class _Turn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rotary = RotaryEmbedding(HEAD_DIM, THETA, positions=16)

    def forward(self, x):
        return self.rotary(x, HEADS)


def test_rotary_embedding_equals_transformers():
    x = torch.randn(2, 7, HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_Turn()(x), _transformers(x), atol=1e-6, rtol=0)


def test_rotary_embedding_exports_as_one_node_of_the_same_values(tmp_path):
    path = tmp_path / "rotary.onnx"
    spec = ("batch", "sequence", HEADS * HEAD_DIM)
    io = GraphIO("rotary", (TensorSpec("x", FLOAT32, spec),), (TensorSpec("y", FLOAT32, spec),))
    export_graph(_Turn(), io, vocab_size=1, path=path)
    nodes = [node.op_type for node in onnx.load(str(path)).graph.node]
    assert nodes.count("RotaryEmbedding") == 1 and "Concat" not in nodes
    x = torch.randn(3, 11, HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(1))  # other sizes than traced
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x.numpy()})[0], _transformers(x).numpy(), atol=1e-6)
