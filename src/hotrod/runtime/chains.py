"""A product's epilogue as hotrod's product kernels take it in: what follows a product node in a fused graph.

Every product kernel (int8: `hotrod.runtime.i8`; bf16: `hotrod.runtime.bf16`) computes more than the product:
the bias added after it, a GELU after that, then a residual added, or, for a fused Q/K/V product, the Split of
its columns into three. Each finds its own product node (a dynamic int8 graph's MatMulInteger chain, a calibrated
graph's dequantized MatMul, an fp32 MatMul of constant weights) and hands it here, and the nodes that follow are
taken into the op where nothing else reads what lies within.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hotrod.optimize import graphs
from hotrod.runtime import native


@dataclass(kw_only=True)
class Chain:
    """A product and the nodes after it that its op takes in."""

    # the product's nodes, then [the bias' Sub or Add][, Gelu][, the residual's Add]
    nodes: list[onnx.NodeProto]
    weights: str  # the constant weights' name
    n: int  # the product's columns
    bias: str | None = None
    negated: bool = False  # the bias is subtracted (`row_scales` writes it negated)
    gelu: bool = False  # a GELU after the bias, taken into the op's epilogue
    residual: str | None = None  # what an Add after them adds, taken into the op
    split: onnx.NodeProto | None = None  # the Split of a fused Q/K/V product, taken into the op
    feeding: tuple[onnx.NodeProto, ...] = ()  # nodes before the product that go where only products read them


@dataclass(frozen=True)
class Kernel:
    """How one product kernel takes a graph's products in (`rewrite`)."""

    # the product starting at a node (given the graph's constants, readers and producers), or None
    start: Callable[[onnx.NodeProto, dict, dict, dict], Chain | None]
    # what else than the weights and bias makes two products' packed arrays the same
    key: Callable[[Chain], tuple]
    # the packed arrays of a product (given the graph's constants), and the stems of their names
    arrays: Callable[[Chain, dict], tuple[np.ndarray, ...]]
    stems: tuple[str, ...]
    op: Callable[[Chain, list[str]], onnx.NodeProto]  # the op, given the packed arrays' names
    # before a product is packed: names what its op reads besides (given the names taken and the initializers added)
    prepare: Callable[[Chain, set[str], list[onnx.TensorProto]], None] | None = None


def rewrite(model: onnx.ModelProto, kernel: Kernel) -> int:
    """Every product of `model` that `kernel` starts, with what follows it (`extend`), as `kernel`'s op, in place;
    returns how many. Weights two products share are packed once."""
    graph = model.graph
    fed = {value.name for value in graph.input}  # initializers a caller may override stay as they are
    constants = {init.name: init for init in graph.initializer if init.name not in fed}
    consumers, producers = graphs.readers(graph), graphs.producers(graph)
    found = [extended for node in graph.node if (chain := kernel.start(node, constants, consumers, producers))
             and (extended := extend(chain, constants, consumers, producers, graph))]
    if not found:
        return 0
    taken = set(constants) | fed | {name for node in graph.node for name in (*node.input, *node.output)}
    packed: dict[tuple, list[str]] = {}
    added: list[onnx.TensorProto] = []
    replacements, dropped, replaced, sizes = {}, set(), set(), set()
    for chain in found:  # every array read before the graph changes
        if chain.residual and id(chain.nodes[-1]) in replacements:  # an Add of two products: the first takes it
            chain.nodes.pop()
            chain.residual = None
        if kernel.prepare is not None:
            kernel.prepare(chain, taken, added)
        key = (chain.weights, chain.bias, chain.negated, *kernel.key(chain))
        if key not in packed:
            packed[key] = [graphs.unused_name(f"{chain.weights}_{stem}", taken) for stem in kernel.stems]
            added += [numpy_helper.from_array(array, name) for array, name in zip(kernel.arrays(chain, constants),
                                                                                  packed[key])]
        replacements[id(chain.nodes[-1])] = kernel.op(chain, packed[key])  # where a residual is surely computed
        dropped.update(id(node) for node in (*chain.nodes[:-1], *([chain.split] if chain.split else [])))
        sizes.update(name for name in (chain.split.input[1:2] if chain.split else ()) if name)
        replaced.update(name for node in (*chain.nodes, *chain.feeding) for name in node.input if name in constants)
    nodes = [replacements.get(id(node), node) for node in graph.node if id(node) not in dropped]
    read = graphs.read_names(graph, nodes)
    feeding = {id(node) for chain in found for node in chain.feeding if node.output[0] not in read}
    nodes = [node for node in nodes if id(node) not in feeding]  # what only the products read
    unread = sizes - read
    nodes = [node for node in nodes if node.op_type != "Constant" or node.output[0] not in unread]  # Splits' sizes
    del graph.node[:]
    graph.node.extend(nodes)
    native.swap_initializers(graph, replaced, added)
    native.add_domain(model)
    return len(found)


