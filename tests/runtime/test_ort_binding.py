"""onnxruntime's binding: small host inputs copied into staging buffers bound once, read afresh each run."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from hotrod.contracts import GraphIO, TensorSpec
from hotrod.runtime.base import Held, RuntimeOptions
from hotrod.runtime.ort import OrtBackend


def _int64_backend(tmp_path, name: str, nodes: list, inputs: dict[str, tuple], outputs: dict[str, tuple]) -> OrtBackend:
    """An onnxruntime backend over one graph `name` of `nodes`, whose int64 inputs and outputs (in order)
    have the axes given: the graph and its contract written from the one description."""
    def infos(axes_of: dict[str, tuple]) -> list:
        return [helper.make_tensor_value_info(n, TensorProto.INT64, list(axes)) for n, axes in axes_of.items()]

    def specs(axes_of: dict[str, tuple]) -> tuple:
        return tuple(TensorSpec(n, "int64", axes) for n, axes in axes_of.items())

    model = helper.make_model(helper.make_graph(nodes, name, infos(inputs), infos(outputs)),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / f"{name}.onnx")
    io = GraphIO(name, specs(inputs), specs(outputs))
    return OrtBackend({name: tmp_path / f"{name}.onnx"}, {name: io}, RuntimeOptions(threads=1))


def _backend(tmp_path) -> OrtBackend:
    """y = x + step over int64 rows of any shape (`step` a scalar, fed first)."""
    return _int64_backend(tmp_path, "g", [helper.make_node("Add", ["x", "step"], ["y"])],
                          {"step": (), "x": ("b", "s")}, {"y": ("b", "s")})


def _run(backend: OrtBackend, x: torch.Tensor, step: int = 1) -> np.ndarray:
    return backend.to_torch(backend.run("g", {"step": torch.tensor(step), "x": x})["y"]).numpy().copy()


def test_small_inputs_are_read_afresh_at_every_run_whatever_object_holds_them(tmp_path):
    backend = _backend(tmp_path)
    x = torch.tensor([[1, 2]])
    assert _run(backend, x).tolist() == [[2, 3]]
    x[0, 0] = 10  # the same tensor, changed in place
    assert _run(backend, x).tolist() == [[11, 3]]
    assert _run(backend, torch.tensor([[5, 6]])).tolist() == [[6, 7]]  # a new tensor of the same shape
    assert _run(backend, torch.tensor([[1, 2, 3]])).tolist() == [[2, 3, 4]]  # another shape
    big = torch.arange(4096).reshape(2, 2048)  # past the staging size: bound where it lies
    assert (_run(backend, big) == big.numpy() + 1).all()
    assert _run(backend, torch.tensor([[7]])).tolist() == [[8]]


def test_outputs_returned_earlier_are_not_overwritten_by_later_runs(tmp_path):
    backend = _backend(tmp_path)
    first = backend.to_torch(backend.run("g", {"step": torch.tensor(1), "x": torch.tensor([[1, 2]])})["y"])
    backend.run("g", {"step": torch.tensor(1), "x": torch.tensor([[8, 9]])})
    assert first.tolist() == [[2, 3]]


def test_a_missing_input_is_named(tmp_path):
    with pytest.raises(KeyError, match="step.*x"):
        _backend(tmp_path).run("g", {})


def test_staging_buffers_of_many_shapes_never_free_one_bound_for_this_run(tmp_path):
    backend = _backend(tmp_path)
    for width in range(1, 3 * backend._binding("g").STAGED_BUFFERS):  # `step` was staged first, long ago
        x = torch.arange(width)[None, :]
        assert _run(backend, x, step=width).tolist() == [list(range(width, 2 * width))]


def _held_backend(tmp_path) -> OrtBackend:
    """y = x + step and z = x + x, `x` and `z` meant to be held (a cache and what a step writes)."""
    nodes = [helper.make_node("Add", ["x", "step"], ["y"]), helper.make_node("Add", ["x", "x"], ["z"])]
    return _int64_backend(tmp_path, "h", nodes, {"step": (), "x": ("b", "s")}, {"y": ("b", "s"), "z": ("b", "s")})


def _step(backend: OrtBackend, held: Held, step) -> list:
    return backend.to_torch(backend.run("h", {"step": step}, held=held)["y"]).tolist()


def test_a_held_set_stays_bound_and_sees_writes_made_in_place(tmp_path):
    backend = _held_backend(tmp_path)
    x, z = torch.tensor([[1, 2]]), torch.zeros(1, 2, dtype=torch.long)
    held = Held({"x": x}, {"z": z})
    assert _step(backend, held, np.array(1)) == [[2, 3]] and z.tolist() == [[2, 4]]
    binding = backend._binding("h")
    assert binding.held is held and binding.rest == ["step"]
    x[0, 1] = 7  # the cache written in place between steps: bound by pointer, seen
    assert _step(backend, held, np.array(10)) == [[11, 17]] and z.tolist() == [[2, 14]]
    assert _step(backend, held, torch.tensor(3)) == [[4, 10]]  # a torch feed beside numpy ones
    other = Held({"x": torch.tensor([[5, 5, 5]])}, {"z": torch.zeros(1, 3, dtype=torch.long)})  # replaced
    assert _step(backend, other, np.array(1)) == [[6, 6, 6]] and binding.held is other
    assert _step(backend, held, np.array(0)) == [[1, 7]]  # and back


def test_a_run_without_the_held_set_unbinds_it_and_a_copy_is_never_held(tmp_path):
    backend = _held_backend(tmp_path)
    x, z = torch.tensor([[1, 2]]), torch.zeros(1, 2, dtype=torch.long)
    held = Held({"x": x}, {"z": z})
    _step(backend, held, np.array(1))
    out = backend.run("h", {"step": np.array(1), "x": torch.tensor([[4, 4]])})  # x and z bound afresh
    assert backend.to_torch(out["z"]).tolist() == [[8, 8]] and backend._binding("h").held is None
    assert _step(backend, held, np.array(1)) == [[2, 3]] and z.tolist() == [[2, 4]]
    columns = torch.tensor([[1, 9, 2, 9]])[:, ::2]  # not contiguous: fed as any other input, not held
    loose = Held({"x": columns}, {"z": torch.zeros(1, 2, dtype=torch.long)})
    assert _step(backend, loose, np.array(1)) == [[2, 3]] and backend._binding("h").held is None
    with pytest.raises(KeyError, match="step"):
        backend.run("h", {}, held=held)


def test_a_held_set_let_go_is_freed_and_never_read_again(tmp_path):
    import gc
    import weakref

    backend = _held_backend(tmp_path)
    x, z = torch.tensor([[1, 2]]), torch.zeros(1, 2, dtype=torch.long)
    held = Held({"x": x}, {"z": z})
    _step(backend, held, np.array(1))
    gone = weakref.ref(x)
    del held, x, z
    gc.collect()
    assert gone() is None and backend._binding("h").held is None  # the binding does not keep the buffers
    fresh = Held({"x": torch.tensor([[3, 4]])}, {"z": torch.zeros(1, 2, dtype=torch.long)})
    assert _step(backend, fresh, np.array(1)) == [[4, 5]]


def test_steps_prompts_and_passes_keep_a_binding_each(tmp_path):
    """A loop alternating steps and verifying passes (its tokens fed first) after a prompt rebinds nothing at
    each turn: a prompt asks for one position's logits a row, a pass for every position's."""
    nodes = [helper.make_node("Add", ["x", "step"], ["y"]), helper.make_node("Identity", ["logits_positions"], ["z"])]
    backend = _int64_backend(tmp_path, "w", nodes, {"x": ("b", "s"), "step": (), "logits_positions": ("b", "k")},
                             {"y": ("b", "s"), "z": ("b", "k")})

    def run(x: list, positions: list) -> list:
        feeds = {"x": np.array(x), "step": np.array(1), "logits_positions": np.array(positions)}
        return backend.to_torch(backend.run("w", feeds)["y"]).tolist()

    assert run([[1, 2, 3, 4]], [[3]]) == [[2, 3, 4, 5]]
    for _ in range(2):
        assert run([[1]], [[0]]) == [[2]] and run([[1, 2, 3]], [[0, 1, 2]]) == [[2, 3, 4]]
    step, prompt, verify = (backend._binding("w", width) for width in ("step", "prompt", "pass"))
    assert len({id(step), id(prompt), id(verify)}) == 3
    assert [key[1] for key in step.staged if key[0] == "x"] == [(1, 1)]
    assert [key[1] for key in prompt.staged if key[0] == "x"] == [(1, 4)]
    assert [key[1] for key in verify.staged if key[0] == "x"] == [(1, 3)]


def test_a_runs_width_is_read_from_tensors_arrays_and_onnxruntimes_own_values():
    import onnxruntime as ort

    from hotrod.runtime.ort import _width

    wide, narrow, last = np.zeros((1, 3), np.int64), np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64)
    for tokens in (wide, torch.from_numpy(wide), ort.OrtValue.ortvalue_from_numpy(wide)):
        assert _width(tokens, None) == _width(tokens, wide) == "pass" and _width(tokens, last) == "prompt"
    for tokens in (narrow, torch.from_numpy(narrow), ort.OrtValue.ortvalue_from_numpy(narrow), np.array(3), None):
        assert _width(tokens, None) == _width(tokens, last) == "step"


def test_cpu_sessions_keep_an_encoders_bias_and_gelu_apart(zoo):
    """onnxruntime's BiasGeluFusion would fuse them back into its slower CPU kernel at every session start."""
    import hotrod

    model = hotrod.load(zoo.artifact("bert"), profile=True)
    ids = torch.tensor([[5, 6, 7, 8]])
    model(ids)
    ops = {e.get("args", {}).get("op_name") for trace in model.backend.profile_events().values() for e in trace
           if e.get("cat") == "Node"}
    assert "Gelu" in ops and "BiasGelu" not in ops
