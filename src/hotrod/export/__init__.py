"""Export: the lean module's graphs to ONNX files, one per graph of the kind's contract."""

from hotrod.export.io import GraphIO, TensorSpec, graph_contracts, kv_names
from hotrod.export.onnx import OPSET, export_graph

__all__ = ["OPSET", "GraphIO", "TensorSpec", "export_graph", "graph_contracts", "kv_names"]
