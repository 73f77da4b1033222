"""Resolving generation arguments the way transformers' `generate` does, and refusing bad ones.

Precedence, as in transformers: the model's generation config, replaced by a `GenerationConfig` the
caller passes, overridden by keyword arguments. Unset values take transformers' defaults (top_k 50,
...); with no length set anywhere, 20 new tokens, capped at the model's positions. `max_new_tokens`
wins over `max_length`, and `min_new_tokens`, where set, over `min_length`. A setting hotrod does not
implement is refused, never silently dropped.

The processors encoder-decoder checkpoints set (no-repeat n-grams, bad words, forced first and last
tokens, suppressed tokens; `hotrod.generation.sampling.process` applies them) are checked here once, into
plain tuples: a bad value is one line before any step runs, never an index error inside one.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from hotrod.errors import HotrodError, check_bool, check_number

MAX_NEW_TOKENS_CAP = 1 << 16  # beyond this a request is a mistake, not a workload
DEFAULT_NEW_TOKENS = 20
# Below this, scores / temperature overflows to inf for ordinary logits and the draw turns NaN; a caller
# who wants the most likely token asks for greedy decoding.
MIN_TEMPERATURE = 1e-4
# The same bound for repetition_penalty, which divides a seen token's positive score as a temperature does.
MIN_REPETITION_PENALTY = MIN_TEMPERATURE

DEFAULTS: dict[str, Any] = {
    "max_length": None,
    "max_new_tokens": None,
    "min_length": 0,
    "min_new_tokens": None,
    "num_beams": 1,
    "do_sample": False,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "repetition_penalty": 1.0,
    "eos_token_id": None,
    "pad_token_id": None,
    "bos_token_id": None,
    "decoder_start_token_id": None,
    "num_return_sequences": 1,
    "length_penalty": 1.0,
    "early_stopping": False,
    "no_repeat_ngram_size": None,
    "bad_words_ids": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
}
# A keyword argument None sets the setting to None, as transformers' `GenerationConfig.update` does, and None
# turns it off there: the model's own EOS, top-k, forced language... no longer apply. What None means for each
# setting whose default is not None (no top-k filter, no penalty, ...); the others are None.
NONE_MEANS = {"min_length": 0, "num_beams": 1, "do_sample": False, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
              "repetition_penalty": 1.0, "num_return_sequences": 1, "length_penalty": 1.0, "early_stopping": False}
# Accepted for compatibility with transformers' callers; hotrod always decodes with a cache and
# returns a plain tensor.
IGNORED = {"use_cache": True, "return_dict_in_generate": False, "output_scores": False, "output_logits": False}
# transformers settings hotrod does not implement, with the values that mean "off".
_OFF = (None, [], {})
UNSUPPORTED: dict[str, tuple] = {
    "encoder_no_repeat_ngram_size": (*_OFF, 0),
    "encoder_repetition_penalty": (*_OFF, 1.0),
    "sequence_bias": _OFF,
    "exponential_decay_length_penalty": _OFF,
    "typical_p": (*_OFF, 1.0),
    "epsilon_cutoff": (*_OFF, 0.0),
    "eta_cutoff": (*_OFF, 0.0),
    "min_p": _OFF,
    "top_h": _OFF,
    "num_beam_groups": (*_OFF, 1),
    "diversity_penalty": (*_OFF, 0.0),
    "penalty_alpha": _OFF,
    "guidance_scale": (*_OFF, 1.0),
    "renormalize_logits": (*_OFF, False),
    "remove_invalid_values": (*_OFF, False),
    "force_words_ids": _OFF,
    "stop_strings": (*_OFF, ""),
    "max_time": _OFF,
    "dola_layers": _OFF,
    "token_healing": (*_OFF, False),
    "watermarking_config": _OFF,
}


@dataclass(frozen=True)
class Settings:
    """Fully resolved and checked generation parameters for one call."""

    max_length: int  # length of each returned row: prompt + new (decoder-only) or start + new (seq2seq)
    prompt_length: int  # tokens each row starts with (the prompt, or the decoder start token)
    min_length: int  # no EOS before a row is this long
    num_beams: int
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    num_return_sequences: int
    length_penalty: float
    early_stopping: bool | str
    decoder_start_token_id: int | None
    bos_token_id: int | None  # an encoder-decoder's first token where no decoder start is set, as in transformers
    # Processors (transformers' order, `hotrod.generation.sampling.process`); each empty or 0 when off.
    no_repeat_ngram_size: int = 0
    bad_words_ids: tuple[tuple[int, ...], ...] = ()  # EOS alone left out, as transformers does
    forced_bos_token_id: int | None = None  # forced after the first token of a row (a seq2seq start token)
    forced_eos_token_ids: tuple[int, ...] = ()  # forced at max_length - 1
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    begin_index: int = 0  # the row length at which begin_suppress_tokens apply

    @property
    def constrained(self) -> bool:
        """Whether a processor beyond the repetition penalty and min_length may change scores: the
        fast greedy paths, which hold back EOS at most, then step aside."""
        return bool(self.no_repeat_ngram_size or self.bad_words_ids or self.forced_bos_token_id is not None
                    or self.forced_eos_token_ids or self.suppress_tokens or self.begin_suppress_tokens)

    @property
    def masks_only(self) -> bool:
        """Whether every processor acts on fixed ids by the row's length alone (one-token bad words, suppressed
        and forced tokens; not n-gram blocking or a longer bad word, which read the row): greedy choice then
        stays an argmax that looks again only where it chose a held-back id (`hotrod.generation.search.greedy`),
        as a real Marian checkpoint's pad ban and forced EOS ask."""
        return not self.no_repeat_ngram_size and all(len(word) == 1 for word in self.bad_words_ids)


