"""The table of tiny test models, and the session-wide zoo that builds, exports and loads them once.

Every parametrized test is driven by `CASES`: one entry per architecture variant hotrod claims to
support. A checkpoint is built from seeded random weights with transformers and `save_pretrained`,
so transformers itself (loading the same directory) is the reference for every comparison.
"""

from __future__ import annotations

import copy
import functools
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import transformers
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

import hotrod

VOCAB = 100
HIDDEN = 32
LAYERS = 2
HEADS = 4
POSITIONS = 64  # of the absolute-position models (GPT-2, BERT, RoBERTa)
# static: the torch backend's static engine, run eagerly on the CPU; cuda: the same engine at fp32 on a GPU,
# recorded as CUDA graphs (only where torch sees one)
BACKENDS = ("onnxruntime", "torch", "static") + (("cuda",) if torch.cuda.is_available() else ())
VERIFY_EXAMPLES = 8  # each zoo artifact is verified against its checkpoint on this many built-in texts


# -- tokenizers -------------------------------------------------------------------------------------

_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world this is a tiny tokenizer for tests",
    "a small model says hello to the whole world",
    "pack my box with five dozen liquor jugs",
    "sphinx of black quartz judge my vow",
    "how vexingly quick daft zebras jump",
]
BERT_WORDS = "the quick brown fox jumps over lazy dog hello world this is a tiny model says to".split()


def _trained_bpe(specials: list[str]):
    """A byte-free BPE tokenizer (tokenizers') trained on a few sentences; `specials` take the first ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False)
    tokenizer.train_from_iterator(_CORPUS * 10, trainer)
    return tokenizer


def save_bpe_tokenizer(directory: Path) -> int:
    """GPT-2's kind (id 0 is `<|endoftext|>`); returns its size."""
    wrapped = transformers.PreTrainedTokenizerFast(
        tokenizer_object=_trained_bpe(["<|endoftext|>", "<unk>"]), bos_token="<|endoftext|>",
        eos_token="<|endoftext|>", unk_token="<unk>")
    wrapped.save_pretrained(directory)
    return len(wrapped)


def save_roberta_tokenizer(directory: Path) -> int:
    """RoBERTa's kind: <s> 0, <pad> 1, </s> 2 (the configs' bos, pad and eos), pairs as <s> A </s></s> B </s>."""
    from tokenizers import processors

    tokenizer = _trained_bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=False,
                                                            add_prefix_space=False)
    wrapped = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        cls_token="<s>", sep_token="</s>", mask_token="<mask>")
    wrapped.save_pretrained(directory)
    return len(wrapped)


def save_eos_tokenizer(directory: Path, specials: tuple[str, ...] = ("<pad>", "</s>", "<unk>"),
                       size: int = VOCAB) -> int:
    """T5's kind, as Pegasus's and Marian's sentencepiece tokenizers behave: no BOS, `</s>` after each text;
    `specials` take the first ids (Pegasus: pad 0, eos 1; Marian: eos 0, unk 1 and, here, pad 2); added
    tokens fill the vocabulary out to `size`."""
    from tokenizers import processors

    tokenizer = _trained_bpe(list(specials))
    eos = ("</s>", specials.index("</s>"))
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A $B </s>", special_tokens=[eos])
    wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>", unk_token="<unk>",
                                                   pad_token="<pad>")
    wrapped.add_tokens([f"<extra_{i}>" for i in range(size - len(wrapped))])
    wrapped.save_pretrained(directory)
    return len(wrapped)


BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MPNET_SPECIALS = ("<s>", "<pad>", "</s>", "[UNK]", "<mask>")  # bos 0, pad 1, eos 2: MPNet's config and tokenizer


def save_bert_tokenizer(directory: Path, cls: type = transformers.BertTokenizer,
                        specials: tuple[str, ...] = BERT_SPECIALS) -> int:
    """A WordPiece tokenizer whose vocabulary is exactly VOCAB entries (`cls`: BERT's, or a family's own
    over the same vocabulary, such as DistilBERT's, which gives no token_type_ids; `specials` take the
    first ids: MPNet's are its own)."""
    words = [*specials, *"abcdefghijklmnopqrstuvwxyz"]
    words += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + BERT_WORDS
    words = list(dict.fromkeys(words))
    words += [f"[unused{i}]" for i in range(VOCAB - len(words))]
    tokenizer = cls(vocab={w: i for i, w in enumerate(words)})
    tokenizer.save_pretrained(directory)
    return len(tokenizer)


