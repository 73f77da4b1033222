"""The BART-like families' own variations, beyond the table's cases (whose parity with transformers the whole
suite checks): M2M100's positions counted from the token ids, untied embeddings and head, Marian's computed
position table, the heads hotrod does not run and the encoder-decoders it does not, refused by name.

BART's and mBART's sequence classification (bart-large-mnli) runs the whole encoder-decoder as one
encoder-kind graph: its logits on every backend are the head table's (`tests/models/test_heads.py`, cases
`<family>-mnli`); here, classify and zero-shot against transformers' pipelines, the kind it runs as, its
batches, its int8 build, and the same checkpoint read as a text-to-text model."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors import safe_open

import hotrod
from hotrod import kinds, tasks
from hotrod.models import get_family, supported_model_types
from hotrod.tasks.constants import CLASSIFY, TEXT2TEXT, ZERO_SHOT
from tests.tasks.test_zero_shot import CALLS, assert_same
from tests.zoo import (
    CASES,
    HEAD_CASES,
    MNLI_CASES,
    assert_int8_within_gate,
    build_checkpoint,
    load_on,
    prompt_batch,
)

BART_LIKE = ("bart", "mbart", "marian", "m2m_100", "pegasus")


def _logits_match(model, reference, ids, mask, decoder_ids):
    with torch.no_grad():
        theirs = reference(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    ours = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_m2m100_counts_positions_past_pad_tokens_as_transformers(zoo, backend):
    """A pad id inside a row (attended to, as the mask says) reads the zero position row and the tokens after
    it move back one position: transformers counts positions from the token ids, and so does hotrod, in the
    encoder, the first decoder step and the steps after it."""
    case = CASES["m2m_100"]
    pad = case.config().pad_token_id
    ids, mask = prompt_batch(case, (9, 6))
    ids[:, 2] = pad
    decoder_ids = torch.tensor([[2, 7, pad, 9, 11], [2, pad, 8, 8, 5]])
    _logits_match(zoo.model("m2m_100", backend), zoo.reference("m2m_100"), ids, mask, decoder_ids)
    expected = zoo.hf_generate("m2m_100", ids, mask, max_new_tokens=8)
    assert torch.equal(zoo.model("m2m_100", backend).generate(ids, attention_mask=mask, max_new_tokens=8), expected)


def _untied(name: str):
    def config():
        made = CASES[name].config()
        made.tie_word_embeddings = False
        return made
    return dataclasses.replace(CASES[name], name=f"{name}-untied", config=config)


@pytest.mark.parametrize("name", ["bart", "marian"])
def test_untied_embeddings_and_head_load_as_transformers_reads_them(tmp_path, backend, name):
    """tie_word_embeddings off: the encoder's and decoder's embeddings and the LM head are three weights."""
    case = _untied(name)
    checkpoint = build_checkpoint(case, tmp_path / "checkpoint", seed=3)
    reference = case.hf_class.from_pretrained(checkpoint).eval()
    assert not torch.equal(reference.get_output_embeddings().weight, reference.get_input_embeddings().weight)
    source = hotrod.optimize(checkpoint, tmp_path / "artifact", progress=False,
                             verify_examples=0) if backend == "onnxruntime" else checkpoint
    ids, mask = prompt_batch(case, (7, 4))
    _logits_match(load_on(source, backend), reference, ids, mask, ids[:, :5])


def test_tied_weights_are_one_tensor_in_memory(zoo):
    module = load_on(zoo.checkpoint("bart"), "torch").backend.module
    assert module.lm_head.weight is module.encoder.embed_tokens.weight is module.decoder.embed_tokens.weight
    marian = load_on(zoo.checkpoint("marian"), "torch").backend.module  # its own decoder embeddings, tied to the head
    assert marian.lm_head.weight is marian.decoder.embed_tokens.weight
    assert marian.lm_head.weight is not marian.encoder.embed_tokens.weight


@pytest.mark.parametrize(("name", "saved"), [("marian", False), ("pegasus", True), ("bart", True)])
def test_position_tables_come_from_the_checkpoint_or_the_formula(zoo, name, saved):
    """Marian's sinusoids are never saved (transformers computes them), Pegasus's are; BART's are learned."""
    with safe_open(str(zoo.checkpoint(name) / "model.safetensors"), "pt") as weights:
        assert any("embed_positions" in key for key in weights.keys()) == saved