def merge(model_config: Any, user_config: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Model config < caller's GenerationConfig < keyword arguments. None in a config is unset; a keyword
    argument None turns the setting off (`NONE_MEANS`), as in transformers."""
    values = dict(DEFAULTS)
    if user_config is not None:
        _check_user_config(user_config)
    for config in (model_config, user_config):
        if config is not None:
            settings = _settings_of(config)
            _refuse_unsupported(settings, "the generation config")
            values.update({k: v for k, v in settings.items() if k in DEFAULTS and v is not None})
    for key, value in kwargs.items():
        if key in IGNORED:
            if value != IGNORED[key]:
                raise HotrodError(f"generate() does not support {key}={value!r}")
            continue
        if key in UNSUPPORTED:
            _refuse_unsupported({key: value}, "generate()")
            continue
        if key not in DEFAULTS:
            raise HotrodError(f"generate() got an unknown argument {key!r}")
        values[key] = NONE_MEANS.get(key) if value is None else value
    return values


def _check_user_config(config: Any) -> None:
    """A caller's generation_config is a GenerationConfig, as transformers takes it (a dict's settings would
    otherwise be read as nothing), and what hotrod returns regardless (a plain tensor, with a cache) is off."""
    from transformers import GenerationConfig

    if not isinstance(config, GenerationConfig):
        mask = " (generate()'s second argument, as transformers'; pass a mask as attention_mask=)" \
            if hasattr(config, "shape") else ""
        raise HotrodError(f"generation_config must be a transformers GenerationConfig, got {type(config).__name__}"
                          f"{mask}; pass settings as keyword arguments")
    for key, off in IGNORED.items():
        if getattr(config, key, None) not in (None, off):  # None: unset (transformers' default)
            raise HotrodError(f"the generation config sets {key}={getattr(config, key)!r}, which generate() does "
                              "not support")


def _settings_of(config: Any) -> dict[str, Any]:
    """The settings of a GenerationConfig that hotrod reads or refuses, read as its attributes: its
    to_dict() deep-copies every attribute, a cost a generate() call would pay on top of its steps, as
    large as one of a short generation's."""
    return {name: getattr(config, name) for name in (*DEFAULTS, *UNSUPPORTED) if hasattr(config, name)}


def _refuse_unsupported(settings: dict[str, Any], where: str) -> None:
    for key, off in UNSUPPORTED.items():
        if key in settings and settings[key] not in off:
            raise HotrodError(f"{where} sets {key}={settings[key]!r}, which hotrod does not support")