# -- the table --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str  # test id
    family: str  # hotrod family name
    model_type: str
    kind: str  # encoder, decoder or seq2seq
    hf_class: type
    config: Callable[[], transformers.PretrainedConfig]
    tokenizer: Callable[[Path], int] | None = None  # writes tokenizer files, returns the tokenizer's size
    pad_side: str = "right"  # how batches of unequal prompts are padded
    task: str | None = None  # an encoder's head (`hotrod.tasks`); None: the bare model
    ends_in_eos: bool = False  # test rows end in EOS, as its tokenizer ends them (BART's classifier reads it)
    # fp32 logits' tolerance against transformers: the weights' own scale may make the model chaotic (Pegasus)
    atol: float = 1e-4

    @property
    def is_lm(self) -> bool:
        return self.kind != "encoder"


def _t5_config(cls=transformers.T5Config, **overrides):
    base = dict(vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=2 * HIDDEN, num_layers=LAYERS,
                num_heads=HEADS, decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)
    return cls(**{**base, **overrides})


# The BART-like seq2seq families: odd shapes (d_model 48, unequal depths, feed-forward widths and, for mBART,
# heads), room for the long-input tests, and none of the generation settings their configs default to
# (forced_eos_token_id, ...), so the tests compare the plain searches. Weights are drawn wider than their
# default 0.02 (init_std): at 0.02 the tied embeddings drown the rest, and every row repeats its start token
# (EOS for BART, so generation ends at once) or the same tokens whatever its input.
BART_POSITIONS = 256
_PLAIN_SEARCH = dict(forced_bos_token_id=None, forced_eos_token_id=None, no_repeat_ngram_size=0)


def _bart_config(cls=transformers.BartConfig, **overrides):
    base = dict(vocab_size=VOCAB, d_model=48, encoder_layers=3, decoder_layers=2, encoder_attention_heads=6,
                decoder_attention_heads=6, encoder_ffn_dim=96, decoder_ffn_dim=80,
                max_position_embeddings=BART_POSITIONS, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                decoder_start_token_id=2, init_std=0.3, **_PLAIN_SEARCH)
    return cls(**{**base, **overrides})


PEGASUS_VOCAB, MARIAN_VOCAB = VOCAB + 13, VOCAB + 7
MARIAN_SPECIALS = ("</s>", "<unk>", "<pad>")  # eos 0 and unk 1 as Marian's; its pad (the last id there) 2 here


_ENCODER = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                intermediate_size=2 * HIDDEN)


def _roberta_config(cls=transformers.RobertaConfig):
    return cls(**_ENCODER, max_position_embeddings=POSITIONS + 2, pad_token_id=1, bos_token_id=0, eos_token_id=2,
               type_vocab_size=1)


