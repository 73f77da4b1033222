"""sparse-embedding: SPLADE vectors equal sentence-transformers' `SparseEncoder.encode` (densified) for every
family with a masked-LM head, on every backend; a plain masked-LM checkpoint keeps being refused until
--task asks; the command, TEI's /embed_sparse route, verification and what is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import hotrod
from hotrod.pipelines import sparse
from tests.test_cli import ok, run
from tests.zoo import MLM_CASES, SPARSE_CASES, build_checkpoint, load_on, save_sparse_encoder

TASK = "sparse-embedding"
MAX_SEQ = 16  # the encoders' max_seq_length: the last text is cut there
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog",
         "a tiny model says hello to the whole world and the quick brown fox jumps over the lazy dog"]
PROMPTS = {"query": "query: ", "document": ""}


class Encoders:
    """Each family's masked-LM checkpoint saved as a SparseEncoder, its artifact and sentence-transformers' own
    model of it, built once for the module on first use."""

    def __init__(self, zoo, root: Path):
        self.zoo, self.root = zoo, root
        self._made: dict[tuple, object] = {}

    def _once(self, key: tuple, make):
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def encoder(self, name: str) -> Path:
        return self._once(("encoder", name), lambda: save_sparse_encoder(
            self.zoo.checkpoint(f"{name}-mlm"), self.root / name, max_seq_length=MAX_SEQ, prompts=PROMPTS))

    def artifact(self, name: str) -> Path:
        return self._once(("artifact", name), lambda: hotrod.optimize(
            self.encoder(name), self.root / f"{name}-artifact", progress=False, verify_examples=8))

    def model(self, name: str, backend: str) -> hotrod.HotrodModel:
        source = self.artifact(name) if backend == "onnxruntime" else self.encoder(name)
        return self._once(("model", name, backend), lambda: load_on(source, backend))

    def reference(self, name: str):
        from sentence_transformers import SparseEncoder

        return self._once(("reference", name), lambda: SparseEncoder(str(self.encoder(name))))


@pytest.fixture(scope="module")
def encoders(zoo, tmp_path_factory) -> Encoders:
    return Encoders(zoo, tmp_path_factory.mktemp("sparse"))


def dense(vectors) -> torch.Tensor:
    return vectors.to_dense() if vectors.is_sparse else vectors


@pytest.mark.parametrize("name", SPARSE_CASES)
def test_embed_sparse_equals_the_sparse_encoder(encoders, name, backend):
    model, reference = encoders.model(name, backend), encoders.reference(name)
    assert model.task == TASK
    torch.testing.assert_close(model.embed_sparse(TEXTS), dense(reference.encode(TEXTS)), atol=1e-5, rtol=0)
    torch.testing.assert_close(model.embed_sparse(TEXTS, prompt_name="query"),
                               dense(reference.encode(TEXTS, prompt_name="query")), atol=1e-5, rtol=0)


def test_the_artifact_reads_back_as_built_and_says_so(encoders, capsys):
    artifact = encoders.artifact("bert")
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["task"] == TASK and manifest["dims"]["vocab_size"] == 100
    assert manifest["verification"]["score_name"] == "sparse cosine" and manifest["verification"]["score"] > 0.9999
    assert manifest["verification"]["top_overlap"] == 1.0
    assert manifest["graphs"]["encoder"]["outputs"] == [{"name": "embeddings", "dtype": "float32",
                                                         "shape": ["batch", 100]}]
    assert "SPLADE max pooling, relu" in ok(capsys, "info", artifact)


def test_splade_settings_and_max_active_dims_are_the_checkpoints(zoo, tmp_path):
    from sentence_transformers import SparseEncoder

    encoder = save_sparse_encoder(zoo.checkpoint("bert-mlm"), tmp_path / "se", pooling_strategy="sum",
                                  activation_function="log1p_relu", max_active_dims=7)
    reference = SparseEncoder(str(encoder))
    artifact = hotrod.optimize(encoder, tmp_path / "artifact", progress=False, verify_examples=4)
    for model in (hotrod.load(encoder, backend="torch"), hotrod.load(artifact)):
        got = model.embed_sparse(TEXTS)
        assert (got != 0).sum(dim=-1).tolist() == [7, 7, 7]
        torch.testing.assert_close(got, dense(reference.encode(TEXTS)), atol=1e-5, rtol=0)
        torch.testing.assert_close(model.embed_sparse(TEXTS, max_active_dims=3),
                                   dense(reference.encode(TEXTS, max_active_dims=3)), atol=1e-5, rtol=0)


def test_left_truncation_keeps_the_end_as_the_tokenizer_does(encoders):
    model, reference = encoders.model("bert", "torch"), encoders.reference("bert")
    reference[0].tokenizer.truncation_side = "left"
    try:
        expected = dense(reference.encode(TEXTS))
    finally:
        reference[0].tokenizer.truncation_side = "right"
    torch.testing.assert_close(model.embed_sparse(TEXTS, truncation_direction="left"), expected, atol=1e-5, rtol=0)
    assert not torch.allclose(model.embed_sparse(TEXTS[2:]), expected[2:])


def test_the_legacy_mlm_transformer_modules_read_the_same(encoders, tmp_path):
    """sentence-transformers 5's SparseEncoder: MLMTransformer and SpladePooling under `sparse_encoder.models`."""
    from sentence_transformers import SparseEncoder

    legacy = Path(shutil.copytree(encoders.encoder("bert"), tmp_path / "legacy"))
    (legacy / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling",
         "type": "sentence_transformers.sparse_encoder.models.SpladePooling"}]))
    (legacy / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ, "do_lower_case": False}))
    (legacy / "1_SpladePooling" / "config.json").write_text(json.dumps(
        {"pooling_strategy": "max", "activation_function": "relu", "word_embedding_dimension": 100}))
    got = hotrod.load(legacy, backend="torch").embed_sparse(TEXTS)
    torch.testing.assert_close(got, dense(SparseEncoder(str(legacy)).encode(TEXTS)), atol=1e-5, rtol=0)
    torch.testing.assert_close(got, dense(encoders.reference("bert").encode(TEXTS)), atol=1e-5, rtol=0)


