"""Lean family definitions; importing this package registers every family."""

from hotrod.models import bert, distilbert, electra, gpt2, modernbert, roberta, t5  # noqa: F401
