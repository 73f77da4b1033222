"""Lean family definitions; importing this package registers every family (`hotrod.registry`)."""

from hotrod.errors import HotrodError
from hotrod.models import (  # noqa: F401
    bart,
    bert,
    deberta,
    distilbert,
    electra,
    gpt2,
    m2m_100,
    marian,
    mbart,
    modernbert,
    mpnet,
    pegasus,
    roberta,
    t5,
)
from hotrod.registry import Family, registered, registered_families


def get_family(model_type: str | None) -> Family:
    """The family of `model_type`; an unknown one is one line that lists the supported ones."""
    family = registered(model_type or "")
    if family is None:
        raise HotrodError(f"unsupported model_type {model_type!r}; supported: {', '.join(supported_model_types())}")
    return family


def supported_model_types() -> list[str]:
    return sorted(t for f in registered_families() for t in f.model_types)


def all_families() -> list[Family]:
    return registered_families()
