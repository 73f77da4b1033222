"""CTranslate2 as a peer: the same checkpoint converted by CTranslate2's own converter, run on the same ids.

Each checkpoint is converted once per quantization and kept under hotrod's cache. CTranslate2 speaks
token strings, and the workload checkpoints have no tokenizer, so the converter is handed a stand-in
that names every id (`<17>`); the ids are mapped to those strings through the vocabulary the converter
saved, and the answers mapped back, so every system sees the same ids and returns the same kind of
tensor for `agreement`. Rows go in unpadded: CTranslate2 pads (and masks) batches itself.

An encoder-decoder runs as `Translator.translate_batch`, greedy or with the case's beams, told the same
search as the other systems (`hotrod.bench.case.BEAM_SEARCH`) and the same forced length; its answer is
laid out as transformers' is, after the source model's own decoder start token (CTranslate2 names another
for Marian, whose decoder it starts from a zero embedding as transformers' does).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from hotrod.bench.case import Case
from hotrod.bench.runners import System, dir_size
from hotrod.source import cache_dir, source_fingerprint

# On the CPU, CTranslate2's "int8" is its int8_float32: since CTranslate2 3.18 an int8 conversion keeps the
# weights it does not quantize in the checkpoint's own type (float32 for the bench's checkpoints), and the model,
# loaded with the default compute type, reports int8_float32 (`Translator.compute_type`). The two conversions
# write the same model.bin (checked with 4.8.5), so one is timed, for both.
QUANTIZATIONS = {"fp32": "float32", "int8": "int8"}
GPU_QUANTIZATIONS = {**QUANTIZATIONS, "fp16": "float16"}  # CTranslate2 has fp16 kernels on CUDA only
_VOCABULARY_FILES = ("vocabulary.json", "shared_vocabulary.json", "target_vocabulary.json", "vocabulary.txt")


def builders(case: Case, ids: torch.Tensor, mask: torch.Tensor, device: str,
             threads: int) -> dict[str, Callable[[], System]]:
    """One builder per quantization, named "ctranslate2 <precision>"; each converts (once) and loads."""
    quantizations = GPU_QUANTIZATIONS if device == "cuda" else QUANTIZATIONS
    return {f"ctranslate2 {precision}": _builder(case, ids, mask, device, threads, precision, quantization)
            for precision, quantization in quantizations.items()}


def cuda_problem() -> str | None:
    """Why CTranslate2 cannot run on CUDA here, or None."""
    import ctranslate2

    if ctranslate2.get_cuda_device_count() < 1:
        return "this CTranslate2 sees no CUDA device (a CPU-only build, or no driver)"
    return None


def _builder(case: Case, ids: torch.Tensor, mask: torch.Tensor, device: str, threads: int, precision: str,
             quantization: str) -> Callable[[], System]:
    def build() -> System:
        path = convert(case.source, quantization)
        rows = [row[keep.bool()].tolist() for row, keep in zip(ids.cpu(), mask.cpu())]
        call, first, model = _calls(path, case, ids.cpu(), rows, device, threads)
        return System(call, first, precision, dir_size(path), figures={"compute_type": model.compute_type})

    return build


def convert(source: str, quantization: str) -> Path:
    """The checkpoint converted at `quantization`, built once under hotrod's cache."""
    import ctranslate2

    tag = f"{source_fingerprint(Path(source))}|{quantization}|{ctranslate2.__version__}"
    digest = hashlib.sha256(tag.encode()).hexdigest()[:16]
    path = cache_dir() / "bench" / "ctranslate2" / f"{Path(source).name}-{quantization}-{digest}"
    if (path / "model.bin").is_file():
        return path
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    _converter_class()(source).convert(str(partial), quantization=quantization, force=True)
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)  # a converted model appears whole, or not at all
    return path


def vocabulary(path: Path) -> list[str]:
    """The tokens of a converted model, in id order, as its converter saved them."""
    for name in _VOCABULARY_FILES:
        file = path / name
        if file.is_file():
            text = file.read_text(encoding="utf-8")
            return json.loads(text) if name.endswith(".json") else text.splitlines()
    raise FileNotFoundError(f"no vocabulary file in {path}")


def _calls(path: Path, case: Case, ids: torch.Tensor, rows: list[list[int]], device: str, threads: int):
    import ctranslate2

    kwargs = {"device": device, "intra_threads": threads, "inter_threads": 1}
    if not case.spec.generates:
        encoder = ctranslate2.Encoder(str(path), **kwargs)
        return lambda: _hidden(encoder.forward_batch(rows).last_hidden_state, device), None, encoder
    tokens = vocabulary(path)
    words = [[tokens[i] for i in row] for row in rows]
    if not case.spec.encodes:
        if case.num_beams > 1:
            raise ValueError("the bench's CTranslate2 generator decodes greedily; beam cases are encoder-decoders")
        generator = ctranslate2.Generator(str(path), **kwargs)
        return _generate(generator, words, ids, case.new_tokens), _generate(generator, words, ids, 1), generator
    translator = ctranslate2.Translator(str(path), **kwargs)
    index = {token: i for i, token in enumerate(tokens)}
    start = json.loads((Path(case.source) / "config.json").read_text()).get("decoder_start_token_id")
    if start is None:
        start = index[json.loads((path / "config.json").read_text())["decoder_start_token"]]
    search = search_options(case.generate_kwargs())
    return (_translate(translator, words, index, start, case.new_tokens, search),
            _translate(translator, words, index, start, 1, search), translator)


