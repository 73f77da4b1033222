"""The artifact directory: its manifest, its integrity checks, and how it is written."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import filelock
import onnx
import onnxruntime
import pytest
import torch
import transformers

import hotrod
from hotrod.artifact import FORMAT, open_artifact
from tests.zoo import CASES, build_checkpoint, load_on, prompt_batch

GRAPHS = {"decoder": {"decoder"}, "seq2seq": {"encoder", "decoder_init", "decoder"}, "encoder": {"encoder"}}


def manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def sha256(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def leftovers(parent: Path, name: str) -> list[str]:
    """Staging directories (`.<name>.*.partial` / `.old`) or the lock file (`.<name>.lock`) left beside an output."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


# -- the manifest ---------------------------------------------------------------------------------


def test_manifest_describes_the_model(zoo, case):
    data = manifest(zoo.artifact(case))
    expected = CASES[case]
    assert (data["format"], data["hotrod_version"]) == (FORMAT, hotrod.__version__)
    assert (data["family"], data["model_type"], data["kind"]) == (expected.family, expected.model_type, expected.kind)
    assert data["source"]["origin"] == str(zoo.checkpoint(case))
    assert Path(data["source"]["path"]) == zoo.checkpoint(case).resolve()
    assert data["source"]["from_hub"] is False
    assert data["options"] == {"precision": "fp32", "device": "cpu", "opset": 17, "fusion": True,
                               "calibration_method": "minmax", "backend": "onnxruntime"}
    config = expected.config()
    assert (data["dims"]["vocab_size"], data["dims"]["hidden_size"]) == (config.vocab_size, config.hidden_size)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__,
                "onnxruntime": onnxruntime.__version__}
    assert versions.items() <= data["versions"].items()


def test_manifest_records_every_graph_with_its_io_and_hash(zoo, case):
    artifact = zoo.artifact(case)
    graphs = manifest(artifact)["graphs"]
    assert set(graphs) == GRAPHS[CASES[case].kind]
    for entry in graphs.values():
        file = artifact / entry["file"]
        assert (entry["bytes"], entry["sha256"]) == (file.stat().st_size, sha256(file))
        proto = onnx.load(str(file))
        assert [t["name"] for t in entry["inputs"]] == [i.name for i in proto.graph.input]
        assert [t["name"] for t in entry["outputs"]] == [o.name for o in proto.graph.output]
        assert all({"name", "dtype", "shape"} <= set(t) for t in entry["inputs"] + entry["outputs"])


def test_manifest_records_configs_and_tokenizer_files(zoo, case):
    artifact = zoo.artifact(case)
    files = manifest(artifact)["files"]
    assert {"config.json", "generation_config.json"} <= set(files)
    assert ("tokenizer.json" in files) == (CASES[case].tokenizer is not None)
    for name, entry in files.items():
        assert (entry["bytes"], entry["sha256"]) == ((artifact / name).stat().st_size, sha256(artifact / name))


def test_weights_hash_is_stable_and_tracks_the_weights(zoo, tmp_path):
    recorded = manifest(zoo.artifact("bert"))["source"]["weights_sha256"]
    again = hotrod.optimize(zoo.checkpoint("bert"), tmp_path / "again", progress=False)
    assert len(recorded) == 64 and manifest(again)["source"]["weights_sha256"] == recorded
    other = build_checkpoint(CASES["bert"], tmp_path / "other", seed=9)
    assert manifest(hotrod.optimize(other, tmp_path / "art", progress=False))["source"]["weights_sha256"] != recorded


def test_loaded_model_exposes_the_manifest(zoo):
    assert zoo.model("gpt2", "onnxruntime").manifest == manifest(zoo.artifact("gpt2"))


# -- another process ------------------------------------------------------------------------------

_CHILD = """
import json, sys, torch, hotrod
spec = json.loads(sys.argv[1])
out = {}
for name, job in spec.items():
    model = hotrod.load(job["artifact"])
    ids, mask = torch.tensor(job["ids"]), torch.tensor(job["mask"])
    if job["kind"] == "encoder":
        out[name] = model.embed(ids.tolist()).tolist()
    else:
        out[name] = model.generate(ids, attention_mask=mask, max_new_tokens=6, num_beams=3).tolist()
print(json.dumps(out))
"""