def resolve(values: dict[str, Any], prompt_length: int, max_positions: int | None,
            vocab_size: int | None = None) -> Settings:
    """Turn merged values into Settings, with every check a caller can trip over."""
    max_new = values["max_new_tokens"]
    if max_new is not None:
        _check_int("max_new_tokens", max_new, 1)
        if max_new > MAX_NEW_TOKENS_CAP:
            raise HotrodError(f"max_new_tokens {max_new} is beyond the limit of {MAX_NEW_TOKENS_CAP}")
        max_length = prompt_length + max_new
    elif values["max_length"] is None:  # nothing set anywhere: transformers' 20 new tokens, within positions
        max_length = prompt_length + DEFAULT_NEW_TOKENS
        if max_positions is not None:
            max_length = min(max_length, max_positions)
        if max_length <= prompt_length:
            raise HotrodError(f"the {prompt_length}-token prompt fills all {max_positions} positions of the model")
    else:
        max_length = _check_int("max_length", values["max_length"], 1)
        if max_length <= prompt_length:
            raise HotrodError(
                f"max_length {max_length} leaves no room after the {prompt_length}-token prompt; set max_new_tokens"
            )
        if max_length - prompt_length > MAX_NEW_TOKENS_CAP:
            raise HotrodError(f"max_length {max_length} is beyond the limit of {MAX_NEW_TOKENS_CAP} new tokens")
    if max_positions is not None and max_length > max_positions:
        raise HotrodError(
            f"prompt ({prompt_length} tokens) plus new tokens ({max_length - prompt_length}) exceeds the model's "
            f"{max_positions} positions"
        )
    eos = values["eos_token_id"]
    eos_ids = tuple(_token_id("eos_token_id", token, vocab_size)
                    for token in ([] if eos is None else eos if isinstance(eos, list | tuple) else [eos]))
    pad = values["pad_token_id"]
    pad = eos_ids[0] if pad is None and eos_ids else _token_id("pad_token_id", pad, vocab_size, optional=True)
    start = _token_id("decoder_start_token_id", values["decoder_start_token_id"], vocab_size, optional=True)
    # transformers: min_new_tokens, where set (0 too), replaces min_length by the prompt plus itself.
    min_length = _check_int("min_length", values["min_length"], 0)
    if values["min_new_tokens"] is not None:
        min_length = prompt_length + _check_int("min_new_tokens", values["min_new_tokens"], 0)
    settings = Settings(
        max_length=max_length,
        prompt_length=prompt_length,
        min_length=min_length,
        num_beams=_check_int("num_beams", values["num_beams"], 1),
        do_sample=check_bool("do_sample", values["do_sample"]),
        temperature=float(check_number("temperature", values["temperature"])),
        top_k=_check_int("top_k", values["top_k"], 0),
        top_p=float(check_number("top_p", values["top_p"])),
        # inf turns a zero score into NaN; below the least, a seen token's score overflows to inf
        repetition_penalty=float(check_number("repetition_penalty", values["repetition_penalty"],
                                              MIN_REPETITION_PENALTY)),
        eos_token_ids=eos_ids,
        pad_token_id=pad,
        num_return_sequences=_check_int("num_return_sequences", values["num_return_sequences"], 1),
        length_penalty=float(check_number("length_penalty", values["length_penalty"])),
        early_stopping=values["early_stopping"],
        decoder_start_token_id=start,
        bos_token_id=_token_id("bos_token_id", values["bos_token_id"], vocab_size, optional=True),
        **_processors(values, eos_ids, prompt_length, vocab_size),
    )
    _check_ranges(settings)
    return settings


def _check_ranges(s: Settings) -> None:
    if s.do_sample and not s.temperature > 0:
        raise HotrodError(f"temperature must be > 0 when sampling, got {s.temperature}")
    if s.do_sample:
        check_temperature(s.temperature)
    if not 0 < s.top_p <= 1:
        raise HotrodError(f"top_p must be in (0, 1], got {s.top_p}")
    if s.early_stopping not in (True, False, "never"):
        raise HotrodError(f"early_stopping must be true, false or 'never', got {s.early_stopping!r}")
    if not s.do_sample and s.num_return_sequences > s.num_beams:
        raise HotrodError(
            f"num_return_sequences ({s.num_return_sequences}) must not exceed num_beams ({s.num_beams}) "
            "without sampling"
        )


