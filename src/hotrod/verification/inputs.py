"""The inputs that calibration, verification and `--precision auto`'s timing run a model on: plain texts
(the built-in set or a file) and the token rows a model sees of them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from hotrod.errors import HotrodError

BUILTIN = Path(__file__).parent.parent / "optimize" / "calibration.txt"


def builtin_texts() -> list[str]:
    """A few dozen varied English sentences, used when the user gives no calibration file."""
    return read_texts(BUILTIN)


def read_lines(path: str | Path, what: str) -> list[str]:
    """The lines of a UTF-8 text file; one that cannot be read, or is not UTF-8, is one line naming `what`."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise HotrodError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise HotrodError(f"cannot read {what} {path}: it is not UTF-8 text") from None


def read_texts(path: str | Path, what: str = "calibration file") -> list[str]:
    """Non-empty lines of a UTF-8 text file, one example per line."""
    path = Path(path)
    texts = [line.strip() for line in read_lines(path, what) if line.strip()]
    if not texts:
        raise HotrodError(f"{what} {path} has no text (one example per line)")
    return texts


def token_rows(model: Any, texts: Sequence[str], room: int = 0, seed: int = 0) -> list[list[int]]:
    """Each text as the token ids `model` (a HotrodModel) would see, one row per text, in order.

    Rows are cut to leave `room` positions for generated tokens (and at 512). A model without a tokenizer
    gets seeded random ids, one per word of the text: calibration, verification and auto's timing all
    run such models on the same stand-in inputs. A row may be empty if its text has no tokens.
    """
    limit = max(1, min(model.dims.max_positions or 512, 512) - room)
    if model.tokenizer is not None:
        return [list(r) for r in model.tokenizer(list(texts), truncation=True, max_length=limit)["input_ids"]]
    generator = torch.Generator().manual_seed(seed)
    lengths = [max(1, min(limit, len(t.split()))) for t in texts]
    return [torch.randint(0, model.dims.vocab_size, (n,), generator=generator).tolist() for n in lengths]