def test_artifact_loads_and_generates_identically_in_another_process(zoo, tmp_path):
    spec, expected = {}, {}
    for name in ("gpt2", "t5_v1_1", "bert"):
        ids, mask = prompt_batch(CASES[name], (5, 5))
        spec[name] = {"artifact": str(zoo.artifact(name)), "ids": ids.tolist(), "mask": mask.tolist(),
                      "kind": CASES[name].kind}
        model = zoo.model(name, "onnxruntime")
        result = model.embed(ids) if CASES[name].kind == "encoder" else model.generate(
            ids, attention_mask=mask, max_new_tokens=6, num_beams=3)
        expected[name] = result.tolist()
    env = {**os.environ, "HOTROD_CACHE": str(tmp_path / "cache")}
    child = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], capture_output=True, text=True,
                           env=env, timeout=300)
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == expected
    assert not (tmp_path / "cache").exists(), "loading an artifact must not export anything"


# -- damaged artifacts ----------------------------------------------------------------------------


def truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[:-10])


def flip_bytes(file: Path) -> None:
    data = bytearray(file.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4] = bytes(b ^ 0xFF for b in data[middle:middle + 4])
    file.write_bytes(bytes(data))


def append(file: Path) -> None:
    file.write_bytes(file.read_bytes() + b" ")


