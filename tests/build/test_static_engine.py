"""The torch engine's artifact (`hotrod optimize --backend torch`): weights stored at the chosen precision,
fp16's fp32 islands measured once and recorded, verified like any build, and loaded back by `load` into
the static engine (run eagerly on this CPU) with the same answers as the checkpoint at that precision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import hotrod
from hotrod.build import auto, static_engine
from hotrod.errors import HotrodError
from tests.test_artifact import leftovers
from tests.test_cli import assert_one_error_line, ok, run
from tests.zoo import CASES, HEAD_CASES, build_checkpoint, prompt_batch

ISLAND = "decoder.block.1.layer.2.DenseReluDense"
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a GPU does")


def overflowing_t5(directory: Path) -> Path:
    """A T5 v1.1 checkpoint whose second decoder block's gated feed-forward passes fp16's range inside
    (as large T5 checkpoints do) and comes back within it."""
    torch.manual_seed(0)
    model = CASES["t5_v1_1"].hf_class(CASES["t5_v1_1"].config()).eval()
    block = model.decoder.block[1].layer[-1].DenseReluDense
    with torch.no_grad():
        block.wi_0.weight.mul_(3e3)
        block.wi_1.weight.mul_(3e3)
        block.wo.weight.mul_(1e-6)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(autouse=True)
def _small_runs(monkeypatch):
    """fp16's islands measured on 4 texts, by a build and a checkpoint's load alike (these overflow on any),
    and one thread: the models are tiny, and a second thread only waits on a busy machine (the session's
    fixture restores the count)."""
    monkeypatch.setattr(static_engine, "ISLAND_TEXTS", 4)
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("engine-sources")
    return {"gpt2": build_checkpoint(CASES["gpt2"], root / "gpt2"), "t5": overflowing_t5(root / "t5"),
            "bert-cls": build_checkpoint(HEAD_CASES["bert-cls"], root / "bert-cls")}


@pytest.fixture(scope="module")
def built(sources, tmp_path_factory):
    """Engine artifacts by (model, precision), each built on first use."""
    root, cache = tmp_path_factory.mktemp("engine-artifacts"), {}

    def get(name: str, precision: str) -> Path:
        if (name, precision) not in cache:
            cache[name, precision] = hotrod.optimize(sources[name], root / f"{name}-{precision}", backend="torch",
                                                     precision=precision, verify_examples=2, progress=False)
        return cache[name, precision]

    return get


def manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def answers(model, name: str) -> tuple[torch.Tensor, ...]:
    """What a model says on a fixed batch: greedy tokens and logits for the language models, logits for the head."""
    case = CASES["gpt2"] if name == "gpt2" else CASES["t5_v1_1"] if name == "t5" else HEAD_CASES[name]
    ids, mask = prompt_batch(case, (7, 3, 5))
    if name == "bert-cls":
        return (model(ids, attention_mask=mask).logits,)
    tokens = model.generate(ids, attention_mask=mask, max_new_tokens=6)
    if name == "t5":
        return tokens, model(ids, attention_mask=mask, decoder_input_ids=ids[:, :4]).logits
    return tokens, model(ids, attention_mask=mask).logits


BUILDS = [("gpt2", "fp32"), ("gpt2", "bf16"), ("gpt2", "fp16"), ("gpt2", "int8-weight"), ("t5", "fp16"),
          ("t5", "int8-weight"), ("bert-cls", "bf16"), ("bert-cls", "int8-weight")]


@pytest.mark.parametrize("name, precision", BUILDS)
def test_an_engine_artifact_answers_as_the_checkpoint_at_its_precision(built, sources, name, precision):
    model = hotrod.load(built(name, precision))
    assert type(model.backend).__name__ == "StaticBackend" and model.backend.options.precision == precision
    checkpoint = hotrod.load(sources[name], backend="torch", static=True, precision=precision)
    for got, expected in zip(answers(model, name), answers(checkpoint, name), strict=True):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("name, precision", [("gpt2", "int8-weight"), ("bert-cls", "bf16"), ("t5", "fp16")])
def test_the_manifest_records_backend_precision_islands_weights_and_verification(built, name, precision):
    path = built(name, precision)
    data = manifest(path)
    assert data["options"] == {"backend": "torch", "precision": precision, "device": "cpu"}
    assert data["engine"] == {"weights": static_engine.WEIGHTS, "precision": precision,
                              "islands": [ISLAND] if name == "t5" else []}
    assert data["graphs"] == {} and not list(path.glob("*.onnx"))
    assert {static_engine.WEIGHTS, "config.json"} <= set(data["files"]) and (path / static_engine.WEIGHTS).is_file()
    assert data["weights"]["linear_weights"].startswith("int8" if precision == "int8-weight" else precision)
    verification = data["verification"]
    assert verification["device"] == "cpu" and verification["examples"] == 2 and 0 <= verification["score"] <= 1


def test_fp16_islands_stay_fp32_and_are_not_measured_again(built, monkeypatch):
    path = built("t5", "fp16")

    def measured(*args, **kwargs):
        raise AssertionError("an engine artifact's islands are read, not measured")

    monkeypatch.setattr(static_engine, "measure_islands", measured)
    model = hotrod.load(path)
    island = model.backend.module.get_submodule(ISLAND)
    assert island.wo.weight.dtype == torch.float32
    assert model.backend.module.get_submodule("decoder.block.0.layer.2.DenseReluDense").wo.weight.dtype == torch.float16
    tokens, logits = answers(model, "t5")
    assert logits.isfinite().all()


def test_int8_weights_are_stored_as_int8_with_per_channel_scales(built):
    from safetensors import safe_open

    with safe_open(str(built("gpt2", "int8-weight") / static_engine.WEIGHTS), "pt") as stored:
        weight, scales = (stored.get_tensor(f"transformer.h.0.mlp.c_fc.{n}") for n in ("weight", "scales"))
    assert weight.dtype == torch.int8 and scales.dtype == torch.bfloat16 and scales.shape == weight.shape[:1]


def test_loading_on_the_cpu_and_refusals(built):
    path = built("gpt2", "bf16")
    assert hotrod.load(path, backend="torch", device="cpu").backend.device == "cpu"
    for kwargs, message in [({"backend": "onnxruntime"}, "holds the torch engine's weights, not ONNX graphs"),
                            ({"precision": "fp16"}, "holds bf16 weights; for fp16, build another"),
                            ({"static": False}, "weights for the static engine"),
                            ({"profile": True}, "onnxruntime's profiler")]:
        with pytest.raises(HotrodError, match=message):
            hotrod.load(path, **kwargs)


def test_verify_and_generate_read_the_engine_artifact(built, capsys):
    path = built("gpt2", "fp16")
    assert hotrod.verify(path, examples=2)["examples"] == 2
    assert ok(capsys, "generate", path, "5 6 7", "--ids", "--max-new-tokens", "3").count(" ") == 5


def test_info_shows_backend_precision_and_islands(built, capsys):
    out = ok(capsys, "info", built("t5", "fp16"))
    assert "backend=torch, precision=fp16, device=cpu" in out
    assert f"islands     {ISLAND} (kept in fp32)" in out and "torch static engine, fp16 weights" in out


def test_the_command_builds_one(sources, capsys, tmp_path):
    out = tmp_path / "art"
    ok(capsys, "optimize", sources["bert-cls"], "--out", out, "--backend", "torch", "--precision", "int8-weight",
       "--verify-examples", "2")
    assert manifest(out)["options"]["backend"] == "torch"


def test_auto_keeps_the_fastest_passing_engine_candidate(sources, tmp_path):
    out = hotrod.optimize(sources["gpt2"], tmp_path / "auto", backend="torch", precision="auto", verify_examples=2,
                          max_drop=0.5, progress=False)
    data = manifest(out)
    rows = {row["precision"]: row for row in data["auto"]["candidates"]}
    assert list(rows) == auto.candidates("cpu", backend="torch") == ["fp32", "fp16", "bf16", "int8-weight"]
    kept = [row for row in rows.values() if row["status"] == "kept"]
    assert len(kept) == 1 and kept[0]["precision"] == data["auto"]["chosen"] == data["options"]["precision"]
    assert kept[0]["drop"] <= 0.5
    assert kept[0]["seconds"] == min(r["seconds"] for r in rows.values() if r["status"] in ("kept", "passed"))
    assert data["engine"]["precision"] == kept[0]["precision"] and data["verification"]["score"] == kept[0]["score"]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # no candidate left behind
    assert hotrod.load(out).backend.options.precision == kept[0]["precision"]


@no_gpu
def test_an_artifact_for_cuda_is_built_and_verified_on_the_cpu(sources, tmp_path):
    out = hotrod.optimize(sources["gpt2"], tmp_path / "cuda", backend="torch", device="cuda", precision="fp16",
                          verify_examples=2, progress=False)
    data = manifest(out)
    assert data["options"]["device"] == "cuda"
    assert data["verification"]["device"] == "cpu" and "verified on the CPU" in data["verification"]["note"]
    with pytest.raises(HotrodError, match="built for cuda, and this torch sees no cuda device; load it with device='cpu'"):
        hotrod.load(out)
    assert hotrod.load(out, device="cpu").backend.device == "cpu"


@pytest.mark.parametrize("changes, message", [
    ({"precision": "int8"}, "int8 is onnxruntime's .*the torch engine runs fp32, fp16, bf16, int8-weight, fp8"),
    ({"precision": "int4"}, "int4 is onnxruntime's"),
    ({"precision": "bf16", "calibration": ["some text"]}, "precision bf16 reads none"),
    ({"precision": "fp16", "calibration_method": "entropy"}, "the torch engine calibrates no activation ranges"),
    ({"fusion": False}, "none to fuse"),
    ({"precision": "fp8"}, "cannot build fp8 for cpu: fp8 runs through torch._scaled_mm on CUDA GPUs of compute "
                           "capability 8.9 or newer"),
    pytest.param({"precision": "fp8", "device": "cuda"}, "this torch sees no CUDA device", marks=no_gpu),
    pytest.param({"precision": "auto", "device": "cuda"}, "auto times every candidate on the device", marks=no_gpu),
    ({"backend": "onnxruntime", "precision": "fp8"}, "fp8 is the torch engine's precision"),
])
def test_options_the_engine_cannot_build_are_one_line(sources, tmp_path, changes, message):
    with pytest.raises(HotrodError, match=message):
        hotrod.optimize(sources["gpt2"], tmp_path / "out", **{"backend": "torch", "progress": False, **changes})
    assert not (tmp_path / "out").exists()


def test_the_command_refuses_in_one_line(sources, capsys, tmp_path):
    result = run(capsys, "optimize", sources["gpt2"], "--out", tmp_path / "out", "--backend", "torch",
                 "--precision", "int8-static")
    assert_one_error_line(*result, 1, "int8-static is onnxruntime's")


def test_fp8_from_a_checkpoint_is_refused_off_its_gpus(sources):
    with pytest.raises(HotrodError, match="fp8 runs through torch._scaled_mm"):
        hotrod.load(sources["gpt2"], backend="torch", static=True, precision="fp8")


def test_a_failed_build_leaves_nothing(sources, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(static_engine, "write_weights", full)
    with pytest.raises(HotrodError, match="No space left on device"):
        hotrod.optimize(sources["gpt2"], tmp_path / "out", backend="torch", precision="bf16", verify_examples=0,
                        progress=False)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path, "out") == []


def test_the_server_runs_an_engine_artifact_as_built_unless_told_otherwise(built):
    """`hotrod serve` with no --backend or --engine-precision loads an engine artifact as it was built; a
    choice the user made is passed on (and refused where it does not fit)."""
    from hotrod.runtime.base import RuntimeOptions
    from hotrod.serve.metrics import Metrics
    from hotrod.serve.worker import ServeOptions, load_workers

    path = str(built("gpt2", "bf16"))
    workers = load_workers([path], ServeOptions(), RuntimeOptions(), Metrics(), told=())
    backend = next(iter(workers.values())).model.backend
    assert type(backend).__name__ == "StaticBackend" and backend.options.precision == "bf16"
    with pytest.raises(hotrod.HotrodError, match="onnxruntime"):
        load_workers([path], ServeOptions(), RuntimeOptions(), Metrics(), told=("backend",))


@pytest.mark.parametrize("name", ["bert-ner", "bert-qa", "distilbert-cls", "electra-qa", "modernbert-ner",
                                  "xlm_roberta-cls", "bart-mnli"])
def test_encoder_heads_of_every_family_run_on_the_engine(name, tmp_path):
    """Each head kind and each family, on the engine at bf16: the head's outputs as the fp32 checkpoint's,
    within bf16's error."""
    case = HEAD_CASES[name]
    source = build_checkpoint(case, tmp_path / "source")
    path = hotrod.optimize(source, tmp_path / "engine", backend="torch", precision="bf16", verify_examples=2,
                           progress=False)
    model, reference = hotrod.load(path), hotrod.load(source, backend="torch")
    assert type(model.backend).__name__ == "StaticBackend" and model.task == case.task
    ids, mask = prompt_batch(case, (7, 3, 5))
    got, expected = model(ids, attention_mask=mask), reference(ids, attention_mask=mask)
    fields = ("start_logits", "end_logits") if case.task == "question-answering" else ("logits",)
    for field in fields:
        a, b = getattr(got, field), getattr(expected, field)
        assert a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=5e-2, rtol=5e-2), field
