"""Graph passes applied after export: fusion, the GPU form of in-place attention, then mixed precision
or quantization, then, for the CPU, ONNX's own attention.

Each pass reads and writes one graph file in place, and returns what it did, for the manifest.
"""

from hotrod.optimize.passes import cpu_attention_graph, fuse_graph, lower_graph, note_fp32_ops, portable_graph

__all__ = ["cpu_attention_graph", "fuse_graph", "lower_graph", "note_fp32_ops", "portable_graph"]
