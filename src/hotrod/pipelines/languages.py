"""A target language named by its code, resolved through the model's tokenizer into the token generation
forces first (`forced_bos_token_id`), the way each multilingual family's users do it in transformers:

- mBART-50 (and mBART-25): `tokenizer.lang_code_to_id["fr_XX"]`; the code is itself a special token.
- M2M100: `tokenizer.get_lang_id("fr")`, the token `__fr__` (its `lang_code_to_id` table says the same).
- NLLB-200: `tokenizer.convert_tokens_to_ids("fra_Latn")`; the code is itself a special token.

Why here, and once: the tokenizer, not the model's family, holds the answer (NLLB-200 is an M2M100 model
with another tokenizer), so `HotrodModel.generate(target_language=...)`, `hotrod generate --target-language`
and the server's `target_language` field all ask this module. Only a language token is a target: a code is
looked up in the tokenizer's own language table where it has one, else among its special and added tokens
of a language code's shape, so a typo never forces an ordinary token such as "the" or "</s>".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hotrod.errors import HotrodError

FIELD = "target_language"
# The shapes of the language tokens: mBART's "fr_XX", NLLB's "fra_Latn", M2M100's "__fr__" (whose code is "fr").
_SHAPE = re.compile(r"[a-z]{2,3}_[A-Z]{2}|[a-z]{3}_[A-Z][a-z]{3}|__([a-z]{2,3})__")
_SHOWN = 8  # codes a refusal lists


def languages(tokenizer: Any) -> dict[str, int]:
    """Every language code the tokenizer knows, with its token id, in the tokenizer's order (empty: none)."""
    found: dict[str, int] = {}
    table = getattr(tokenizer, "lang_code_to_id", None)
    if isinstance(table, Mapping):
        found.update({str(code): int(i) for code, i in table.items() if i is not None})
    shaped = [t for t in dict.fromkeys([*tokenizer.all_special_tokens, *tokenizer.get_added_vocab()])
              if isinstance(t, str) and _SHAPE.fullmatch(t)]
    for token, token_id in zip(shaped, tokenizer.convert_tokens_to_ids(shaped) if shaped else []):
        found.setdefault(_SHAPE.fullmatch(token).group(1) or token, token_id)  # type: ignore[union-attr]
    unknown = tokenizer.unk_token_id  # a table entry for a code the vocabulary lacks reads as <unk>
    return {code: i for code, i in found.items() if i is not None and i != unknown}


def language_token(tokenizer: Any, code: Any, vocab_size: int | None = None) -> int:
    """The token id of the language `code`; a HotrodError naming the code where the tokenizer has no such
    language, or naming the field where it has no language tokens at all (or no tokenizer)."""
    if not isinstance(code, str) or not code:
        raise HotrodError(f"{FIELD}: a language code is a non-empty string (fr_XX, fr, fra_Latn), got {code!r}")
    if tokenizer is None:
        raise HotrodError(f"{FIELD}: this model has no tokenizer to name languages; give forced_bos_token_id")
    known = languages(tokenizer)
    if not known:
        raise HotrodError(f"{FIELD}: this model's tokenizer has no language tokens (it is not a multilingual "
                          f"model's: mBART-50, M2M100, NLLB); give forced_bos_token_id instead")
    if code not in known:
        shown = ", ".join(list(known)[:_SHOWN]) + (f" and {len(known) - _SHOWN} more" if len(known) > _SHOWN else "")
        raise HotrodError(f"{FIELD}: {code!r} is not a language of this model's tokenizer (it has {shown})")
    token = known[code]
    if vocab_size is not None and not 0 <= token < vocab_size:
        raise HotrodError(f"{FIELD}: {code!r} is token {token}, outside the model's vocabulary [0, {vocab_size})")
    return token


def forced_bos(tokenizer: Any, code: Any, forced_bos_token_id: int | None = None,
               vocab_size: int | None = None) -> int | None:
    """The forced first token of a request that names `code` (None: `forced_bos_token_id` as given). Naming
    both is allowed only where they agree."""
    if code is None:
        return forced_bos_token_id
    token = language_token(tokenizer, code, vocab_size)
    if forced_bos_token_id is not None and forced_bos_token_id != token:
        raise HotrodError(f"{FIELD}: {code!r} is token {token}, but forced_bos_token_id is {forced_bos_token_id}; "
                          f"give one of the two")
    return token