def test_a_plain_masked_lm_checkpoint_is_sparse_only_when_asked(zoo, tmp_path):
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    checkpoint = zoo.checkpoint("bert-mlm")
    with pytest.raises(hotrod.HotrodError, match="head BertForMaskedLM is not supported by hotrod's bert family, "
                                                 "which runs .*sparse-embedding; pass --task"):
        hotrod.load(checkpoint)
    reference = SparseEncoder(modules=[Transformer(str(checkpoint), transformer_task="fill-mask"), SpladePooling()])
    model = hotrod.load(checkpoint, backend="torch", task=TASK)
    torch.testing.assert_close(model.embed_sparse(TEXTS), dense(reference.encode(TEXTS)), atol=1e-5, rtol=0)
    artifact = hotrod.optimize(checkpoint, tmp_path / "int8", task=TASK, precision="int8", verify_examples=16,
                               progress=False)
    figures = json.loads((artifact / "manifest.json").read_text())["verification"]
    assert figures["score"] == figures["sparse_cosine"] >= 0.99 and figures["top_overlap"] >= 0.9
    assert hotrod.load(artifact).task == TASK
    other = build_checkpoint(MLM_CASES["bert-mlm"], tmp_path / "other", seed=1)  # another model: caught
    caught = hotrod.verify(artifact, against=other, examples=16)
    assert caught["sparse_cosine"] < 0.95 and caught["top_overlap"] < 0.5


def test_families_without_a_masked_lm_head_refuse_the_task_by_name(zoo, encoders, tmp_path):
    with pytest.raises(hotrod.HotrodError, match="unknown task 'sparse-embedding' for modernbert; it runs "):
        hotrod.load(zoo.checkpoint("modernbert"), task=TASK)
    dressed = Path(shutil.copytree(zoo.checkpoint("electra"), tmp_path / "electra"))  # a SparseEncoder's files
    source = encoders.encoder("bert")
    for name in ("modules.json", "sentence_bert_config.json", "1_SpladePooling/config.json"):
        (dressed / name).parent.mkdir(exist_ok=True)
        shutil.copyfile(source / name, dressed / name)
    with pytest.raises(hotrod.HotrodError, match="unknown task 'sparse-embedding' for electra"):
        hotrod.load(dressed)


