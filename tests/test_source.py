"""Reading sources: checkpoint layouts, broken checkpoints, hub ids offline, and the export cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import hotrod
from tests.zoo import CASES, assert_same_tokens, build_checkpoint, load_on, prompt_batch


def edit_json(file: Path, **changes) -> None:
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps(data))


def load(source, backend: str) -> hotrod.HotrodModel:
    return load_on(source, backend)


def assert_matches_reference(model: hotrod.HotrodModel, reference: torch.nn.Module, name: str):
    """Same logits (or hidden states) as `reference` on a padded batch."""
    ids, mask = prompt_batch(CASES[name], (6, 4))
    inputs = {"input_ids": ids, "attention_mask": mask}
    if CASES[name].kind == "seq2seq":
        inputs["decoder_input_ids"] = ids[:, :3]
    with torch.no_grad():
        theirs = reference(**inputs)
    ours = model(**inputs)
    field = "last_hidden_state" if CASES[name].kind == "encoder" else "logits"
    keep = mask.bool() if CASES[name].kind != "seq2seq" else torch.ones(ids.shape[0], 3, dtype=torch.bool)
    torch.testing.assert_close(ours[field][keep], getattr(theirs, field)[keep], atol=1e-4, rtol=0)


# -- sources that are not checkpoints -------------------------------------------------------------


def test_unknown_family_lists_the_supported_ones(zoo, backend, tmp_path):
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    edit_json(source / "config.json", model_type="llama-ish")
    with pytest.raises(hotrod.HotrodError, match="unsupported model_type 'llama-ish'; supported: .*gpt2"):
        load(source, backend)


def test_missing_path(backend, tmp_path):
    with pytest.raises(hotrod.HotrodError, match="no such model directory"):
        load(tmp_path / "nowhere", backend)


def test_file_instead_of_directory(backend, tmp_path):
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(hotrod.HotrodError, match="not a model directory"):
        load(tmp_path / "model.bin", backend)


def test_directory_without_config(backend, tmp_path):
    with pytest.raises(hotrod.HotrodError, match="has no config.json"):
        load(tmp_path, backend)


def test_unreadable_config(zoo, backend, tmp_path):
    source = zoo.copy_checkpoint("bert", tmp_path / "ckpt")
    (source / "config.json").write_text("{not json")
    with pytest.raises(hotrod.HotrodError, match="cannot read .*config.json"):
        load(source, backend)


def test_hub_id_offline_names_the_id(backend):
    with pytest.raises(hotrod.HotrodError, match="cannot download 'someone/tiny-model-that-is-not-cached'"):
        load("someone/tiny-model-that-is-not-cached", backend)


def test_optimize_hub_id_offline_names_the_id(tmp_path):
    with pytest.raises(hotrod.HotrodError, match="'someone/not-cached'"):
        hotrod.optimize("someone/not-cached", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


# -- broken weights -------------------------------------------------------------------------------


def test_missing_weight_file(zoo, backend, tmp_path):
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    (source / "model.safetensors").unlink()
    with pytest.raises(hotrod.HotrodError, match="has no weights"):
        load(source, backend)


def test_missing_tensor_is_named(zoo, backend, tmp_path):
    source = zoo.copy_checkpoint("bert", tmp_path / "ckpt")
    weights = load_file(source / "model.safetensors")
    del weights["encoder.layer.1.output.dense.weight"]
    save_file(weights, source / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(hotrod.HotrodError, match="missing 1 weight.*encoder.layer.1.output.dense.weight"):
        load(source, backend)


def test_weight_shape_disagreeing_with_config(zoo, backend, tmp_path):
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    edit_json(source / "config.json", vocab_size=120)
    with pytest.raises(hotrod.HotrodError, match="has shape"):
        load(source, backend)


def test_corrupt_weight_file(zoo, backend, tmp_path):
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    file = source / "model.safetensors"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with pytest.raises(hotrod.HotrodError, match="cannot read weights"):
        load(source, backend)


# -- checkpoint layouts ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    source = build_checkpoint(CASES["gpt2"], tmp_path_factory.mktemp("sharded"), max_shard_size="20KB")
    assert len(list(source.glob("model-*.safetensors"))) > 1 and (source / "model.safetensors.index.json").exists()
    return source


def test_sharded_safetensors_load_and_match(zoo, backend, sharded):
    assert_matches_reference(load(sharded, backend), zoo.reference("gpt2"), "gpt2")


def test_missing_shard_is_named(backend, sharded, tmp_path):
    import shutil

    source = Path(shutil.copytree(sharded, tmp_path / "ckpt"))
    shard = sorted(source.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(hotrod.HotrodError, match=f"missing weight shard.*{shard.name}"):
        load(source, backend)


@pytest.mark.parametrize("name", ["gpt2", "t5_v1_1", "roberta"])
def test_pytorch_model_bin_loads_and_matches(zoo, backend, tmp_path, name):
    source = zoo.copy_checkpoint(name, tmp_path / "ckpt")
    torch.save(load_file(source / "model.safetensors"), source / "pytorch_model.bin")
    (source / "model.safetensors").unlink()
    assert_matches_reference(load(source, backend), zoo.reference(name), name)


HEAD_MODELS = {  # checkpoints of other heads over the same base model: (case, class, the base inside it)
    "bert_for_sequence_classification": ("bert", "BertForSequenceClassification", lambda m: m.bert),
    "roberta_for_masked_lm": ("roberta", "RobertaForMaskedLM", lambda m: m.roberta),
    "modernbert_for_masked_lm": ("modernbert", "ModernBertForMaskedLM", lambda m: m.model),
    "bare_gpt2_model": ("gpt2", "GPT2Model", None),
}


@pytest.mark.parametrize("head", list(HEAD_MODELS))
def test_the_bare_model_of_a_head_checkpoint_loads_when_asked(backend, tmp_path, head):
    """--task feature-extraction runs the encoder without its head; a bare GPT2Model gets the tied LM head."""
    import transformers

    name, class_name, base = HEAD_MODELS[head]
    torch.manual_seed(1)
    if base is None:
        reference = transformers.GPT2LMHeadModel(CASES[name].config()).eval()
        reference.transformer.save_pretrained(tmp_path / "ckpt")
        task = None
    else:
        headed = getattr(transformers, class_name)(CASES[name].config()).eval()
        headed.save_pretrained(tmp_path / "ckpt")
        reference, task = base(headed), "feature-extraction"
    assert_matches_reference(load_on(tmp_path / "ckpt", backend, task=task), reference, name)


@pytest.mark.parametrize("class_name", ["RobertaForMaskedLM", "RobertaForMultipleChoice", "RobertaForCausalLM"])
def test_a_head_hotrod_does_not_run_is_refused_by_name(backend, tmp_path, class_name):
    import transformers

    getattr(transformers, class_name)(CASES["roberta"].config()).save_pretrained(tmp_path / "ckpt")
    with pytest.raises(hotrod.HotrodError, match=f"head {class_name} is not supported .* runs feature-extraction, "
                                                 "text-classification, token-classification, question-answering"):
        load(tmp_path / "ckpt", backend)


def test_an_unknown_task_is_refused(backend, zoo):
    with pytest.raises(hotrod.HotrodError, match="unknown task 'text-generation' for bert; it runs feature-extraction"):
        load_on(zoo.checkpoint("bert"), backend, task="text-generation")


def test_checkpoint_without_tokenizer_optimizes_and_generates_on_ids(zoo, backend, tmp_path):
    assert not any(zoo.checkpoint("t5").glob("tokenizer*"))
    model = load(hotrod.optimize(zoo.checkpoint("t5"), tmp_path / "art", progress=False), backend)
    assert model.tokenizer is None
    ids, mask = prompt_batch(CASES["t5"], (5, 3))
    assert_same_tokens(model.generate(ids, attention_mask=mask, max_new_tokens=5),
                       zoo.hf_generate("t5", ids, mask, max_new_tokens=5))


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_tokenizer_travels_with_the_model(zoo, backend, name):
    import transformers

    ours = zoo.model(name, backend).tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(zoo.checkpoint(name))
    text = "hello world the quick brown fox"
    assert ours is not None and ours(text)["input_ids"] == theirs(text)["input_ids"]
    assert ours.decode(theirs(text)["input_ids"], skip_special_tokens=True) == text


# -- devices and threads --------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["tpu", "cuda"])
def test_unavailable_device_is_a_clear_error(zoo, backend, device):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    source = zoo.artifact("bert") if backend == "onnxruntime" else zoo.checkpoint("bert")
    with pytest.raises(hotrod.HotrodError, match=device):
        load_on(source, backend, device=device)


def test_negative_threads_refused(zoo, backend):
    source = zoo.artifact("bert") if backend == "onnxruntime" else zoo.checkpoint("bert")
    with pytest.raises(hotrod.HotrodError, match="threads"):
        load_on(source, backend, threads=-1)


def test_unknown_backend_refused(zoo):
    with pytest.raises(hotrod.HotrodError, match="unknown backend 'tensorflow'"):
        hotrod.load(zoo.checkpoint("bert"), backend="tensorflow")


# -- the export cache (HOTROD_CACHE) --------------------------------------------------------------


def cached_artifacts() -> list[Path]:
    import os

    root = Path(os.environ["HOTROD_CACHE"])
    return sorted(p.parent for p in root.glob("*/manifest.json"))


def test_checkpoint_is_exported_into_the_cache_once(zoo):
    first = load(zoo.checkpoint("gpt2"), "onnxruntime")
    (artifact,) = cached_artifacts()
    stamp = (artifact / "decoder.onnx").stat().st_mtime_ns
    second = load(zoo.checkpoint("gpt2"), "onnxruntime")
    assert cached_artifacts() == [artifact]
    assert (artifact / "decoder.onnx").stat().st_mtime_ns == stamp
    assert first.manifest["source"]["weights_sha256"] == second.manifest["source"]["weights_sha256"]


def test_changed_weights_are_exported_again(zoo, tmp_path):
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    load(source, "onnxruntime")
    build_checkpoint(CASES["gpt2"], source, seed=9)
    model = load(source, "onnxruntime")
    assert len(cached_artifacts()) == 2
    assert_matches_reference(model, CASES["gpt2"].hf_class.from_pretrained(source).eval(), "gpt2")


@pytest.mark.parametrize("change", [dict(activation_function="relu"), dict(layer_norm_epsilon=0.5)],
                         ids=lambda d: next(iter(d)))
def test_changed_config_is_not_served_from_a_stale_cache(zoo, tmp_path, change):
    """Same weights, different config.json: the cached export of the old config must not be reused."""
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    load(source, "onnxruntime")
    edit_json(source / "config.json", **change)
    reference = CASES["gpt2"].hf_class.from_pretrained(source).eval()
    assert_matches_reference(load(source, "torch"), reference, "gpt2")
    assert_matches_reference(load(source, "onnxruntime"), reference, "gpt2")


def test_artifact_runs_on_torch_from_its_recorded_checkpoint(zoo, tmp_path):
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    artifact = hotrod.optimize(source, tmp_path / "art", progress=False)
    assert_matches_reference(hotrod.load(artifact, backend="torch"), zoo.reference("gpt2"), "gpt2")
    build_checkpoint(CASES["gpt2"], source, seed=9)
    with pytest.raises(hotrod.HotrodError, match="the torch backend needs the checkpoint"):
        hotrod.load(artifact, backend="torch")


def test_a_gpu_device_that_falls_back_to_the_cpu_is_refused():
    from hotrod.runtime.ort_sessions import check_placement

    class Session:
        def __init__(self, provider):
            self.provider = provider

        def get_providers(self):
            return [self.provider, "CPUExecutionProvider"]

    check_placement({"decoder": Session("CPUExecutionProvider")}, "cpu")
    check_placement({"decoder": Session("CUDAExecutionProvider")}, "cuda")
    with pytest.raises(hotrod.HotrodError, match="would run decoder on the CPU"):
        check_placement({"decoder": Session("CPUExecutionProvider")}, "cuda")


# -- checkpoints that point elsewhere, and unsafe formats -----------------------------------------


@pytest.mark.parametrize("shard", ["/etc/hostname", "../model.safetensors", "link.safetensors"],
                         ids=["absolute", "parent", "symlink_out"])
def test_index_naming_shards_outside_the_checkpoint_is_refused(zoo, tmp_path, shard):
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    weights = load_file(source / "model.safetensors")
    os.replace(source / "model.safetensors", tmp_path / "model.safetensors")
    (source / "link.safetensors").symlink_to(tmp_path / "model.safetensors")
    (source / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: shard for k in weights}}))
    with pytest.raises(hotrod.HotrodError, match="relative path inside|leads outside"):
        load(source, "torch")


def test_pickled_weights_are_refused_where_torch_cannot_load_them_safely(zoo, tmp_path, monkeypatch):
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    torch.save(load_file(source / "model.safetensors"), source / "pytorch_model.bin")
    (source / "model.safetensors").unlink()
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    with pytest.raises(hotrod.HotrodError, match=r"cannot load safely; install torch >= 2\.6"):
        load(source, "torch")


@pytest.mark.parametrize("content", ["[1, 2]", '"gpt2"'], ids=["list", "string"])
def test_a_config_that_is_not_an_object_is_one_line(zoo, tmp_path, content):
    source = zoo.copy_checkpoint("gpt2", tmp_path / "ckpt")
    (source / "config.json").write_text(content)
    with pytest.raises(hotrod.HotrodError, match="a JSON object was expected"):
        load(source, "torch")