CASES: dict[str, Case] = {
    case.name: case
    for case in [
        Case("gpt2", "gpt2", "gpt2", "decoder", transformers.GPT2LMHeadModel,
             lambda: transformers.GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=HIDDEN,
                                             n_layer=LAYERS, n_head=HEADS, bos_token_id=0, eos_token_id=0),
             tokenizer=save_bpe_tokenizer, pad_side="left"),
        Case("t5", "t5", "t5", "seq2seq", transformers.T5ForConditionalGeneration, _t5_config),
        Case("t5_v1_1", "t5", "t5", "seq2seq", transformers.T5ForConditionalGeneration,
             lambda: _t5_config(num_decoder_layers=LAYERS + 1, feed_forward_proj="gated-gelu",
                                tie_word_embeddings=False)),
        Case("mt5", "mt5", "mt5", "seq2seq", transformers.MT5ForConditionalGeneration,
             lambda: _t5_config(transformers.MT5Config, feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
        Case("bart", "bart", "bart", "seq2seq", transformers.BartForConditionalGeneration, _bart_config,
             tokenizer=save_roberta_tokenizer),
        Case("mbart", "mbart", "mbart", "seq2seq", transformers.MBartForConditionalGeneration,
             lambda: _bart_config(transformers.MBartConfig, encoder_layers=2, decoder_layers=3,
                                  encoder_attention_heads=3, scale_embedding=True),
             tokenizer=save_roberta_tokenizer),
        Case("marian", "marian", "marian", "seq2seq", transformers.MarianMTModel,
             lambda: _bart_config(transformers.MarianConfig, vocab_size=MARIAN_VOCAB, decoder_vocab_size=MARIAN_VOCAB,
                                  share_encoder_decoder_embeddings=False, activation_function="swish",
                                  scale_embedding=True, pad_token_id=2, eos_token_id=0, bos_token_id=None,
                                  init_std=0.2),
             tokenizer=functools.partial(save_eos_tokenizer, specials=MARIAN_SPECIALS, size=MARIAN_VOCAB)),
        Case("m2m_100", "m2m_100", "m2m_100", "seq2seq", transformers.M2M100ForConditionalGeneration,
             lambda: _bart_config(transformers.M2M100Config, activation_function="relu", scale_embedding=False,
                                  encoder_layerdrop=0.0, decoder_layerdrop=0.0, init_std=0.2),
             tokenizer=save_roberta_tokenizer),
        Case("pegasus", "pegasus", "pegasus", "seq2seq", transformers.PegasusForConditionalGeneration,
             lambda: _bart_config(transformers.PegasusConfig, vocab_size=PEGASUS_VOCAB, encoder_layers=2,
                                  decoder_layers=2, activation_function="relu", scale_embedding=True,
                                  pad_token_id=0, eos_token_id=1, bos_token_id=None, decoder_start_token_id=0,
                                  init_std=1.0),
             tokenizer=functools.partial(save_eos_tokenizer, size=PEGASUS_VOCAB),
             # Only weights this wide keep its searches off one token, and they make its attention one-hot:
             # where two keys nearly tie, summation order moves a logit by up to ~0.4% of the largest (~23),
             # while every generated token still equals transformers'.
             atol=0.1),
        Case("bert", "bert", "bert", "encoder", transformers.BertModel,
             lambda: transformers.BertConfig(**_ENCODER, max_position_embeddings=POSITIONS),
             tokenizer=save_bert_tokenizer),
        Case("roberta", "roberta", "roberta", "encoder", transformers.RobertaModel,
             _roberta_config, tokenizer=save_roberta_tokenizer),
        Case("xlm_roberta", "xlm-roberta", "xlm-roberta", "encoder", transformers.XLMRobertaModel,
             lambda: _roberta_config(transformers.XLMRobertaConfig), tokenizer=save_roberta_tokenizer),
        Case("electra", "electra", "electra", "encoder", transformers.ElectraModel,
             lambda: transformers.ElectraConfig(**_ENCODER, embedding_size=HIDDEN // 2,
                                                max_position_embeddings=POSITIONS),
             tokenizer=save_bert_tokenizer),
        Case("distilbert", "distilbert", "distilbert", "encoder", transformers.DistilBertModel,
             lambda: transformers.DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS,
                                                   hidden_dim=2 * HIDDEN, max_position_embeddings=POSITIONS),
             tokenizer=functools.partial(save_bert_tokenizer, cls=transformers.DistilBertTokenizer)),
        Case("modernbert", "modernbert", "modernbert", "encoder", transformers.ModernBertModel,
             lambda: transformers.ModernBertConfig(  # a local layer (4 tokens each way) between two global ones
                 **{**_ENCODER, "num_hidden_layers": 3}, global_attn_every_n_layers=2, local_attention=8,
                 max_position_embeddings=POSITIONS, classifier_pooling="mean", pad_token_id=0, bos_token_id=2,
                 cls_token_id=2, eos_token_id=3, sep_token_id=3),  # the WordPiece tokenizer's ids
             tokenizer=save_bert_tokenizer),
        Case("mpnet", "mpnet", "mpnet", "encoder", transformers.MPNetModel,
             lambda: transformers.MPNetConfig(**_ENCODER, max_position_embeddings=POSITIONS + 2),  # pad 1, bos 0, eos 2
             tokenizer=functools.partial(save_bert_tokenizer, cls=transformers.MPNetTokenizer,
                                         specials=MPNET_SPECIALS)),
        Case("deberta_v2", "deberta-v2", "deberta-v2", "encoder", transformers.DebertaV2Model,
             lambda: transformers.DebertaV2Config(  # v3's shape: relative positions only, no token types
                 **_ENCODER, max_position_embeddings=POSITIONS, type_vocab_size=0, position_biased_input=False,
                 relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
                 max_relative_positions=16, share_att_key=True, norm_rel_ebd="layer_norm"),
             tokenizer=save_bert_tokenizer),
    ]
}
LM_CASES = [name for name, case in CASES.items() if case.is_lm]
SEQ2SEQ_CASES = [name for name, case in CASES.items() if case.kind == "seq2seq"]
ENCODER_CASES = [name for name, case in CASES.items() if not case.is_lm]

