"""Train the small demo models that ship in `src/hotrod/demo/models/`.

Accuracy can only be judged on trained weights, and the demo must work offline, so hotrod ships four tiny
models trained on synthetic tasks whose answers can be checked exactly:

  t5-dates      T5ForConditionalGeneration: dates written many ways -> ISO 8601
                ("the fifth of march twenty twenty-one" -> "2021-03-05")
  gpt2-numbers  GPT2LMHeadModel: English number words -> digits
                ("three hundred and forty-two thousand seven =" -> "342007")
  gpt2-itn      GPT2LMHeadModel: a sentence with spelled-out numbers -> the same sentence in digits
                ("she paid forty dollars for the maps so they went home =" -> "she paid 40 dollars ...");
                its answers are mostly copied from the prompt, the workload of prompt lookup decoding
  marian-numbers  MarianMTModel in Marian's (OPUS-MT) conventions: English number words "translated" to digits
                ("three hundred and forty-two thousand seven" -> "342007")

For each model the script generates the data from a seed, trains a tokenizer on the task's text, trains
the model on CPU, measures exact match with greedy `generate` (fp32) on a held-out set whose values never
occur in training, and saves the checkpoint, tokenizer, generation config, `heldout.tsv` and `demo.json`.
Everything is seeded: the same command gives the same data, tokenizers and (on the same machine) weights.

    python scripts/train_demo_models.py                 # every model
    python scripts/train_demo_models.py --only t5 --steps 3000
    python scripts/train_demo_models.py --only marian --threads 1

It also trains four heads on the packaged all-MiniLM-L6-v2 (`train_demo_heads.py`, `--only intents|ner|qa|rerank`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import math
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import itn_sentences
import torch
from train_demo_heads import HEAD_RECIPES, HEAD_SCORES, build_head

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "src" / "hotrod" / "demo" / "models"

# ---------------------------------------------------------------------------------------------------------
# English number words, shared by both tasks

_UNITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
          "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_ORDINAL_UNITS = ["zeroth", "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
                  "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth",
                  "seventeenth", "eighteenth", "nineteenth"]
_ORDINAL_TENS = {20: "twentieth", 30: "thirtieth"}


def words_below_100(n: int) -> str:
    """0..99 in words, tens and units joined by a hyphen ("forty-two")."""
    if n < 20:
        return _UNITS[n]
    tens, unit = divmod(n, 10)
    return _TENS[tens] + (f"-{_UNITS[unit]}" if unit else "")


def words_below_1000(n: int, rng: random.Random) -> str:
    """0..999 in words; "and" after "hundred" appears in about a third of cases (British usage)."""
    hundreds, rest = divmod(n, 100)
    if not hundreds:
        return words_below_100(rest)
    head = f"{_UNITS[hundreds]} hundred"
    if not rest:
        return head
    return f"{head} {'and ' if rng.random() < 0.35 else ''}{words_below_100(rest)}"


def number_words(n: int, rng: random.Random) -> str:
    """0..999,999 in words, with the optional British "and" varied at random."""
    thousands, rest = divmod(n, 1000)
    if not thousands:
        return words_below_1000(rest, rng)
    head = f"{words_below_1000(thousands, rng)} thousand"
    if not rest:
        return head
    joiner = "and " if rest < 100 and rng.random() < 0.5 else ""
    return f"{head} {joiner}{words_below_1000(rest, rng)}"


def ordinal_words(n: int) -> str:
    """1..31 as an ordinal word ("twenty-first")."""
    if n < 20:
        return _ORDINAL_UNITS[n]
    tens, unit = divmod(n, 10)
    return _ORDINAL_TENS[n] if not unit else f"{_TENS[tens]}-{_ORDINAL_UNITS[unit]}"


def ordinal_suffix(n: int) -> str:
    """1..31 with its English suffix ("1st", "22nd", "13th")."""
    if 11 <= n % 100 <= 13:
        return f"{n}th"
    return f"{n}{({1: 'st', 2: 'nd', 3: 'rd'}).get(n % 10, 'th')}"


# ---------------------------------------------------------------------------------------------------------
# Task 1 (T5): date normalization

_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december"]
_MONTH_ABBREVIATIONS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_FIRST_DATE, _LAST_DATE = dt.date(1900, 1, 1), dt.date(2099, 12, 31)


def year_words(year: int, rng: random.Random) -> str:
    """A year as people say it: "nineteen oh five", "two thousand and eight", "twenty twenty-one"."""
    century, rest = divmod(year, 100)
    if year >= 2000 and (rest < 10 or rng.random() < 0.25):
        if not rest:
            return "two thousand"
        return f"two thousand {'and ' if rng.random() < 0.5 else ''}{words_below_100(rest)}"
    if not rest:
        return f"{words_below_100(century)} hundred"
    if rest < 10:
        return f"{words_below_100(century)} oh {_UNITS[rest]}"
    return f"{words_below_100(century)} {words_below_100(rest)}"


def date_text(date: dt.date, rng: random.Random) -> str:
    """One of many ways to write `date`, chosen at random; all are unambiguous (no "03/05" style)."""
    month = _MONTHS[date.month - 1]
    abbreviation = _MONTH_ABBREVIATIONS[date.month - 1]
    day, year = date.day, date.year
    short = rng.choice([abbreviation, abbreviation + "."] if abbreviation != month else [month])
    formats = [
        lambda: f"{month} {day}, {year}",
        lambda: f"{month} {ordinal_suffix(day)}, {year}",
        lambda: f"{day} {month} {year}",
        lambda: f"{ordinal_suffix(day)} {month} {year}",
        lambda: f"{short} {day} {year}",
        lambda: f"{day} {short} {year}",
        lambda: f"the {ordinal_words(day)} of {month} {year_words(year, rng)}",
        lambda: f"{month} the {ordinal_words(day)}, {year}",
        lambda: f"the {ordinal_suffix(day)} of {month}, {year}",
        lambda: f"{month} {ordinal_words(day)}, {year_words(year, rng)}",
        lambda: f"{ordinal_words(day)} of {month} {year}",
        lambda: f"{day}.{date.month}.{year}",
        lambda: f"{year}/{date.month}/{day}",
    ]
    text = rng.choice(formats)()
    style = rng.random()
    if style < 0.35:  # Capitalized months, as in running text
        for name in (month, abbreviation):
            text = text.replace(name, name.capitalize())
    elif style < 0.45:
        text = text.capitalize()
    return text


def random_date(rng: random.Random) -> dt.date:
    return _FIRST_DATE + dt.timedelta(days=rng.randrange((_LAST_DATE - _FIRST_DATE).days + 1))


# ---------------------------------------------------------------------------------------------------------
# Task 2 (GPT-2): number words to digits


def random_number(rng: random.Random, min_digits: int = 1) -> int:
    """A number with a uniformly chosen count of digits (1..6), so that short and long ones are both common."""
    digits = rng.randint(min_digits, 6)
    return rng.randrange(0 if digits == 1 else 10 ** (digits - 1), 10**digits)


def number_prompt(n: int, rng: random.Random) -> str:
    return f"{number_words(n, rng)} ="


# ---------------------------------------------------------------------------------------------------------
# The tasks


@dataclass(frozen=True)
class Task:
    """A synthetic task: values, how to write a value as an (input, target) pair, and the held-out values."""

    name: str
    description: str
    prompt_format: str
    sample_value: Callable[[random.Random], object]
    sample_heldout_value: Callable[[random.Random], object]
    render: Callable[[object, random.Random], tuple[str, str]]

    def heldout(self, seed: int, count: int) -> list[tuple[object, str, str]]:
        """`count` distinct values with one rendering each; training never sees any rendering of them."""
        rng = random.Random(f"{self.name}-heldout-{seed}")
        values: dict[object, tuple[str, str]] = {}
        while len(values) < count:
            value = self.sample_heldout_value(rng)
            if value not in values:
                values[value] = self.render(value, rng)
        return [(value, source, target) for value, (source, target) in values.items()]

    def stream(self, seed: int, exclude: set) -> Iterator[tuple[str, str]]:
        """An endless, seeded stream of training pairs whose values are not in `exclude`."""
        rng = random.Random(f"{self.name}-train-{seed}")
        while True:
            value = self.sample_value(rng)
            if value not in exclude:
                yield self.render(value, rng)


DATES = Task(
    name="t5-dates",
    description="Date normalization: a date written in words or in one of many common formats, "
                "between 1900-01-01 and 2099-12-31, rewritten as ISO 8601 (YYYY-MM-DD).",
    prompt_format="the date as written, e.g. 'the fifth of march twenty twenty-one' -> '2021-03-05'",
    sample_value=random_date,
    sample_heldout_value=random_date,
    render=lambda date, rng: (date_text(date, rng), date.isoformat()),
)

NUMBERS = Task(
    name="gpt2-numbers",
    description="Number words to digits: an English number from 0 to 999,999 in words (hyphenated tens, "
                "optional British 'and'), followed by ' =', continued with its digits and end-of-text.",
    prompt_format="'<number in words> =' -> ' <digits><|endoftext|>', e.g. 'three hundred forty-two =' -> '342'",
    sample_value=random_number,
    # Held-out numbers have 3 to 6 digits: the 100 numbers below 100 are all needed to learn the words.
    sample_heldout_value=lambda rng: random_number(rng, min_digits=3),
    render=lambda n, rng: (number_prompt(n, rng), str(n)),
)

NUMBER_TRANSLATION = Task(
    name="marian-numbers",
    description="Number words to digits as translation: an English number from 0 to 999,999 in words "
                "(hyphenated tens, optional British 'and') translated to its digits.",
    prompt_format="'<number in words>' -> '<digits>', e.g. 'three hundred and forty-two' -> '342'",
    sample_value=random_number,
    sample_heldout_value=lambda rng: random_number(rng, min_digits=3),  # as gpt2-numbers: all of 0..99 is taught
    render=lambda n, rng: (number_words(n, rng), str(n)),
)

ITN = Task(
    name="gpt2-itn",
    description="Inverse text normalization: a sentence of three clauses whose numbers (0 to 9,999, mostly "
                "below 100) are spelled out, followed by ' =', continued with the same sentence, its numbers "
                "in digits, and end-of-text. Most of each answer is copied from the prompt.",
    prompt_format="'<sentence> =' -> ' <sentence, numbers in digits><|endoftext|>', e.g. 'the shop sold forty-two "
                  "apples at the market and then she went home yesterday =' -> 'the shop sold 42 apples at the "
                  "market and then she went home yesterday'",
    sample_value=itn_sentences.random_sentence,
    sample_heldout_value=itn_sentences.random_sentence,
    render=lambda value, rng: itn_sentences.render(value, number_words, rng),
)


# ---------------------------------------------------------------------------------------------------------
# Tokenizers


def _corpus(task: Task, seed: int, exclude: set, size: int) -> list[str]:
    stream = task.stream(seed + 1, exclude)
    texts = []
    for _ in range(size):
        source, target = next(stream)
        texts += [source, target]
    return texts


def _word_piece_bpe(texts: list[str], specials: list[str]):
    """A BPE with SentencePiece's "▁" word marks, one token per digit, punctuation apart, `specials` first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Punctuation(),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=1000, min_frequency=2, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def train_t5_tokenizer(texts: list[str]):
    """A BPE in T5's conventions: <pad>=0, </s>=1, <unk>=2, "▁" word marks, one token per digit."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = _word_piece_bpe(texts, ["<pad>", "</s>", "<unk>"])
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=64)


def train_marian_tokenizer(texts: list[str]):
    """A BPE with SentencePiece's "▁" word marks in Marian's conventions: </s>=0, <unk>=1, <pad> the last id,
    one token per digit; the source ends with </s>, as MarianTokenizer's does.

    OPUS-MT checkpoints keep sentencepiece unigram files (MarianTokenizer); a tokenizer.json is what every
    transformers release loads offline. BPE, as T5's recipe has it: `tokenizers`' unigram trainer keeps
    little more than single letters on a corpus this small.
    """
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = _word_piece_bpe(texts, ["</s>", "<unk>"])
    tok.add_special_tokens(["<pad>"])  # the last id, as in every OPUS-MT vocabulary
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A $B </s>",
                                                       special_tokens=[("</s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=64)


def train_gpt2_tokenizer(texts: list[str], positions: int = 64):
    """A byte-level BPE in GPT-2's conventions: <|endoftext|>=0 as bos, eos and pad; one token per digit."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, min_frequency=2, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    # Prompts of a batch are left-padded with <|endoftext|>, as decoder-only generation expects.
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>", pad_token="<|endoftext|>", padding_side="left",
                                   model_max_length=positions)


