"""Graph passes applied after export: fusion, then mixed precision or quantization.

Each pass reads and writes one graph file in place, and returns what it did, for the manifest.
"""

from hotrod.optimize.passes import fuse_graph, lower_graph

__all__ = ["fuse_graph", "lower_graph"]
