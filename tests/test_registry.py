"""The registry is the one list of supported architectures; the test table must keep up with it."""

from __future__ import annotations

import pytest

import hotrod
from hotrod.models import all_families, get_family, supported_model_types
from tests.zoo import CASES


def test_every_registered_family_has_a_test_case():
    tested = {case.family for case in CASES.values()}
    untested = sorted(f.name for f in all_families() if f.name not in tested)
    assert not untested, f"families without a row in tests/zoo.py CASES: {untested}"


def test_every_registered_model_type_has_a_test_case():
    tested = {case.model_type for case in CASES.values()}
    untested = sorted(set(supported_model_types()) - tested)
    assert not untested, f"model_types without a row in tests/zoo.py CASES: {untested}"


def test_table_matches_the_registry(case):
    family = get_family(CASES[case].model_type)
    assert family.name == CASES[case].family
    assert family.kind == CASES[case].kind


@pytest.mark.parametrize("model_type", ["llama-ish", "", None])
def test_unknown_model_type_lists_the_supported_ones(model_type):
    with pytest.raises(hotrod.HotrodError, match="unsupported model_type") as info:
        get_family(model_type)
    for supported in supported_model_types():
        assert supported in str(info.value)