@pytest.mark.parametrize("change, message", [
    (lambda d: _modules(d, {"idx": 2, "name": "2", "path": "2_SparseAutoEncoder",
                            "type": "sentence_transformers.sparse_encoder.modules.SparseAutoEncoder"}),
     "has a sentence_transformers.sparse_encoder.modules.SparseAutoEncoder module, which hotrod does not run"),
    (lambda d: _modules(d, {"idx": 2, "name": "2", "path": "", "type": "sentence_transformers.models.Normalize"}),
     "lists .*SpladePooling with other modules"),
    (lambda d: _edit(d / "sentence_bert_config.json", transformer_task="feature-extraction"),
     "SpladePooling module, which hotrod does not run after a feature-extraction Transformer"),
    (lambda d: _edit(d / "1_SpladePooling" / "config.json", pooling_strategy="mean"),
     "asks for SPLADE pooling 'mean'; known: max, sum"),
    (lambda d: _edit(d / "config_sentence_transformers.json", max_active_dims=0),
     "max_active_dims must be a whole number >= 1"),
])
def test_what_hotrod_does_not_run_is_refused_by_name(encoders, tmp_path, change, message):
    copy = Path(shutil.copytree(encoders.encoder("bert"), tmp_path / "se"))
    change(copy)
    with pytest.raises(hotrod.HotrodError, match=message):
        hotrod.load(copy, backend="torch")


def _modules(directory: Path, entry: dict) -> None:
    entries = json.loads((directory / "modules.json").read_text())
    (directory / "modules.json").write_text(json.dumps([*entries, entry]))


def _edit(file: Path, **changes) -> None:
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


def test_a_sparse_encoder_is_not_built_for_another_task(encoders):
    with pytest.raises(hotrod.HotrodError, match="is a sparse-embedding model .its own files say so., so it cannot "
                                                 "be built for feature-extraction"):
        hotrod.load(encoders.encoder("bert"), task="feature-extraction")


@pytest.mark.parametrize("call, message", [
    (lambda m: m.embed_sparse([]), "texts must be a text or a non-empty list of texts"),
    (lambda m: m.embed_sparse(["hello", " "]), "text 1 is empty"),
    (lambda m: m.embed_sparse(TEXTS, max_active_dims=0), "max_active_dims must be a whole number >= 1"),
    (lambda m: m.embed_sparse(TEXTS, truncation_direction="up"), "truncation_direction must be right or left"),
    (lambda m: m.embed_sparse(TEXTS, prompt_name="nope"), "prompt_name 'nope' is not one of this model's prompts"),
    (lambda m: m.embed_sparse(TEXTS, truncate=False), "2 has 27 tokens.* at most 16"),
    (lambda m: m.embed(TEXTS), "ends in its sparse-embedding head, so it has no embeddings"),
])
def test_bad_calls_are_one_line(encoders, call, message):
    with pytest.raises(hotrod.HotrodError, match=message):
        call(encoders.model("bert", "torch"))


def test_other_models_have_no_sparse_vectors(zoo):
    with pytest.raises(hotrod.HotrodError, match=r"embed_sparse\(\) needs a sparse-embedding model; this one is "
                                                 "built for feature-extraction"):
        zoo.model("bert", "torch").embed_sparse(TEXTS)


