"""Who reads what in an ONNX graph: the maps the graph rewrites (the build's passes and the loader's kernel
rewrites alike) decide by, in one place."""

from __future__ import annotations

import onnx


def readers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Each value's reading nodes (the graph's own, in order)."""
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            found.setdefault(name, []).append(node)
    return found


def producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """Each value's writing node."""
    return {out: node for node in graph.node for out in node.output}


def read_names(graph: onnx.GraphProto, nodes: list[onnx.NodeProto] | None = None) -> set[str]:
    """The names `nodes` (the graph's, where not given) read, those their subgraphs (If, Loop, Scan bodies) read,
    and the graph's outputs: what a rewrite must keep."""
    read = {value.name for value in graph.output}
    for node in graph.node if nodes is None else nodes:
        read.update(node.input)
        for attribute in node.attribute:
            for body in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                read |= read_names(body)
    return read
