"""Who reads what in an ONNX graph: the maps the graph rewrites (the build's passes and the loader's kernel
rewrites alike) decide by, in one place."""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper


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


def constants(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """The graph's constant tensors by name, initializers and Constant nodes' values alike."""
    found = {t.name: t for t in graph.initializer}
    found.update({n.output[0]: n.attribute[0].t for n in graph.node
                  if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    return found


def fixed_initializers(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """The graph's initializers that no caller may override (those not also graph inputs), by name: the values
    a rewrite may take as constants."""
    fed = {value.name for value in graph.input}
    return {t.name: t for t in graph.initializer if t.name not in fed}


def drop_nodes(graph: onnx.GraphProto, dropped: set[int]) -> None:
    """`graph` without the nodes whose id() is in `dropped`, the others in their order."""
    if dropped:
        kept = [node for node in graph.node if id(node) not in dropped]
        del graph.node[:]
        graph.node.extend(kept)


def split_sizes(split: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> list[int] | None:
    """The sizes a Split was given: its sizes input where that is a constant (`constants`), or before opset 13
    its `split` attribute; [] where it was given none (equal parts, by num_outputs or its outputs' count, the
    last narrower where the axis does not divide); None where its sizes are not known here (or given empty)."""
    if len(split.input) > 1 and split.input[1]:
        sizes = constants.get(split.input[1])
        given = None if sizes is None else numpy_helper.to_array(sizes).reshape(-1).tolist()
    else:
        listed = [a for a in split.attribute if a.name == "split"]
        if not listed:
            return []
        given = list(helper.get_attribute_value(listed[0]))
    return given or None


def unused_name(name: str, taken: set[str]) -> str:
    """`name`, or `name_1`, `name_2`, ...: the first not in `taken`, which it joins."""
    candidate, suffix = name, 1
    while candidate in taken:
        candidate, suffix = f"{name}_{suffix}", suffix + 1
    taken.add(candidate)
    return candidate