def _processors(values: dict[str, Any], eos_ids: tuple[int, ...], prompt_length: int,
                vocab_size: int | None) -> dict[str, Any]:
    """The processor fields of Settings, checked: sizes whole and >= 0, token ids within the vocabulary, the
    shapes transformers takes (a list of token-id lists for bad words, a list for suppressed tokens)."""
    size = values["no_repeat_ngram_size"]
    bos = _token_id("forced_bos_token_id", values["forced_bos_token_id"], vocab_size, optional=True)
    forced_eos = values["forced_eos_token_id"]
    if isinstance(forced_eos, list | tuple) and not forced_eos:
        raise HotrodError("forced_eos_token_id must be a token id or a non-empty list of them, got []")
    forced_eos = _token_ids("forced_eos_token_id", forced_eos, vocab_size, one=True)
    suppress = _token_ids("suppress_tokens", values["suppress_tokens"], vocab_size)
    for name, forced in (("forced_bos_token_id", () if bos is None else (bos,)), ("forced_eos_token_id", forced_eos)):
        if forced and set(forced) <= set(suppress):  # every score -inf at that step: NaN draws (transformers refuses)
            raise HotrodError(f"{name} {list(forced)} is all in suppress_tokens: the forced step would have no token")
    return {
        "no_repeat_ngram_size": 0 if size is None else _check_int("no_repeat_ngram_size", size, 0),
        "bad_words_ids": _bad_words(values["bad_words_ids"], eos_ids, vocab_size),
        "forced_bos_token_id": bos,
        "forced_eos_token_ids": forced_eos,
        "suppress_tokens": suppress,
        "begin_suppress_tokens": _token_ids("begin_suppress_tokens", values["begin_suppress_tokens"], vocab_size),
        # transformers: the first generated position, one later where a one-token row's next one is forced
        "begin_index": prompt_length + (1 if prompt_length <= 1 and bos is not None else 0),
    }


def _token_ids(name: str, value: Any, vocab_size: int | None, one: bool = False) -> tuple[int, ...]:
    """A list of token ids (None: none); `one`: a single id is taken too."""
    if value is None:
        return ()
    if one and not isinstance(value, list | tuple):
        return (_token_id(name, value, vocab_size),)
    if not isinstance(value, list | tuple):
        raise HotrodError(f"{name} must be a list of token ids, got {value!r}")
    return tuple(_token_id(name, token, vocab_size) for token in value)


def _bad_words(value: Any, eos_ids: tuple[int, ...], vocab_size: int | None) -> tuple[tuple[int, ...], ...]:
    """bad_words_ids as transformers takes them (a non-empty list of non-empty token-id lists), without the
    sequences that are one EOS token alone, which transformers leaves to min_length to hold back."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not value or not all(isinstance(w, list | tuple) and w for w in value):
        raise HotrodError(f"bad_words_ids must be a non-empty list of non-empty lists of token ids, got {value!r}")
    words = [tuple(_token_id("bad_words_ids", token, vocab_size) for token in word) for word in value]
    kept = tuple(dict.fromkeys(w for w in words if not (len(w) == 1 and w[0] in eos_ids)))
    if not kept:  # transformers fails here too (an empty bias)
        raise HotrodError(f"bad_words_ids {value!r} bans only the EOS token; hold it back with min_new_tokens")
    return kept


def check_temperature(temperature: float) -> float:
    """A sampling temperature the draw can compute with: finite, and not so small that scores overflow."""
    check_number("temperature", temperature)
    if temperature < MIN_TEMPERATURE:
        raise HotrodError(f"temperature must be at least {MIN_TEMPERATURE:g} when sampling, got {temperature:g}; "
                          "for the most likely tokens, decode greedily (do_sample=False)")
    return temperature


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _token_id(name: str, value: Any, vocab_size: int | None, optional: bool = False) -> int | None:
    """A token id the model has (numpy integers too): an id past the vocabulary would index past the
    embeddings or the scores, on a GPU a device fault rather than an error."""
    if value is None and optional:
        return None
    if not _is_integer(value) or value < 0 or (vocab_size and value >= vocab_size):
        within = f" of this model (0 .. {vocab_size - 1})" if vocab_size else ""
        raise HotrodError(f"{name} {value!r} is not a token id{within}")
    return int(value)


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HotrodError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise HotrodError(f"{name} must be >= {minimum}, got {value}")
    return value
