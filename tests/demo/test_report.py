"""The demo's console table: every column starts where its heading does, whatever the longest entry."""

from __future__ import annotations

from hotrod.demo.report import DemoResult, summary_table


def _result(name: str, precision: str) -> DemoResult:
    return DemoResult(name=name, description="", kind="classification", artifact="", precision=precision,
                      verification={}, candidates=[], pytorch_s=0.5, hotrod_s=0.125, timed="",
                      accuracy={"measure": "held-out intent accuracy", "pytorch": 1.0, "hotrod": 0.96875})


def test_columns_stay_apart_for_the_longest_precision_and_model_name():
    table = summary_table([_result("minilm-intents", "int8"), _result("a-model-with-a-long-name", "bf16-products")])
    head, *rows = table.splitlines()
    starts = [head.index(title) for title in ("precision", "accuracy")]
    for row, precision in zip(rows, ("int8", "bf16-products")):
        assert row[starts[1]:].startswith("held-out intent accuracy 1.000 -> 0.969")
        assert row[starts[0]:starts[1]].strip() == precision and row[starts[1] - 1] == " "
        assert row.endswith("4.00x")
