"""A replica's spec, checked at the door: from the CLI's flags and from a Serve config's args, without Ray."""

from __future__ import annotations

import sys

import pytest

from hotrod.cli import main
from hotrod.errors import HotrodError
from hotrod.serve.replicas import ReplicaSpec, Scaling, spec_from_args


def test_args_fill_every_section(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTROD_API_KEY", "from-env")
    spec = spec_from_args({"artifacts": ["a/gpt2", "b/bert"], "replicas": 3, "num_cpus": 2, "max_batch_size": 8,
                           "max_queue": 16, "request_timeout_s": 5.0, "backend": "torch", "threads": 1,
                           "cors_origins": ["https://x"]})
    assert spec.artifacts == ("a/gpt2", "b/bert")
    assert spec.scaling == Scaling(replicas=3, num_cpus=2)
    assert spec.options.max_batch_size == 8 and spec.limits.request_timeout_s == 5.0
    assert spec.runtime.backend == "torch" and spec.runtime.threads == 1
    assert spec.access.api_key == "from-env" and spec.access.cors_origins == ("https://x",)
    assert spec.max_ongoing_requests == 8 + 16  # the running batch and the queue: hotrod's 429 stays the bound


@pytest.mark.parametrize("args, message", [
    ({}, "args.artifacts must be a list"),
    ({"artifacts": [""]}, "args.artifacts must be a list"),
    ({"artifacts": ["x"], "replica": 2}, "unknown argument 'replica'"),
    ({"artifacts": ["x"], "replicas": 0}, "replicas must be an integer >= 1"),
    ({"artifacts": ["x"], "replicas": True}, "replicas must be an integer >= 1"),
    ({"artifacts": ["x"], "num_cpus": float("nan")}, "num_cpus must be a finite number"),
    ({"artifacts": ["x"], "num_gpus": -1}, "num_gpus must be >= 0"),
    ({"artifacts": ["x"], "min_replicas": 3, "max_replicas": 2}, "min_replicas must be in 0..max_replicas"),
    ({"artifacts": ["x"], "target_ongoing_requests": 0}, "target_ongoing_requests must be > 0"),
    ({"artifacts": ["x"], "max_batch_size": 0}, "max_batch_size must be >= 1"),
    ({"artifacts": ["x"], "request_timeout_s": float("inf")}, "request_timeout_s must be a finite number"),
    ({"artifacts": ["x"], "backend": "tensorflow"}, "backend must be one of"),
    ({"artifacts": ["x"], "threads": -1}, "threads must be an integer >= 0"),
    ({"artifacts": ["a/x", "b/x"]}, "both be served as 'x'"),
    ({"artifacts": ["x"], "api_key": "two words"}, "api_key must be a non-empty string"),
    (["x"], "args must be a mapping"),
])
def test_bad_args_are_one_line(args, message):
    with pytest.raises(HotrodError, match=message):
        spec_from_args(args)


def test_replicas_leave_unnamed_runtime_choices_to_each_artifact():
    assert spec_from_args({"artifacts": ["a"]}).told == ()
    spec = spec_from_args({"artifacts": ["a"], "backend": "torch", "engine_precision": "bf16"})
    assert spec.told == ("backend", "precision") and spec.runtime.precision == "bf16"


def test_autoscaling_targets_a_batch_not_rays_default():
    assert Scaling(replicas=2).autoscaling_config(32) is None
    config = Scaling(replicas=2, min_replicas=1, max_replicas=6).autoscaling_config(32)
    assert config == {"min_replicas": 1, "initial_replicas": 2, "max_replicas": 6, "target_ongoing_requests": 32}


def test_replicas_share_a_node_by_the_cpus_ray_reserved(tmp_path):
    spec = ReplicaSpec(("x",), scaling=Scaling(num_cpus=2.4))
    assert spec.replica_runtime().threads == 2
    assert ReplicaSpec(("x",), scaling=Scaling(num_cpus=0)).replica_runtime().threads == 0


def test_a_missing_artifact_names_the_node_and_the_ways_to_ship(tmp_path, monkeypatch, zoo):
    monkeypatch.chdir(tmp_path)
    zoo.copy_artifact("gpt2", tmp_path / "gpt2")
    assert ReplicaSpec(("gpt2",)).local_artifacts() == [str((tmp_path / "gpt2").resolve())]  # relative: working_dir
    with pytest.raises(HotrodError, match=r"artifact .elsewhere. is not on node .*`--ship`"):
        ReplicaSpec(("elsewhere",)).local_artifacts()


@pytest.mark.parametrize("flags, message", [
    (["--replicas", "0"], "replicas must be an integer >= 1"),
    (["--num-cpus", "nan"], "num_cpus must be a finite number"),
    (["--min-replicas", "4", "--max-replicas", "2"], "min_replicas must be in 0..max_replicas"),
])
def test_cli_refuses_bad_ray_flags_before_joining_a_cluster(flags, message, capsys, zoo, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # joining would fail; the flags must fail first
    assert main(["serve", str(zoo.artifact("gpt2")), "--ray", "auto", *flags]) == 1
    assert message in capsys.readouterr().err


def test_cli_without_ray_says_how_to_install_it(capsys, zoo, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(["serve", str(zoo.artifact("gpt2")), "--ray", "auto"]) == 1
    assert "hotrod: error: --ray needs Ray Serve: pip install 'hotrod[ray]'" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--replicas", "3"], ["--num-gpus", "nan"], ["--min-replicas", "5"], ["--ship"],
                                   ["--num-gpus", "0"], ["--min-replicas", "0"]])
def test_ray_flags_without_ray_are_refused_not_ignored(flags, capsys, zoo):
    assert main(["serve", str(zoo.artifact("gpt2")), *flags]) == 1
    assert f"hotrod: error: {flags[0]} applies to a deployment on Ray: add --ray ADDRESS" in capsys.readouterr().err