@pytest.mark.parametrize(("class_name", "runs"), [
    ("BartForQuestionAnswering", "text2text-generation, text-classification"),
    ("BartForCausalLM", "text2text-generation, text-classification"),
    ("MarianForSequenceClassification", "text2text-generation"), ("MarianForCausalLM", "text2text-generation")])
def test_a_head_hotrod_does_not_run_is_refused_by_name(tmp_path, class_name, runs):
    family = "marian" if class_name.startswith("Marian") else "bart"
    config = CASES[family].config()
    config.architectures = [class_name]
    config.save_pretrained(tmp_path / "ckpt")
    with pytest.raises(hotrod.HotrodError, match=f"head {class_name} is not supported by hotrod's {family} family, "
                                                 f"which runs {runs};"):
        hotrod.load(tmp_path / "ckpt", backend="torch")


@pytest.mark.parametrize("model_type", ["led", "longt5", "prophetnet", "bigbird_pegasus", "umt5", "nllb-moe",
                                        "fsmt"])
def test_an_encoder_decoder_hotrod_does_not_run_is_one_line_naming_what_it_runs(tmp_path, model_type):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "is_encoder_decoder": True}))
    with pytest.raises(hotrod.HotrodError) as info:
        hotrod.load(tmp_path, backend="torch")
    message = str(info.value)
    assert "\n" not in message and f"unsupported model_type {model_type!r}" in message
    for supported in (*BART_LIKE, "t5", "mt5"):
        assert supported in message
    assert set(BART_LIKE) <= set(supported_model_types())


def test_a_marian_decoder_vocabulary_of_another_size_is_refused(tmp_path):
    config = CASES["marian"].config()
    config.decoder_vocab_size = config.vocab_size + 5
    with pytest.raises(hotrod.HotrodError, match=r"decoder vocabulary \(112 tokens\) differs from its encoder's \(107\)"):
        get_family("marian").dims(config)


def test_families_take_their_own_layout():
    """What the issue lists as each family's own, as its registered module builds it."""
    built = {name: get_family(name).build(CASES[name].config()) for name in BART_LIKE}
    assert {n for n, m in built.items() if hasattr(m.encoder, "layernorm_embedding")} == {"bart", "mbart"}
    assert {n for n, m in built.items() if hasattr(m.encoder, "layer_norm")} == {"mbart", "m2m_100", "pegasus"}
    assert {n for n, m in built.items() if hasattr(m, "final_logits_bias")} == set(BART_LIKE) - {"m2m_100"}


# -- sequence classification: bart-large-mnli's head, the whole model as one encoder-kind graph -------------

TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world this is a tiny model", "a dog says hello"]


@pytest.mark.parametrize("name", MNLI_CASES)
def test_the_classifier_is_one_encoder_kind_graph_answering_zero_shot(zoo, name):
    family = get_family(HEAD_CASES[name].model_type)
    assert tasks.family_tasks(family) == (TEXT2TEXT, CLASSIFY) and tasks.family_tasks(get_family("marian")) == (TEXT2TEXT,)
    manifest = json.loads((zoo.artifact(name) / "manifest.json").read_text())
    assert manifest["task"] == CLASSIFY and set(manifest["graphs"]) == {"encoder"}
    assert manifest["verification"]["label_agreement"] == 1.0
    model = zoo.model(name, "onnxruntime")
    assert model.spec is kinds.spec(manifest["kind"]) and not model.spec.generates and family.kind != model.kind
    assert model.task_spec.name == ZERO_SHOT and model.labels == dict(enumerate(("contradiction", "neutral", "entailment")))
    with pytest.raises(hotrod.HotrodError, match=f"this {family.name} model runs as an encoder .*has no generate"):
        model.generate(torch.tensor([[5, 6, 2]]))
    with pytest.raises(hotrod.HotrodError, match=f"no embeddings; build it with --task {TEXT2TEXT}"):
        model.embed(["hello"])