# -- the heads: every encoder case with every task head, named `<case>-<head>` ---------------------

CLASS_LABELS = ("negative", "neutral", "positive")
TAGS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
TASK_HEADS = {  # short name: (task, class-name suffix, labels)
    "cls": ("text-classification", "ForSequenceClassification", CLASS_LABELS),
    "ner": ("token-classification", "ForTokenClassification", TAGS),
    "qa": ("question-answering", "ForQuestionAnswering", ()),
}


def head_case(base: Case, head: str, **config_changes) -> Case:
    """`base` with one of the TASK_HEADS on top: transformers' head class of the same family, its label map."""
    import dataclasses

    task, suffix, labels = TASK_HEADS[head]
    hf_class = getattr(transformers, base.hf_class.__name__.removesuffix("Model") + suffix)

    def config():
        made = base.config()
        if labels:
            made.id2label = dict(enumerate(labels))
            made.label2id = {label: i for i, label in enumerate(labels)}
        for key, value in config_changes.items():
            setattr(made, key, value)
        return made

    return dataclasses.replace(base, name=f"{base.name}-{head}", hf_class=hf_class, config=config, task=task)


HEAD_CASES: dict[str, Case] = {
    case.name: case for case in (head_case(CASES[name], head) for name in ENCODER_CASES for head in TASK_HEADS)
}

# BART's and mBART's sequence classification, the whole encoder-decoder run as one encoder-kind graph, with
# bart-large-mnli's labels (zero-shot classification runs on it): `<case>-mnli`.
NLI_LABELS = ("contradiction", "neutral", "entailment")


def mnli_case(base: Case) -> Case:
    import dataclasses

    def config():
        made = base.config()
        made.id2label = dict(enumerate(NLI_LABELS))
        made.label2id = {label: i for i, label in enumerate(NLI_LABELS)}
        return made

    hf_class = getattr(transformers, base.hf_class.__name__.removesuffix("ForConditionalGeneration")
                       + "ForSequenceClassification")
    return dataclasses.replace(base, name=f"{base.name}-mnli", kind="encoder", hf_class=hf_class, config=config,
                               task="text-classification", ends_in_eos=True)


MNLI_CASES = ("bart-mnli", "mbart-mnli")
HEAD_CASES.update({case.name: case for case in (mnli_case(CASES["bart"]), mnli_case(CASES["mbart"]))})


# -- assistants: a smaller model over each generating case's vocabulary, named `<case>-assistant` -----


def assistant_case(base: Case, **config_changes) -> Case:
    """`base` with fewer, narrower layers and the same vocabulary and tokenizer: a model that drafts for it."""
    import dataclasses

    def config():
        made = base.config()
        for key, value in config_changes.items():
            setattr(made, key, value)
        return made

    return dataclasses.replace(base, name=f"{base.name}-assistant", config=config)