# ---------------------------------------------------------------------------------------------------------
# Models and batches


def build_t5(vocab_size: int):
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=vocab_size, d_model=128, d_kv=32, d_ff=512, num_layers=3, num_decoder_layers=3,
                      num_heads=4, relative_attention_num_buckets=32, relative_attention_max_distance=64,
                      dropout_rate=0.0, feed_forward_proj="gated-gelu", tie_word_embeddings=True,
                      pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    return T5ForConditionalGeneration(config)


def build_marian(tokenizer, positions: int = 64):
    """Marian as the OPUS-MT checkpoints have it (Helsinki-NLP/opus-mt-en-de's config, smaller): sinusoidal
    positions, embeddings times sqrt(d_model), swish, post-norm, one vocabulary shared by the encoder, the
    decoder and the tied LM head, whose last id <pad> is the decoder start token; eos </s>=0."""
    from transformers import MarianConfig, MarianMTModel

    pad = tokenizer.pad_token_id
    config = MarianConfig(vocab_size=len(tokenizer), decoder_vocab_size=len(tokenizer), d_model=128,
                          encoder_layers=3, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4,
                          encoder_ffn_dim=512, decoder_ffn_dim=512, max_position_embeddings=positions,
                          activation_function="swish", scale_embedding=True, dropout=0.0, attention_dropout=0.0,
                          activation_dropout=0.0, pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0,
                          bos_token_id=None, forced_eos_token_id=0, share_encoder_decoder_embeddings=True,
                          tie_word_embeddings=True)
    return MarianMTModel(config)


