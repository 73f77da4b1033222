"""benchmarks/attention_paths.py: its options refused in one line where they cannot be measured."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import attention_paths  # noqa: E402


@pytest.mark.parametrize("option", ["--heads", "--head", "--length", "--batch", "--threads", "--runs"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_an_option_below_one_is_refused_in_one_line(option, value, capsys):
    with pytest.raises(SystemExit) as stop:
        attention_paths.main([option, value])
    assert stop.value.code == 2
    assert "take 1 or more" in capsys.readouterr().err.strip().splitlines()[-1]