DAMAGES = {
    "graph_missing": ("decoder_init.onnx", Path.unlink, "is missing decoder_init.onnx"),
    "graph_truncated": ("encoder.onnx", truncate, "corrupt"),
    "graph_bytes_flipped": ("decoder.onnx", flip_bytes, "corrupt"),
    "config_edited": ("config.json", append, "corrupt"),
    "generation_config_missing": ("generation_config.json", Path.unlink, "is missing generation_config.json"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_artifact_is_refused_before_loading(zoo, backend, tmp_path, damage):
    artifact = zoo.copy_artifact("t5", tmp_path / "art")
    file, spoil, message = DAMAGES[damage]
    spoil(artifact / file)
    with pytest.raises(hotrod.HotrodError, match=message):
        load_on(artifact, backend)


def test_missing_manifest_is_not_an_artifact(zoo, tmp_path):
    artifact = zoo.copy_artifact("gpt2", tmp_path / "art")
    (artifact / "manifest.json").unlink()
    with pytest.raises(hotrod.HotrodError, match="not a hotrod artifact .no manifest.json"):
        open_artifact(artifact)
    with pytest.raises(hotrod.HotrodError, match=re.escape(str(artifact))):
        hotrod.load(artifact)


@pytest.mark.parametrize("content", ["{broken", json.dumps({"format": 2})], ids=["not_json", "no_graphs"])
def test_unreadable_manifest(zoo, tmp_path, content):
    artifact = zoo.copy_artifact("gpt2", tmp_path / "art")
    (artifact / "manifest.json").write_text(content)
    with pytest.raises(hotrod.HotrodError, match="unreadable or incomplete"):
        hotrod.load(artifact)


@pytest.mark.parametrize("fmt", [0, FORMAT - 1, FORMAT + 1, 999])
def test_incompatible_format_version(zoo, backend, tmp_path, fmt):
    artifact = zoo.copy_artifact("gpt2", tmp_path / "art")
    data = manifest(artifact)
    data.update(format=fmt, hotrod_version="9.9.9")
    (artifact / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(hotrod.HotrodError, match=rf"hotrod 9\.9\.9 \(artifact format {fmt}\).*run `hotrod optimize`"):
        load_on(artifact, backend)


# -- writing --------------------------------------------------------------------------------------


def test_optimize_returns_the_output_directory_with_ordinary_permissions(zoo, tmp_path):
    out = hotrod.optimize(zoo.checkpoint("bert"), tmp_path / "a" / "b", progress=False)
    assert out == tmp_path / "a" / "b"
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask
    assert leftovers(out.parent, "b") == []


def test_existing_non_empty_output_is_refused_without_force(zoo, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(hotrod.HotrodError, match="already exists and is not empty; use --force"):
        hotrod.optimize(zoo.checkpoint("bert"), out, progress=False)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert leftovers(tmp_path, "out") == []


def test_existing_empty_output_is_used(zoo, tmp_path):
    (tmp_path / "out").mkdir()
    hotrod.load(hotrod.optimize(zoo.checkpoint("bert"), tmp_path / "out", progress=False))


def test_output_that_is_a_file_is_refused(zoo, tmp_path):
    (tmp_path / "out").write_text("x")
    with pytest.raises(hotrod.HotrodError, match="not a directory"):
        hotrod.optimize(zoo.checkpoint("bert"), tmp_path / "out", force=True, progress=False)
    assert (tmp_path / "out").read_text() == "x"


def test_force_replaces_the_output_whole(zoo, tmp_path):
    out = zoo.copy_artifact("gpt2", tmp_path / "out")
    (out / "stale.txt").write_text("old")
    hotrod.optimize(zoo.checkpoint("bert"), out, force=True, progress=False)
    assert not (out / "stale.txt").exists() and not (out / "decoder.onnx").exists()
    assert manifest(out)["family"] == "bert"
    assert leftovers(tmp_path, "out") == []
    hotrod.load(out)


def test_failed_export_leaves_nothing_behind(zoo, tmp_path):
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    (source / "model.safetensors").unlink()
    with pytest.raises(hotrod.HotrodError, match="has no weights"):
        hotrod.optimize(source, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    assert leftovers(tmp_path, "out") == []


def test_failed_forced_export_keeps_the_previous_artifact(zoo, tmp_path):
    out = zoo.copy_artifact("gpt2", tmp_path / "out")
    before = manifest(out)
    source = zoo.copy_checkpoint("bert", tmp_path / "ckpt")
    (source / "model.safetensors").write_bytes(b"not weights")
    with pytest.raises(hotrod.HotrodError, match="cannot read weights"):
        hotrod.optimize(source, out, force=True, progress=False)
    assert manifest(out) == before
    assert leftovers(tmp_path, "out") == []
    hotrod.load(out)


def test_a_second_writer_of_the_same_output_fails_at_once(zoo, tmp_path):
    out = tmp_path / "out"
    with filelock.FileLock(tmp_path / ".out.lock"):  # another optimize is writing `out`
        with pytest.raises(hotrod.HotrodError, match="another hotrod process is writing"):
            hotrod.optimize(zoo.checkpoint("bert"), out, progress=False)
        assert not out.exists() and leftovers(tmp_path, "out") == [".out.lock"]  # the holder's lock untouched


def test_a_full_disk_is_one_error_and_keeps_the_previous_artifact(zoo, tmp_path, fill_disk):
    checkpoint, out = zoo.checkpoint("bert"), zoo.copy_artifact("bert", tmp_path / "out")
    before = manifest(out)
    fill_disk()
    with pytest.raises(hotrod.HotrodError, match=f"cannot write {re.escape(str(out))}: No space left on device"):
        hotrod.optimize(checkpoint, out, force=True, progress=False)
    assert manifest(out) == before and leftovers(tmp_path, "out") == []


def test_replacing_an_artifact_never_leaves_a_moment_without_one(zoo, tmp_path, monkeypatch):
    out = zoo.copy_artifact("gpt2", tmp_path / "out")
    seen = []
    real_replace = os.replace

    def replace(a, b):
        seen.append((out / "manifest.json").is_file())
        real_replace(a, b)
        seen.append((out / "manifest.json").is_file())

    monkeypatch.setattr(os, "replace", replace)
    hotrod.optimize(zoo.checkpoint("bert"), out, force=True, progress=False, verify_examples=0)
    assert all(seen) and manifest(out)["kind"] == "encoder"
    assert leftovers(tmp_path, "out") == []


@pytest.mark.parametrize("option, value, message", [
    ("precision", "fp4", "unknown precision 'fp4'"),
    ("precision", "fp8", "fp8 is the torch engine's precision"),
    ("precision", "bf16", "bf16 on cpu"),
    ("calibration_method", "kl", "unknown calibration method 'kl'"),
    ("device", "tpu", "unknown device 'tpu'"),
    ("backend", "tensorflow", "unknown backend"),
])
def test_bad_optimize_options(zoo, tmp_path, option, value, message):
    with pytest.raises(hotrod.HotrodError, match=message):
        hotrod.optimize(zoo.checkpoint("bert"), tmp_path / "out", progress=False, **{option: value})
    assert not (tmp_path / "out").exists()


def test_output_that_is_the_source_is_refused(zoo, tmp_path):
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    for out in (source, source.parent):
        with pytest.raises(hotrod.HotrodError, match="would replace the source checkpoint"):
            hotrod.optimize(source, out, force=True, progress=False)
    assert (source / "model.safetensors").is_file()


def test_large_graphs_keep_their_weights_in_one_external_file(zoo, tmp_path, monkeypatch):
    import hotrod.export.onnx as exporter

    monkeypatch.setattr(exporter, "EXTERNAL_DATA_THRESHOLD", 1)  # every graph counts as "over 2 GB"
    out = hotrod.optimize(zoo.checkpoint("t5"), tmp_path / "out", progress=False)
    graphs = manifest(out)["graphs"]
    for name, entry in graphs.items():
        assert entry["external_data"]["file"] == f"{name}.onnx.data"
        assert (out / f"{name}.onnx.data").stat().st_size == entry["external_data"]["bytes"]
    ids, mask = prompt_batch(CASES["t5"], (5, 3))
    expected = zoo.model("t5", "onnxruntime").generate(ids, attention_mask=mask, max_new_tokens=5)
    assert torch.equal(hotrod.load(out).generate(ids, attention_mask=mask, max_new_tokens=5), expected)
    (out / "decoder.onnx.data").write_bytes(b"")
    with pytest.raises(hotrod.HotrodError, match="decoder.onnx.data is corrupt"):
        hotrod.load(out)


def test_graphs_without_manifest_are_named_as_a_damaged_artifact(zoo, tmp_path):
    out = zoo.copy_artifact("gpt2", tmp_path / "out")
    (out / "manifest.json").unlink()
    with pytest.raises(hotrod.HotrodError, match="no manifest.json"):
        hotrod.load(out)


# -- entries that lead outside the artifact -------------------------------------------------------


def _point_graph_at(artifact: Path, name: str) -> None:
    data = manifest(artifact)
    data["graphs"]["decoder"]["file"] = name
    (artifact / "manifest.json").write_text(json.dumps(data))


@pytest.mark.parametrize("name", ["/etc/hostname", "../outside.onnx", "sub/../../outside.onnx", "..\\outside.onnx"],
                         ids=["absolute", "parent", "nested_parent", "backslash"])
def test_manifest_entries_must_stay_inside_the_artifact(zoo, tmp_path, name):
    artifact = zoo.copy_artifact("gpt2", tmp_path / "art")
    (tmp_path / "outside.onnx").write_bytes((artifact / "decoder.onnx").read_bytes())
    _point_graph_at(artifact, name)
    with pytest.raises(hotrod.HotrodError, match="not a relative path inside"):
        open_artifact(artifact)


def test_a_graph_that_is_a_symlink_leaving_the_artifact_is_refused(zoo, tmp_path):
    artifact = zoo.copy_artifact("gpt2", tmp_path / "art")
    elsewhere = tmp_path / "elsewhere.onnx"
    os.replace(artifact / "decoder.onnx", elsewhere)
    (artifact / "decoder.onnx").symlink_to(elsewhere)  # same bytes: only where it leads is wrong
    with pytest.raises(hotrod.HotrodError, match="link that leads outside"):
        hotrod.load(artifact)


@pytest.mark.parametrize("graphs", [[], {"decoder": "decoder.onnx"}, {"decoder": {"file": 5, "bytes": 1, "sha256": ""}}],
                         ids=["list", "string_entry", "number_file"])
def test_malformed_manifest_entries_are_one_line(zoo, tmp_path, graphs):
    artifact = zoo.copy_artifact("gpt2", tmp_path / "art")
    data = manifest(artifact)
    data["graphs"] = graphs
    (artifact / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(hotrod.HotrodError, match="unreadable or incomplete"):
        open_artifact(artifact)
