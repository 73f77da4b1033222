"""Graph passes applied after export: fusion, then quantization.

Each pass reads and writes one graph file in place, and returns what it did, for the manifest.
"""

from hotrod.optimize.passes import optimize_graph

__all__ = ["optimize_graph"]