def test_tei_entries_are_the_non_zero_ones_in_index_order():
    vectors = torch.tensor([[0.0, 0.5, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    assert sparse.entries(vectors) == [[{"index": 1, "value": 0.5}, {"index": 3, "value": 2.0}], []]
    assert sparse.keep_largest(torch.tensor([[0.25, 0.5, -0.75]]), 2).tolist() == [[0.0, 0.5, -0.75]]


def test_the_command_prints_the_heaviest_tokens(encoders, capsys):
    artifact = encoders.artifact("bert")
    model = hotrod.load(artifact)
    found = json.loads(ok(capsys, "embed-sparse", str(artifact), "hello world", "--json"))
    expected = sparse.tokens(model, model.embed_sparse(["hello world"]))
    assert [[(e["index"], e["token"]) for e in row] for row in found] == \
           [[(e["index"], e["token"]) for e in row] for row in expected]
    assert found[0][0]["value"] == pytest.approx(expected[0][0]["value"], abs=1e-6)
    lines = ok(capsys, "embed-sparse", str(artifact), "hello world", "--top", "3").splitlines()
    assert lines[0] == f"{len(expected[0])} terms\thello world"
    assert lines[1].split() == [f"{e['token']}:{e['value']:.4f}" for e in expected[0][:3]]
    code, _, err = run(capsys, "embed-sparse", str(artifact), " ")
    assert code != 0 and "text 0 is empty" in err


def test_optimize_takes_the_task_from_the_command_line(zoo, tmp_path, capsys):
    code, out, err = run(capsys, "optimize", zoo.checkpoint("distilbert-mlm"), "--out", tmp_path / "art",
                         "--task", TASK, "--verify-examples", "4")
    assert code == 0 and "sparse cosine" in err, err
    model = hotrod.load(out.strip().splitlines()[-1])
    assert model.task == TASK and model.embed_sparse(["hello world"]).shape == (1, 100)


def test_the_embed_sparse_route_answers_as_tei(encoders):
    from fastapi.testclient import TestClient

    from hotrod.serve.app import create_app
    from hotrod.serve.limits import Access, ServeLimits
    from hotrod.serve.worker import ModelWorker, ServeOptions
    from tests.serve.fake import FakeWorker

    model = encoders.model("bert", "onnxruntime")
    worker = ModelWorker("splade", model, ServeOptions(max_queue_delay_ms=1.0))
    worker.start()
    key = {"Authorization": "Bearer sesame"}
    try:
        app = create_app({"splade": worker}, ServeLimits(max_batch_inputs=3), access=Access(api_key="sesame"))
        with TestClient(app) as client:
            assert client.post("/embed_sparse", json={"inputs": "hello"}).status_code == 401  # behind the door
            body = client.post("/embed_sparse", json={"inputs": TEXTS, "truncate": True}, headers=key).json()
            expected = sparse.entries(model.embed_sparse(TEXTS))
            assert [[e["index"] for e in row] for row in body] == [[e["index"] for e in row] for row in expected]
            assert torch.allclose(torch.tensor([e["value"] for row in body for e in row]),
                                  torch.tensor([e["value"] for row in expected for e in row]), atol=1e-5)
            one = client.post("/embed_sparse", json={"inputs": "hello world", "prompt_name": "query",
                                                     "truncation_direction": "Left"}, headers=key).json()
            assert len(one) == 1 and [e["index"] for e in one[0]] == \
                   [e["index"] for e in sparse.entries(model.embed_sparse(["hello world"], prompt_name="query"))[0]]
            root = client.post("/", json={"inputs": TEXTS, "truncate": True}, headers=key)  # TEI's main route
            assert root.status_code == 200 and root.json() == body
            for request, status, message in [
                ({"inputs": []}, 400, "inputs: the list is empty"),
                ({"inputs": ["hello", ""]}, 400, "inputs[1]: the text is empty"),
                ({"inputs": ["a", "b", "c", "d"]}, 400, "inputs: 4 inputs; this server takes at most 3"),
                ({"inputs": TEXTS[2]}, 400, "has 27 tokens"),
                ({"inputs": "hello", "prompt_name": "nope"}, 400, "prompt_name: prompt_name 'nope' is not one"),
                ({"inputs": "hello", "normalize": True}, 422, "normalize"),
            ]:
                refused = client.post("/embed_sparse", json=request, headers=key)
                answer = refused.json()
                assert refused.status_code == status and message in answer["error"], (request, answer)
                assert answer["error_type"] == "validation"
        workers = {"gpt": FakeWorker(name="gpt"), "splade": ModelWorker("splade", model, ServeOptions())}
        for served in workers.values():
            served.start()
        try:  # TEI clients name no model: the one served model the route's task runs on answers
            with TestClient(create_app(workers, ServeLimits())) as client:
                plain = client.post("/embed_sparse", json={"inputs": "hello world"}).json()
                assert [e["index"] for e in plain[0]] == [e["index"] for e in sparse.entries(model.embed_sparse(
                    ["hello world"]))[0]]
                assert client.post("/v1/generate", json={"text": "a"}).status_code == 400  # /v1 routes: still named
            del workers["splade"]
            with TestClient(create_app(workers | {"gpt2": FakeWorker(name="gpt2")}, ServeLimits())) as client:
                none = client.post("/embed_sparse", json={"inputs": "hello world"}).json()
                assert none["error"].startswith("/embed_sparse needs a sparse-embedding model; this server serves gpt")
        finally:
            for served in workers.values():
                served.stop(drain=False)
    finally:
        worker.stop(drain=False)


def test_the_bench_runs_both_sides_and_agrees(zoo):
    """`hotrod bench` on a masked-LM checkpoint with the task: transformers' logits pooled as SpladePooling
    pools them against hotrod's vectors."""
    from hotrod.bench.case import Case
    from hotrod.bench.runners import agreement, hotrod_runner, pytorch_model, pytorch_runner

    case = Case("bert-mlm", str(zoo.checkpoint("bert-mlm")), "encoder", (9, 7), task=TASK)
    reference = pytorch_model(case.source, case.kind, task=TASK)
    ids, mask = case.inputs(reference.config.vocab_size)
    theirs = pytorch_runner(reference, case.kind, ids, mask, task=TASK)()
    ours = hotrod_runner(hotrod.load(case.source, backend="torch", task=TASK), ids, mask, task=TASK)()
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    assert agreement(ours, theirs, case.kind, mask, TASK) == pytest.approx(1.0)