def bias(chain: Chain, constants: dict) -> np.ndarray | None:
    """The bias as the op adds it (negated where the graph subtracted it), or None where there is none."""
    if not chain.bias:
        return None
    values = numpy_helper.to_array(constants[chain.bias])
    return -values if chain.negated else values


def extend(chain: Chain, constants: dict, consumers: dict, producers: dict, graph: onnx.GraphProto) -> Chain | None:
    """`chain` (its product's nodes) with the bias, GELU and residual that follow it, or the Split of its columns,
    where nothing else reads what lies within; None where a graph output would be lost inside the op."""
    n, outputs = chain.n, {value.name for value in graph.output}  # a graph output ends the chain: the op writes it
    product = chain.nodes[-1].output[0]
    following = None if product in outputs else only(consumers, product, None)
    if following is not None and following.domain in ("", "ai.onnx") and len(following.input) == 2 and (
            following.op_type == "Add" and product in following.input  # a float sum is the same either way
            or following.op_type == "Sub" and following.input[0] == product):
        other = following.input[1] if following.input[0] == product else following.input[0]
        if other in constants and per_column(constants[other], n):
            chain.nodes.append(following)
            chain.bias, chain.negated = other, following.op_type == "Sub"
    gelu = None if chain.nodes[-1].output[0] in outputs else only(consumers, chain.nodes[-1].output[0], None)
    chain.gelu = gelu is not None and is_gelu(gelu)
    if chain.gelu:
        chain.nodes.append(gelu)
    add = None if chain.nodes[-1].output[0] in outputs else only(consumers, chain.nodes[-1].output[0], "Add")
    chain.residual = _residual(add, chain.nodes[-1].output[0], constants) if add is not None else None
    if chain.residual is not None:
        chain.nodes.append(add)
    if {step.output[0] for step in chain.nodes[:-1]} & outputs:  # what the op no longer writes
        return None
    if not chain.gelu and chain.residual is None:
        chain.split = _split_after(chain, consumers, producers, constants, graph)
    return chain


def _residual(add: onnx.NodeProto, value: str, constants: dict) -> str | None:
    """What an Add after the product adds to it, where that is a tensor the graph computes (a residual
    stream): the op adds it last, as the Add did (in its epilogue where its shape is the product's, after the
    product where it broadcasts otherwise). None for a constant, the product itself, or another node."""
    if add.domain not in ("", "ai.onnx") or len(add.input) != 2 or value not in add.input:
        return None
    other = add.input[1] if add.input[0] == value else add.input[0]
    return None if other in constants or other == value or not other else other


def is_gelu(node: onnx.NodeProto) -> bool:
    """Whether `node` is a GELU of the erf form, which the kernel's epilogue computes as onnxruntime does
    (`hotrod/native/gelu.h`): com.microsoft's Gelu, or ONNX's without the tanh approximation."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type != "Gelu" or len(node.input) != 1 or len(node.output) != 1:
        return False
    if node.domain == "com.microsoft":
        return not attrs
    return node.domain in ("", "ai.onnx") and set(attrs) <= {"approximate"} \
        and attrs.get("approximate", b"none") in (b"none", "none")


def per_column(tensor: onnx.TensorProto, n: int) -> bool:
    """Whether a float constant is one value, or one per column ([N] or [1, N], a language model's logits bias),
    so that adding or multiplying it leaves a product's shape as it is."""
    return tensor.data_type == TensorProto.FLOAT and list(tensor.dims) in ([], [1], [n], [1, n])


def _split_after(chain: Chain, consumers: dict, producers: dict, constants: dict,
                 graph: onnx.GraphProto) -> onnx.NodeProto | None:
    """The Split, where the product's one reader splits its last axis into three equal parts of a multiple of
    16 columns (the kernel writes them as three outputs); None otherwise. Its sizes are read as the build's
    fusion reads them (`graphs.split_sizes`), from an initializer no caller may feed or a Constant node."""
    out = chain.nodes[-1].output[0]
    split = only(consumers, out, "Split")
    if split is None or len(split.output) != 3 or any(value.name == out for value in graph.output):
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in split.attribute}
    if attrs.get("axis") != -1 or chain.n % 3 or chain.n // 3 % 16:
        return None
    known = dict(constants)
    source = producers.get(split.input[1]) if len(split.input) > 1 else None
    if source is not None and source.op_type == "Constant" and source.attribute \
            and source.attribute[0].name == "value":
        known[source.output[0]] = source.attribute[0].t
    # [] (no sizes given): three equal parts, as the width divides by three
    return split if graphs.split_sizes(split, known) in ([], [chain.n // 3] * 3) else None


def only(consumers: dict, name: str, op: str | None) -> onnx.NodeProto | None:
    """The one node reading `name` (of type `op`, where given), or None."""
    readers = consumers.get(name, [])
    if len(readers) != 1 or (op is not None and readers[0].op_type != op):
        return None
    return readers[0]