@pytest.mark.parametrize("name", MNLI_CASES)
def test_classify_and_zero_shot_equal_transformers_pipelines(zoo, name, backend):
    import transformers

    model = zoo.model(name, backend)
    reference, tokenizer = zoo.reference(name), model.tokenizer
    classify = transformers.pipeline("text-classification", model=reference, tokenizer=tokenizer)
    for inputs in (TEXTS, [{"text": TEXTS[1], "text_pair": TEXTS[2]}]):
        for top_k in (1, None):
            ours, theirs = model.classify(inputs, top_k=top_k), classify(inputs, top_k=top_k)
            for a, b in zip(ours, theirs, strict=True):
                for x, y in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b], strict=True):
                    assert x["label"] == y["label"] and x["score"] == pytest.approx(y["score"], abs=1e-4)
    zero_shot = transformers.pipeline("zero-shot-classification", model=reference, tokenizer=tokenizer)
    for sequences, labels, kwargs in CALLS:
        assert_same(model.zero_shot(sequences, labels, **kwargs), zero_shot(sequences, candidate_labels=labels, **kwargs))


@pytest.mark.parametrize("name", MNLI_CASES)
def test_a_padded_batch_answers_as_transformers_and_each_row_alone(zoo, name):
    """Rows padded after their EOS to another's width read the same decoder position: the batch's logits are
    transformers' and each row's own, on one padded call as in sub-batches."""
    case, model = HEAD_CASES[name], zoo.model(name, "onnxruntime")
    ids, mask = prompt_batch(case, (40, 3, 17, 60), seed=5)
    with torch.no_grad():
        expected = zoo.reference(name)(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, expected, atol=1e-4, rtol=0)
    padded = model.backend.run("encoder", {"input_ids": ids, "attention_mask": mask})["logits"]
    torch.testing.assert_close(model.backend.to_torch(padded), expected, atol=1e-4, rtol=0)
    for row in range(ids.shape[0]):
        real = mask[row].bool()
        alone = model(input_ids=ids[row][real][None], attention_mask=mask[row][real][None]).logits
        torch.testing.assert_close(alone[0], expected[row], atol=1e-4, rtol=0)


def test_int8_classifier_keeps_the_label_agreement_gate(tmp_path):
    assert_int8_within_gate(HEAD_CASES["bart-mnli"], "label_agreement", 0.9, tmp_path)


def test_the_classifier_checkpoint_read_as_text_to_text_is_transformers_conditional_generation(zoo):
    """--task text2text-generation: the same weights as BartForConditionalGeneration reads them (the LM head tied
    to the embeddings, no logits bias, the classification head left out)."""
    import transformers

    checkpoint = zoo.checkpoint("bart-mnli")
    model = hotrod.load(checkpoint, backend="torch", task=TEXT2TEXT)
    assert model.kind == get_family("bart").kind and model.spec.generates
    ids, mask = prompt_batch(HEAD_CASES["bart-mnli"], (7, 4))
    _logits_match(model, transformers.BartForConditionalGeneration.from_pretrained(checkpoint).eval(), ids, mask,
                  ids[:, :5])


def test_the_server_routes_it_as_an_encoder_head(zoo):
    """The server asks the model's kind, not the family's: /v1/zero-shot and /v1/classify answer as the methods,
    and /v1/generate refuses it by its kind."""
    from fastapi.testclient import TestClient

    from hotrod.serve.app import create_app
    from hotrod.serve.limits import ServeLimits
    from hotrod.serve.worker import ModelWorker, ServeOptions

    model = zoo.model("bart-mnli", "torch")
    worker = ModelWorker("mnli", model, ServeOptions(max_queue_delay_ms=1.0))
    worker.start()
    try:
        with TestClient(create_app({"mnli": worker}, ServeLimits())) as client:
            body = client.post("/v1/zero-shot", json={"model": "mnli", "input": TEXTS[:2],
                                                      "candidate_labels": ["hello", "a dog"]}).json()
            assert_same(body["results"], model.zero_shot(TEXTS[:2], ["hello", "a dog"]))
            body = client.post("/v1/classify", json={"model": "mnli", "input": TEXTS[0]}).json()
            assert body["results"] == model.classify(TEXTS[0])
            refused = client.post("/v1/generate", json={"model": "mnli", "text": "hello"})
            assert refused.status_code == 400 and "kind encoder" in refused.json()["error"]["message"]
    finally:
        worker.stop(drain=False)