def search_options(generate_kwargs: dict) -> dict:
    """`translate_batch`'s options for the search transformers' `generate` is told (`Case.generate_kwargs`):
    the beams, and the settings that change a beam search, each as CTranslate2 names it."""
    return {"beam_size": generate_kwargs.get("num_beams", 1),
            "length_penalty": generate_kwargs.get("length_penalty", 1.0),
            "no_repeat_ngram_size": generate_kwargs.get("no_repeat_ngram_size") or 0}


def _generate(generator, words: list[list[str]], ids: torch.Tensor, new_tokens: int) -> Callable[[], torch.Tensor]:
    """Greedy continuation of each prompt, laid out like transformers' output: padded prompts, then new ids."""
    def call() -> torch.Tensor:
        results = generator.generate_batch(words, max_length=new_tokens, min_length=new_tokens, sampling_topk=1,
                                           beam_size=1, include_prompt_in_result=False)
        return torch.cat([ids, torch.tensor([r.sequences_ids[0] for r in results])], dim=1)

    return call


def _translate(translator, words: list[list[str]], index: dict[str, int], start: int, new_tokens: int,
               search: dict) -> Callable[[], torch.Tensor]:
    """The best hypothesis of each row (greedy, or the beams' best), laid out like transformers' output: the
    decoder start token, then new ids."""
    def call() -> torch.Tensor:
        results = translator.translate_batch(words, max_decoding_length=new_tokens, min_decoding_length=new_tokens,
                                             return_scores=False, **search)
        return torch.tensor([[start, *(index[t] for t in r.hypotheses[0])] for r in results])

    return call


def _hidden(view, device: str) -> torch.Tensor:
    """A StorageView as a torch tensor of its own (right-padded [batch, seq, hidden], as CTranslate2 pads)."""
    if device == "cuda":
        return torch.as_tensor(view, device="cuda").clone()
    return torch.from_numpy(np.array(view))


class _Vocabulary:
    """What CTranslate2's converters read from a tokenizer: one made-up token per id, specials named by id,
    but for the pad token, named `<pad>` as these families' tokenizers name it: the Marian converter drops a
    last token of that name (with its weights' last row, which it drops whatever the name), since its decoder
    starts from a zero embedding instead.

    A checkpoint needs no tokenizer to be timed, and a real one would only have to agree with these ids.
    """

    def __init__(self, config):
        self.tokens = [f"<{i}>" for i in range(config.vocab_size)]
        pad = getattr(config, "pad_token_id", None)
        if isinstance(pad, int) and 0 <= pad < len(self.tokens):
            self.tokens[pad] = "<pad>"
        self.bos_token = self._name(config, "bos_token_id")
        self.eos_token = self._name(config, "eos_token_id")
        self.pad_token = self._name(config, "pad_token_id")
        self.unk_token = self._name(config, "unk_token_id") or "<unk>"  # CTranslate2 needs one, even unused

    def _name(self, config, attribute: str) -> str | None:
        value = getattr(config, attribute, None)
        value = value[0] if isinstance(value, list) and value else value
        return self.tokens[value] if isinstance(value, int) and 0 <= value < len(self.tokens) else None

    def get_vocab(self) -> dict[str, int]:
        return {token: i for i, token in enumerate(self.tokens)}

    def convert_ids_to_tokens(self, index: int) -> str:
        return self.tokens[index]


def _converter_class():
    """CTranslate2's transformers converter, reading the stand-in vocabulary instead of a tokenizer."""
    import transformers
    from ctranslate2.converters import TransformersConverter

    class Converter(TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return _Vocabulary(transformers.AutoConfig.from_pretrained(model_name_or_path))

        def load_model(self, model_class, model_name_or_path, **kwargs):
            model = super().load_model(model_class, model_name_or_path, **kwargs)
            config = model.config
            if config.model_type == "bert" and not hasattr(config, "position_embedding_type"):
                # transformers 5 dropped the option (its BERT has absolute positions only); the converter asks.
                config.position_embedding_type = "absolute"
            if config.is_encoder_decoder and not hasattr(config, "normalize_before"):
                # Nor do BART's configs say where its norms sit any more; the BART-like converters ask. The
                # modules do: a stack normalized after its last layer normalizes before each (mBART, Pegasus),
                # and one normalized after its embeddings has a layernorm_embedding (BART, mBART).
                encoder = model.get_encoder()
                config.normalize_before = hasattr(encoder, "layer_norm")
                config.normalize_embedding = hasattr(encoder, "layernorm_embedding")
            return model

    return Converter
