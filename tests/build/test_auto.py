"""`--precision auto`: every candidate built, verified and timed; the fastest passing one kept."""

from __future__ import annotations

import json

import pytest

import hotrod
from hotrod.build import auto
from hotrod.build.auto import Candidate, _pick
from hotrod.cli import main


@pytest.fixture(scope="module")
def auto_artifacts(tmp_path_factory, zoo):
    root = tmp_path_factory.mktemp("auto")
    return {name: hotrod.optimize(zoo.checkpoint(name), root / name, precision="auto", verify_examples=4,
                                  max_drop=0.05, progress=False) for name in ("gpt2", "bert")}


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_auto_keeps_a_passing_candidate_and_records_the_table(auto_artifacts, name):
    manifest = json.loads((auto_artifacts[name] / "manifest.json").read_text())
    section = manifest["auto"]
    rows = {row["precision"]: row for row in section["candidates"]}
    assert set(rows) == set(auto.candidates("cpu"))
    kept = [row for row in rows.values() if row["status"] == "kept"]
    assert len(kept) == 1 and kept[0]["precision"] == section["chosen"] == manifest["options"]["precision"]
    assert kept[0]["drop"] <= 0.05
    passing = [row for row in rows.values() if row["status"] in ("kept", "passed")]
    assert kept[0]["seconds"] == min(row["seconds"] for row in passing)  # the fastest of those that pass
    for row in rows.values():
        assert row["status"] == "failed" or (row["seconds"] > 0 and row["score"] is not None)
    assert manifest["verification"]["score"] == kept[0]["score"]


def test_auto_artifact_loads_and_generates(auto_artifacts):
    model = hotrod.load(auto_artifacts["gpt2"])
    assert model.generate([[5, 6, 7]], max_new_tokens=3).shape == (1, 6)


def test_info_prints_the_candidate_table(auto_artifacts, capsys):
    assert main(["info", str(auto_artifacts["bert"])]) == 0
    out = capsys.readouterr().out
    assert "auto        kept" in out and "int8-static" in out and "fp32" in out


def test_no_candidate_in_budget_keeps_fp32_and_names_the_closest():
    table = [Candidate("fp32", seconds=2.0, score=0.9, drop=0.1, reason="x", figures={}),
             Candidate("int8", seconds=1.0, score=0.95, drop=0.05, reason="y", figures={})]
    with pytest.warns(UserWarning, match="closest was int8"):
        winner = _pick(table, max_drop=0.01)
    assert winner.precision == "fp32" and winner.status == "kept"


def test_a_failing_candidate_is_reported_and_the_rest_go_on(zoo, tmp_path, monkeypatch):
    from hotrod.optimize import quantize

    real = quantize.weight_only

    def broken(model, bits, block_size=32):
        if bits == 4:
            raise RuntimeError("cannot quantize this graph")
        return real(model, bits, block_size)

    monkeypatch.setattr(quantize, "weight_only", broken)
    out = hotrod.optimize(zoo.checkpoint("bert"), tmp_path / "a", precision="auto", verify_examples=2,
                          max_drop=0.05, progress=False)
    rows = {r["precision"]: r for r in json.loads((out / "manifest.json").read_text())["auto"]["candidates"]}
    for name in ("int4", "int4-b128", "int4-b256"):
        assert rows[name]["status"] == "failed" and "cannot quantize" in rows[name]["reason"]
    assert any(r["status"] == "kept" for r in rows.values())


@pytest.mark.parametrize("kwargs", [{"max_drop": -0.1}, {"max_drop": 2}, {"verify_examples": 0}])
def test_auto_bad_budget_is_refused(zoo, tmp_path, kwargs):
    with pytest.raises(hotrod.HotrodError):
        hotrod.optimize(zoo.checkpoint("bert"), tmp_path / "a", precision="auto", progress=False, **kwargs)
