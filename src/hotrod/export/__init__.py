"""Export: the lean module's graphs to ONNX files, one per graph of the kind's contract (`hotrod.contracts`)."""

from hotrod.export.onnx import OPSET, export_graph

__all__ = ["OPSET", "export_graph"]