ASSISTANT_CASES: dict[str, Case] = {case.name: case for case in [
    assistant_case(CASES["gpt2"], n_layer=1, n_embd=HIDDEN // 2, n_head=HEADS // 2),
    assistant_case(CASES["t5"], num_layers=1, num_decoder_layers=1, d_model=HIDDEN // 2, d_kv=HIDDEN // HEADS,
                   num_heads=HEADS // 2, d_ff=HIDDEN),
]}
ALL_CASES: dict[str, Case] = {**CASES, **HEAD_CASES, **ASSISTANT_CASES}


def build_checkpoint(case: Case, directory: Path, seed: int = 0, **save_kwargs) -> Path:
    """Seeded random weights saved the way transformers saves them, plus the case's tokenizer."""
    torch.manual_seed(seed)
    model = case.hf_class(case.config()).eval()
    model.save_pretrained(directory, **save_kwargs)
    if case.tokenizer is not None:
        assert case.tokenizer(directory) == model.config.vocab_size
    return directory


def hf_generate_kwargs(model) -> dict:
    """Works around transformers sizing an encoder-decoder's self-attention cache from the encoder's depth
    (T5's num_layers, BART's encoder_layers), not the decoder's."""
    config = model.config
    decoder_layers = getattr(config, "num_decoder_layers", None) or getattr(config, "decoder_layers", None)
    if config.is_encoder_decoder and decoder_layers != config.num_hidden_layers:
        return {"past_key_values": EncoderDecoderCache(DynamicCache(), DynamicCache())}
    return {}


def load_on(source, backend: str, **kwargs) -> hotrod.HotrodModel:
    """`hotrod.load` on one of the test table's backends ("static": the torch backend's static engine)."""
    if backend == "static":
        return hotrod.load(source, backend="torch", static=True, **kwargs)
    if backend == "cuda":
        return hotrod.load(source, backend="torch", device="cuda", precision="fp32", **kwargs)
    return hotrod.load(source, backend=backend, **kwargs)


# -- the zoo ----------------------------------------------------------------------------------------


# The zoo draws the BART-like cases' weights wide (init_std up to 1.0) so that their searches do not collapse
# onto one token; their attention logits are then so sharp that any rounding moves the outputs far more than
# at a trained model's scale. Lower precisions are judged on weights drawn at this scale (`Zoo.at_trained_scale`).
TRAINED_STD = 0.1


class Zoo:
    """Builds each checkpoint, artifact, reference and loaded model once per session, on first use.

    Everything it hands out is shared: tests that alter files work on `copy_checkpoint` / `copy_artifact`.
    """

    def __init__(self, root: Path):
        self.root = root
        self._checkpoints: dict[str, Path] = {}
        self._artifacts: dict[str, Path] = {}
        self._references: dict[str, torch.nn.Module] = {}
        self._models: dict[tuple[str, str], hotrod.HotrodModel] = {}
        self._generated: dict[tuple, torch.Tensor] = {}

    def checkpoint(self, name: str) -> Path:
        if name not in self._checkpoints:
            self._checkpoints[name] = build_checkpoint(ALL_CASES[name], self.root / "checkpoints" / name)
        return self._checkpoints[name]

    def at_trained_scale(self, name: str) -> Path:
        """The case's checkpoint with weights drawn at a trained model's scale (`TRAINED_STD`) where the zoo
        draws them wider, else its own: where lower precisions are judged."""
        case = ALL_CASES[name]
        if getattr(case.config(), "init_std", 0.0) <= TRAINED_STD:
            return self.checkpoint(name)
        key = f"{name}-trained-scale"
        if key not in self._checkpoints:
            def config():
                made = case.config()
                made.init_std = TRAINED_STD
                return made

            scaled = replace(case, name=key, config=config)
            self._checkpoints[key] = build_checkpoint(scaled, self.root / "checkpoints" / key)
        return self._checkpoints[key]

    def artifact(self, name: str) -> Path:
        if name not in self._artifacts:
            self._artifacts[name] = hotrod.optimize(self.checkpoint(name), self.root / "artifacts" / name,
                                                    progress=False, verify_examples=VERIFY_EXAMPLES)
        return self._artifacts[name]

    def reference(self, name: str) -> torch.nn.Module:
        """transformers' own model, read from the same checkpoint directory."""
        if name not in self._references:
            self._references[name] = ALL_CASES[name].hf_class.from_pretrained(self.checkpoint(name)).eval()
        return self._references[name]

    def hf_generate(self, name: str, ids: torch.Tensor, mask: torch.Tensor | None, seed: int | None = None,
                    device: str = "cpu", **kwargs) -> torch.Tensor:
        """transformers' `generate` on the reference (memoised: both backends compare with one run), on
        `device`: a sampled generation draws from that device's generator, so it compares on the same one."""
        key = (name, str(ids.tolist()), str(None if mask is None else mask.tolist()), seed, device,
               repr(sorted(kwargs.items())))
        if key not in self._generated:
            reference = self.reference(name)
            if device != "cpu":
                reference = copy.deepcopy(reference).to(device)
                ids, mask = ids.to(device), None if mask is None else mask.to(device)
            if seed is not None:
                torch.manual_seed(seed)
            with torch.no_grad():
                self._generated[key] = reference.generate(ids, attention_mask=mask, **kwargs,
                                                          **hf_generate_kwargs(reference)).cpu()
        return self._generated[key]

    def model(self, name: str, backend: str) -> hotrod.HotrodModel:
        """The artifact on onnxruntime; the checkpoint itself on torch."""
        if (name, backend) not in self._models:
            source = self.artifact(name) if backend == "onnxruntime" else self.checkpoint(name)
            self._models[name, backend] = load_on(source, backend)
        return self._models[name, backend]

    def copy_checkpoint(self, name: str, dest: Path) -> Path:
        return Path(shutil.copytree(self.checkpoint(name), dest))

    def copy_artifact(self, name: str, dest: Path) -> Path:
        return Path(shutil.copytree(self.artifact(name), dest))


# -- inputs -----------------------------------------------------------------------------------------


def prompt_batch(case: Case, lengths: tuple[int, ...], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts of the given lengths, padded on the case's side with its pad token (ids avoid specials)."""
    generator = torch.Generator().manual_seed(seed)
    config = case.config()
    pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        span = slice(width - length, width) if case.pad_side == "left" else slice(0, length)
        ids[row, span] = torch.randint(3, config.vocab_size, (length,), generator=generator)
        mask[row, span] = 1
        if case.ends_in_eos:
            ids[row, span.stop - 1] = config.eos_token_id
    return ids, mask


def assert_same_tokens(actual: torch.Tensor, expected: torch.Tensor):
    message = f"\nhotrod:\n{actual}\ntransformers:\n{expected}"
    assert actual.dtype == torch.long
    assert actual.shape == expected.shape, message
    assert torch.equal(actual, expected), message


def assert_hidden_matches(built: tuple, backend: str, lengths: tuple[int, ...], seed: int = 4) -> None:
    """The last hidden state of `built` (case, checkpoint, artifact, transformers' model) on `backend`
    equals transformers' at every real position of a batch of `lengths`."""
    case, checkpoint, artifact, reference = built
    model = load_on(artifact if backend == "onnxruntime" else checkpoint, backend)
    ids, mask = prompt_batch(case, lengths, seed=seed)
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state
    got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=1e-4, rtol=0)


def assert_int8_within_gate(case: Case, score: str, gate: float, directory: Path) -> None:
    """An int8 build of `case`'s checkpoint verifies at `gate` or better on its task's `score`."""
    checkpoint = build_checkpoint(case, directory / "checkpoint")
    out = hotrod.optimize(checkpoint, directory / "int8", precision="int8", verify_examples=16, progress=False)
    figures = json.loads((out / "manifest.json").read_text())["verification"]
    assert figures["score"] == figures[score] >= gate


def int8_gates(case: Case, **answer_changes) -> dict[str, tuple[Case, str, float]]:
    """The heads of `case`'s family and the gates its int8 builds must keep, as the int8 test of the task
    measures sets them for BERT (`answer_changes`: config changes of the question-answering head's case)."""
    return {"labels": (head_case(case, "cls", initializer_range=0.4), "label_agreement", 0.9),
            "ranking": (head_case(case, "cls", num_labels=1, initializer_range=0.2), "rank_agreement", 0.75),
            "entities": (head_case(case, "ner", initializer_range=0.05), "entity_f1", 0.95),
            "answers": (head_case(case, "qa", initializer_range=0.05, **answer_changes), "answer_f1", 0.9)}


# -- masked-LM checkpoints, run as SPLADE (sparse-embedding), named `<case>-mlm` ----------------------

SPARSE_CASES = ("bert", "distilbert", "roberta", "xlm_roberta", "mpnet")  # the families with a masked-LM head


def mlm_case(base: Case) -> Case:
    """`base` as its family's ...ForMaskedLM: a plain checkpoint, which hotrod refuses without
    --task sparse-embedding (as a SparseEncoder's transformer, it needs none: `save_sparse_encoder`)."""
    import dataclasses

    hf_class = getattr(transformers, base.hf_class.__name__.removesuffix("Model") + "ForMaskedLM")
    return dataclasses.replace(base, name=f"{base.name}-mlm", hf_class=hf_class)


MLM_CASES: dict[str, Case] = {case.name: case for case in (mlm_case(CASES[name]) for name in SPARSE_CASES)}
ALL_CASES.update(MLM_CASES)


def save_sparse_encoder(checkpoint: Path, directory: Path, max_seq_length: int | None = None,
                        pooling_strategy: str = "max", activation_function: str = "relu", **encoder) -> Path:
    """A masked-LM checkpoint saved by sentence-transformers as a SparseEncoder (its Transformer with the
    fill-mask task, then SpladePooling); `encoder`: SparseEncoder's own arguments (prompts, max_active_dims)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    transformer = Transformer(str(checkpoint), transformer_task="fill-mask", max_seq_length=max_seq_length)
    SparseEncoder(modules=[transformer, SpladePooling(pooling_strategy, activation_function)], **encoder).save(
        str(directory))
    return directory