def build_gpt2(vocab_size: int, positions: int = 64):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab_size, n_positions=positions, n_embd=128, n_layer=4, n_head=4, n_inner=512,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                        pad_token_id=0)
    return GPT2LMHeadModel(config)


def generation_config(recipe: Recipe, tokenizer):
    """Greedy decoding that stops at end-of-sequence, with room for the longest answer of the task.

    Marian's is an OPUS-MT checkpoint's (bad_words_ids banning <pad>, forced EOS at max_length, max_length
    rather than max_new_tokens; the start token and pad are <pad>), greedy rather than its 4 beams, as the
    demo decodes; `renormalize_logits`, which newer OPUS-MT configs also set, hotrod does not run.
    """
    from transformers import GenerationConfig

    if recipe.architecture == "MarianMTModel":
        pad = tokenizer.pad_token_id
        return GenerationConfig(max_length=recipe.max_new_tokens + 1, do_sample=False, num_beams=1,
                                bad_words_ids=[[pad]], decoder_start_token_id=pad, eos_token_id=0,
                                forced_eos_token_id=0, pad_token_id=pad)
    if recipe.kind == "decoder":
        return GenerationConfig(max_new_tokens=recipe.max_new_tokens, do_sample=False, num_beams=1,
                                bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return GenerationConfig(max_new_tokens=recipe.max_new_tokens, do_sample=False, num_beams=1,
                            decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)


def save_tokenizer(tokenizer, out: Path) -> None:
    """save_pretrained, naming the class every transformers release loads (not 5.x's TokenizersBackend).

    Padding and truncation left on by the last batch are cleared, so tokenizer.json holds only the tokenizer.
    """
    tokenizer.backend_tokenizer.no_padding()
    tokenizer.backend_tokenizer.no_truncation()
    tokenizer.save_pretrained(out)
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def t5_batch(tokenizer, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """Encoder inputs end with </s> (the post-processor adds it); labels are the target + </s>, -100 padded."""
    sources, targets = zip(*pairs)
    batch = tokenizer(list(sources), return_tensors="pt", padding=True)
    labels = tokenizer(list(targets), return_tensors="pt", padding=True)
    batch["labels"] = labels["input_ids"].masked_fill(labels["attention_mask"] == 0, -100)
    return dict(batch)


def gpt2_batch(tokenizer, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """prompt ' digits' <|endoftext|>, right-padded; the loss covers only the answer and its end-of-text.

    Prompt and answer are tokenized separately, exactly as generation sees them (the prompt alone).
    """
    eos = tokenizer.eos_token_id
    rows, answers = [], []
    for source, target in pairs:
        prompt = tokenizer(source)["input_ids"]
        answer = tokenizer(" " + target)["input_ids"] + [eos]
        rows.append(prompt + answer)
        answers.append(len(answer))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), eos, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, n) in enumerate(zip(rows, answers)):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        labels[i, len(row) - n : len(row)] = torch.tensor(row[-n:])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


# ---------------------------------------------------------------------------------------------------------
# Training and evaluation


def train(model, make_batch, stream, steps: int, batch_size: int, lr: float, label: str) -> float:
    """AdamW with linear warm-up and cosine decay; returns the training time in seconds."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    model.train()
    start, running = time.perf_counter(), None
    for step in range(1, steps + 1):
        batch = make_batch([next(stream) for _ in range(batch_size)])
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % 200 == 0 or step == steps:
            elapsed = time.perf_counter() - start
            print(f"  [{label}] step {step}/{steps}  loss {running:.4f}  lr {schedule.get_last_lr()[0]:.2e}  "
                  f"{elapsed:.0f}s", flush=True)
    model.eval()
    return time.perf_counter() - start


@torch.inference_mode()
def predict(model, tokenizer, sources: list[str], decoder_only: bool, batch_size: int = 100) -> list[str]:
    """Greedy generation (the checkpoint's generation_config) in fp32, decoded without special tokens."""
    outputs = []
    for i in range(0, len(sources), batch_size):
        batch = tokenizer(sources[i : i + batch_size], return_tensors="pt", padding=True)
        out = model.generate(**batch, do_sample=False, num_beams=1)
        if decoder_only:
            out = out[:, batch["input_ids"].shape[1] :]
        outputs += [text.strip() for text in tokenizer.batch_decode(out, skip_special_tokens=True)]
    return outputs


def exact_match(predictions: list[str], targets: list[str]) -> float:
    return sum(p == t for p, t in zip(predictions, targets)) / len(targets)


def directory_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ---------------------------------------------------------------------------------------------------------
# One model, end to end


@dataclass(frozen=True)
class Recipe:
    key: str
    task: Task
    kind: str
    architecture: str
    steps: int
    batch_size: int
    lr: float
    max_new_tokens: int
    positions: int = 64


RECIPES = {
    "t5": Recipe("t5", DATES, "seq2seq", "T5ForConditionalGeneration", steps=3000, batch_size=64, lr=2e-3,
                 max_new_tokens=16),
    "gpt2": Recipe("gpt2", NUMBERS, "decoder", "GPT2LMHeadModel", steps=4000, batch_size=64, lr=1.5e-3,
                   max_new_tokens=10),
    "itn": Recipe("itn", ITN, "decoder", "GPT2LMHeadModel", steps=3500, batch_size=64, lr=1.5e-3,
                  max_new_tokens=64, positions=128),
    "marian": Recipe("marian", NUMBER_TRANSLATION, "seq2seq", "MarianMTModel", steps=3000, batch_size=64,
                     lr=1e-3, max_new_tokens=15),
}


def build(recipe: Recipe, out_root: Path, seed: int, steps: int, heldout_size: int, threads: int) -> dict:
    task = recipe.task
    print(f"== {task.name}: {task.description}", flush=True)
    torch.manual_seed(seed)
    heldout = task.heldout(seed, heldout_size)
    exclude = {value for value, _, _ in heldout}
    decoder_only = recipe.kind == "decoder"

    texts = _corpus(task, seed, exclude, 20000)
    if decoder_only:
        tokenizer = train_gpt2_tokenizer(texts, recipe.positions)
        model = build_gpt2(len(tokenizer), recipe.positions)
    elif recipe.architecture == "MarianMTModel":
        tokenizer = train_marian_tokenizer(texts)
        model = build_marian(tokenizer, recipe.positions)
    else:
        tokenizer = train_t5_tokenizer(texts)
        model = build_t5(len(tokenizer))
    print(f"  tokenizer: {len(tokenizer)} tokens", flush=True)
    params = sum(p.numel() for p in model.parameters())
    print(f"  model: {recipe.architecture}, {params:,} parameters", flush=True)

    model.generation_config = generation_config(recipe, tokenizer)

    make_batch = functools.partial(gpt2_batch if decoder_only else t5_batch, tokenizer)
    seconds = train(model, make_batch, task.stream(seed, exclude), steps, recipe.batch_size, recipe.lr, task.name)

    sources = [source for _, source, _ in heldout]
    targets = [target for _, _, target in heldout]
    predictions = predict(model, tokenizer, sources, decoder_only)
    em = exact_match(predictions, targets)
    print(f"  held-out exact match (greedy, fp32): {em:.4f} on {len(targets)} examples", flush=True)
    for source, prediction, target in [(s, p, t) for s, p, t in zip(sources, predictions, targets) if p != t][:10]:
        print(f"    miss: {source!r} -> {prediction!r} (expected {target!r})")

    out = out_root / task.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)  # also writes model.generation_config
    save_tokenizer(tokenizer, out)
    with open(out / "heldout.tsv", "w", encoding="utf-8", newline="\n") as f:
        for source, target in zip(sources, targets):
            f.write(f"{source}\t{target}\n")
    info = {
        "name": task.name,
        "kind": recipe.kind,
        "architecture": recipe.architecture,
        "task": task.description,
        "prompt_format": task.prompt_format,
        "check": "tokenizer.decode(generated tokens, skip_special_tokens=True).strip() == target"
                 + (" (the tokens after the prompt)" if decoder_only else ""),
        "parameters": params,
        "vocab_size": len(tokenizer),
        "config": {k: v for k, v in model.config.to_diff_dict().items() if not k.startswith(("_", "transformers"))},
        "training": {"steps": steps, "batch_size": recipe.batch_size, "learning_rate": recipe.lr,
                     "optimizer": "AdamW, linear warm-up, cosine decay", "seed": seed, "threads": threads,
                     "seconds": round(seconds, 1), "torch": torch.__version__},
        "heldout": {"file": "heldout.tsv", "examples": len(targets), "decoding": "greedy, fp32",
                    "exact_match": round(em, 4)},
    }
    (out / "demo.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    size = directory_size(out)
    info["size_bytes"] = size
    print(f"  saved {out} ({size / 1e6:.2f} MB, trained in {seconds:.0f}s)", flush=True)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(RECIPES) + sorted(HEAD_RECIPES), help="train only this model")
    parser.add_argument("--steps", type=int, help="training steps (default: each recipe's own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout", type=int, default=300, help="held-out examples per model (>= 200)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (on a busy machine, 1 can be much faster than an oversubscribed 2)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="parent directory of the model directories")
    args = parser.parse_args(argv)
    if args.heldout < 200:
        parser.error("--heldout must be at least 200")
    torch.set_num_threads(args.threads)
    results, heads = [], []
    for key in [args.only] if args.only else [*sorted(RECIPES, reverse=True), *sorted(HEAD_RECIPES)]:
        if key in HEAD_RECIPES:
            heads.append(build_head(key, args.out, args.seed, args.steps, args.heldout, args.threads))
            continue
        recipe = RECIPES[key]
        results.append(build(recipe, args.out, args.seed, args.steps or recipe.steps, args.heldout, args.threads))
    print("\nsummary")
    for info in results:
        print(f"  {info['name']:<14}{info['parameters']:>11,} params  {info['size_bytes'] / 1e6:6.2f} MB  "
              f"{info['training']['seconds']:6.0f}s  held-out EM {info['heldout']['exact_match']:.4f}")
    for info in heads:
        print(f"  {info['name']:<14}{info['shipped']['parameters']:>11,} shipped params  "
              f"{info['training']['seconds']:6.0f}s  held-out {info['heldout']}")
    scores = [info["heldout"]["exact_match"] for info in results]
    scores += [next((info["heldout"][k] for k in HEAD_SCORES if k in info["heldout"]), 0.0) for info in heads]
    return 0 if all(score >= 0.95 for score in scores) else 1


if __name__ == "__main__":
    sys.exit(main())
