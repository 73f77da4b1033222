"""benchmarks/serve_translation.py (W10 served) and the CTranslate2 server it runs as the peer
(benchmarks/ct2_server.py): the batching server gathers concurrent requests into one call, a --tiny run
answers every request on both servers, and bad settings are one line before any work."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import ct2_server  # noqa: E402
import serve_translation  # noqa: E402


class _Translator:
    """Records each `translate_batch` call; answers each source with its first two tokens."""

    def __init__(self):
        self.calls: list[tuple[int, dict]] = []

    def translate_batch(self, sources, **options):
        self.calls.append((len(sources), options))
        return [SimpleNamespace(hypotheses=[source[:2]]) for source in sources]


def test_the_batcher_translates_requests_that_arrive_together_in_one_call():
    async def scenario():
        translator = _Translator()
        batcher = ct2_server.Batcher(translator, max_batch_size=8, wait_s=0.05)
        loop = asyncio.get_running_loop()
        pending = [ct2_server.Pending([f"<{i}>", "<9>", "<8>"], 4, 1, loop.create_future()) for i in range(3)]
        pending.append(ct2_server.Pending(["<5>", "<6>"], 4, 2, loop.create_future()))  # other beams: own call
        task = asyncio.create_task(batcher.run())
        for item in pending:
            await batcher.queue.put(item)
        answers = await asyncio.gather(*(p.answer for p in pending))
        task.cancel()
        return translator.calls, answers

    calls, answers = asyncio.run(scenario())
    assert [(n, o["beam_size"], o["max_decoding_length"]) for n, o in calls] == [(3, 1, 4), (1, 2, 4)]
    assert answers == [["<0>", "<9>"], ["<1>", "<9>"], ["<2>", "<9>"], ["<5>", "<6>"]]


def test_tiny_run_of_both_servers(tmp_path, monkeypatch):
    pytest.importorskip("ctranslate2")
    monkeypatch.setenv("HOTROD_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "w10"
    assert serve_translation.main(["--tiny", "--requests", "4", "--concurrency", "2", "--new-tokens", "4",
                                   "--threads", "1", "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    cells = {c["policy"]: c for c in data["cells"]}
    assert set(cells) == {"hotrod serve int8", "ctranslate2 int8"}, data["problems"]
    for cell in cells.values():
        assert cell["completed"] == 4 and cell["failed"] == 0 and cell["tokens"] > 0, cell["errors"]
        assert cell["latency_s"]["p50"] <= cell["latency_s"]["p95"]
    assert cells["ctranslate2 int8"]["compute_type"] == "int8_float32"
    assert data["ratio"]["tokens_per_s"] > 0
    assert "| ctranslate2 int8 | 4 / 0 / 0 |" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "0"], "must be >= 1"),
    (["--systems", "hotrod,vllm"], "--systems"),
    (["--precision", "int3"], "--precision: unknown 'int3'"),
    (["--ct2-quantization", "float16"], "--ct2-quantization: unknown 'float16'"),
])
def test_bad_settings_are_one_line_before_any_work(args, message, capsys, monkeypatch):
    monkeypatch.setattr(serve_translation, "run", lambda args: pytest.fail("ran"))
    assert serve_translation.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("serve_translation: error:") and message in err and "\n" not in err
