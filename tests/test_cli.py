"""The `hotrod` command end to end: in-process through `main`, and a few real processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

import hotrod
from hotrod.cli import main
from tests.zoo import CASES, POSITIONS, VOCAB, assert_same_tokens, prompt_batch


def run(capsys, *argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `hotrod ARGV...`, run in this process."""
    capsys.readouterr()  # drop what building the zoo printed
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def ok(capsys, *argv) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    return out


def assert_one_error_line(code: int, out: str, err: str, status: int, match: str = ""):
    assert code == status
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{err}"
    assert lines[0].startswith("hotrod: error: ")
    assert re.search(match, lines[0]), lines[0]


def id_text(ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    return [" ".join(map(str, row[m.bool()].tolist())) for row, m in zip(ids, mask, strict=True)]


def left_padded(rows: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """What `--ids` builds from its prompts: rows left-padded with 0, and their mask."""
    lists = [[int(t) for t in row.split()] for row in rows]
    width = max(map(len, lists))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in lists])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in lists])
    return ids, mask


# -- optimize and info ----------------------------------------------------------------------------


def test_optimize_then_info(zoo, capsys, tmp_path):
    out = tmp_path / "art"
    assert ok(capsys, "optimize", zoo.checkpoint("gpt2"), "--out", out).strip() == str(out)
    info = ok(capsys, "info", out)
    assert re.search(r"model\s+gpt2 \(gpt2 family, decoder\)", info)
    assert re.search(r"graph\s+decoder .*inputs: input_ids, position_ids, seqlens_k, total_sequence_length, logits_positions \+ 4 cache tensors", info)
    assert str(zoo.checkpoint("gpt2")) in info
    assert json.loads(ok(capsys, "info", out, "--json")) == json.loads((out / "manifest.json").read_text())


def test_optimize_refuses_existing_output_unless_forced(zoo, capsys, tmp_path):
    out = zoo.copy_artifact("bert", tmp_path / "art")
    assert_one_error_line(*run(capsys, "optimize", zoo.checkpoint("gpt2"), "--out", out), 1, "--force")
    ok(capsys, "optimize", zoo.checkpoint("gpt2"), "--out", out, "--force")
    assert json.loads((out / "manifest.json").read_text())["family"] == "gpt2"


# -- generate -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["t5", "gpt2"])
def test_generate_ids(zoo, capsys, name):
    rows = id_text(*prompt_batch(CASES[name], (6, 3)))
    printed = ok(capsys, "generate", zoo.artifact(name), *rows, "--ids", "--max-new-tokens", 5)
    ids, mask = left_padded(rows)
    expected = zoo.model(name, "onnxruntime").generate(ids, attention_mask=mask, max_new_tokens=5)
    assert printed.splitlines() == [" ".join(map(str, row)) for row in expected.tolist()]


def test_generate_ids_pad_an_encoders_input_on_the_right(zoo, capsys):
    """BART's encoder has absolute positions: a row padded on the left would start at a later position, and its
    answer would depend on its batch-mates; each row's answer is its own, alone."""
    rows = id_text(*prompt_batch(CASES["bart"], (8, 3)))
    printed = ok(capsys, "generate", zoo.artifact("bart"), *rows, "--ids", "--max-new-tokens", 5)
    alone = [ok(capsys, "generate", zoo.artifact("bart"), row, "--ids", "--max-new-tokens", 5).strip() for row in rows]
    assert printed.splitlines() == alone


def test_sampling_flags_follow_a_checkpoint_that_samples_by_default(zoo, capsys, tmp_path):
    source = zoo.copy_checkpoint("gpt2", tmp_path / "sampling")
    settings = json.loads((source / "generation_config.json").read_text())
    (source / "generation_config.json").write_text(json.dumps({**settings, "do_sample": True}))
    argv = ("generate", source, "5 6 7", "--ids", "--max-new-tokens", 6, "--temperature", 2.0)
    assert ok(capsys, *argv, "--seed", 3) == ok(capsys, *argv, "--seed", 3)


def test_generate_ids_json_with_beams_and_several_returns(zoo, capsys):
    rows = id_text(*prompt_batch(CASES["t5"], (6, 3)))
    printed = ok(capsys, "generate", zoo.artifact("t5"), *rows, "--ids", "--json", "--max-new-tokens", 4,
                 "--num-beams", 3, "--num-return-sequences", 2)
    ids, mask = left_padded(rows)
    expected = zoo.model("t5", "onnxruntime").generate(ids, attention_mask=mask, max_new_tokens=4, num_beams=3,
                                                       num_return_sequences=2)
    results = json.loads(printed)
    assert [r["prompt"] for r in results] == [rows[0], rows[0], rows[1], rows[1]]
    assert [r["token_ids"] for r in results] == expected.tolist()


def test_generate_text_with_the_tokenizer(zoo, capsys):
    prompts = ["hello world", "the quick brown fox jumps over"]
    printed = ok(capsys, "generate", zoo.artifact("gpt2"), *prompts, "--max-new-tokens", 6, "--json")
    tokenizer = transformers.AutoTokenizer.from_pretrained(zoo.artifact("gpt2"), padding_side="left")
    tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    model = zoo.model("gpt2", "onnxruntime")
    expected = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=6)
    results = json.loads(printed)
    assert [r["token_ids"] for r in results] == expected.tolist()
    assert [r["text"] for r in results] == tokenizer.batch_decode(expected, skip_special_tokens=True)
    assert all(r["text"].startswith(p) for r, p in zip(results, prompts, strict=True))
    plain = ok(capsys, "generate", zoo.artifact("gpt2"), *prompts, "--max-new-tokens", 6)
    assert plain.splitlines() == [r["text"] for r in results]


def test_generate_sampling_is_reproducible_with_seed(zoo, capsys):
    argv = ("generate", zoo.artifact("gpt2"), "5 6 7", "--ids", "--do-sample", "--temperature", 5.0,
            "--max-new-tokens", 8)
    first, again = ok(capsys, *argv, "--seed", 1), ok(capsys, *argv, "--seed", 1)
    assert first == again
    assert ok(capsys, *argv, "--seed", 2) != first
    torch.manual_seed(1)
    expected = zoo.model("gpt2", "onnxruntime").generate(torch.tensor([[5, 6, 7]]), do_sample=True, temperature=5.0,
                                                         max_new_tokens=8)
    assert first.split() == [str(t) for t in expected[0].tolist()]


@pytest.mark.parametrize("source", ["checkpoint", "artifact_on_torch"])
def test_generate_from_a_checkpoint_or_on_torch(zoo, capsys, source):
    model = zoo.checkpoint("t5") if source == "checkpoint" else zoo.artifact("t5")
    backend = "onnxruntime" if source == "checkpoint" else "torch"
    printed = ok(capsys, "generate", model, "5 6 7 8", "--ids", "--max-new-tokens", 4, "--backend", backend,
                 "--threads", 1)
    expected = zoo.hf_generate("t5", torch.tensor([[5, 6, 7, 8]]), torch.ones(1, 4, dtype=torch.long),
                               max_new_tokens=4)
    assert printed.split() == [str(t) for t in expected[0].tolist()]



def test_generate_takes_an_assistant(zoo, capsys):
    artifact, assistant = zoo.artifact("gpt2"), zoo.artifact("gpt2-assistant")
    argv = ("generate", artifact, "3 4 5 3 4 5 3", "--ids", "--max-new-tokens", 8, "--min-new-tokens", 8)
    plain = ok(capsys, *argv)
    assert ok(capsys, *argv, "--assistant", assistant) == plain
    assert ok(capsys, *argv, "--assistant", assistant, "--assistant-tokens", 2) == plain
    text = ("generate", artifact, "hello world", "--max-new-tokens", 6)
    assert ok(capsys, *text, "--assistant", assistant) == ok(capsys, *text)
    sampled = (*argv, "--assistant", assistant, "--do-sample", "--seed", 3)
    assert ok(capsys, *sampled) == ok(capsys, *sampled)


def test_the_assistant_loads_with_the_models_runtime_options(zoo, capsys):
    argv = ("generate", zoo.checkpoint("t5"), "5 6 7 8", "--ids", "--max-new-tokens", 6, "--backend", "torch",
            "--threads", 1)
    assert ok(capsys, *argv, "--assistant", zoo.checkpoint("t5-assistant")) == ok(capsys, *argv)


# -- embed ----------------------------------------------------------------------------------------


def test_embed_text_json(zoo, capsys):
    texts = ["hello world", "a tiny model says hello"]
    result = json.loads(ok(capsys, "embed", zoo.artifact("bert"), *texts, "--pooling", "cls", "--normalize"))
    assert (result["pooling"], result["normalized"], result["dim"]) == ("cls", True, 32)
    expected = zoo.model("bert", "onnxruntime").embed(texts, pooling="cls", normalize=True)
    torch.testing.assert_close(torch.tensor(result["embeddings"]), expected, atol=1e-6, rtol=0)


def test_embed_ids_json(zoo, capsys):
    rows = id_text(*prompt_batch(CASES["roberta"], (6, 3)))
    result = json.loads(ok(capsys, "embed", zoo.artifact("roberta"), *rows, "--ids"))
    assert (result["pooling"], result["normalized"]) == ("mean", False)
    expected = zoo.model("roberta", "onnxruntime").embed([[int(t) for t in r.split()] for r in rows])
    torch.testing.assert_close(torch.tensor(result["embeddings"]), expected, atol=1e-6, rtol=0)


# -- every mistake is one line --------------------------------------------------------------------


def _long_ids(n: int) -> str:
    return " ".join(["5"] * n)


def _unsupported_checkpoint(zoo, tmp_path) -> Path:
    source = zoo.copy_checkpoint("bert", tmp_path / "ckpt")
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "model_type": "llama-ish"}))
    return source


def _weightless_checkpoint(zoo, tmp_path) -> Path:
    source = zoo.copy_checkpoint("bert", tmp_path / "ckpt")
    (source / "model.safetensors").unlink()
    return source


def _tokenizerless_checkpoint(zoo, tmp_path) -> Path:
    """The roberta checkpoint without its tokenizer files: a model that reads token ids only."""
    source = zoo.copy_checkpoint("roberta", tmp_path / "bare")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (source / name).unlink(missing_ok=True)
    return source


def _locked(out: Path) -> Path:
    """`out`, with its lock held as if another optimize were writing it (until the test's process ends)."""
    import filelock

    lock = filelock.FileLock(out.parent / f".{out.name}.lock")
    lock.acquire()
    _HELD.append(lock)
    return out


_HELD: list = []


def _corrupt_artifact(zoo, tmp_path) -> Path:
    artifact = zoo.copy_artifact("bert", tmp_path / "art")
    (artifact / "encoder.onnx").write_bytes(b"junk")
    return artifact


# (argv given the zoo and a scratch directory, exit status, what the line says)
MISTAKES = {
    "empty_prompt": (lambda z, t: ["generate", z.artifact("gpt2"), ""], 1, "empty prompt"),
    "empty_id_prompt": (lambda z, t: ["generate", z.artifact("t5"), "5 6", " ", "--ids"], 1, "empty prompt"),
    "prompt_too_long": (lambda z, t: ["generate", z.artifact("gpt2"), _long_ids(POSITIONS + 1), "--ids"], 1,
                        "positions"),
    "max_new_tokens_negative": (lambda z, t: ["generate", z.artifact("t5"), "5 6", "--ids", "--max-new-tokens",
                                              "-1"], 1, "max_new_tokens"),
    "max_new_tokens_zero": (lambda z, t: ["generate", z.artifact("t5"), "5 6", "--ids", "--max-new-tokens", "0"],
                            1, "max_new_tokens"),
    "max_new_tokens_absurd": (lambda z, t: ["generate", z.artifact("t5"), "5 6", "--ids", "--max-new-tokens",
                                            "100000"], 1, "beyond the limit"),
    "prompt_plus_new_too_long": (lambda z, t: ["generate", z.artifact("gpt2"), _long_ids(60), "--ids",
                                               "--max-new-tokens", "10"], 1, "exceeds the model's 64 positions"),
    "num_beams_zero": (lambda z, t: ["generate", z.artifact("t5"), "5 6", "--ids", "--num-beams", "0"], 1,
                       "num_beams"),
    "top_p_zero": (lambda z, t: ["generate", z.artifact("t5"), "5 6", "--ids", "--do-sample", "--top-p", "0"], 1,
                   "top_p"),
    "top_p_above_one": (lambda z, t: ["generate", z.artifact("t5"), "5 6", "--ids", "--do-sample", "--top-p",
                                      "1.5"], 1, "top_p"),
    "temperature_zero": (lambda z, t: ["generate", z.artifact("t5"), "5 6", "--ids", "--do-sample",
                                       "--temperature", "0"], 1, "temperature"),
    "id_outside_vocab": (lambda z, t: ["generate", z.artifact("gpt2"), f"5 {VOCAB}", "--ids"], 1,
                         "outside the vocabulary"),
    "negative_id": (lambda z, t: ["generate", z.artifact("gpt2"), "5 -3", "--ids"], 1, "outside the vocabulary"),
    "id_beyond_any_tensor": (lambda z, t: ["generate", z.artifact("gpt2"), "1 99999999999999999999", "--ids"], 1,
                             "token id 99999999999999999999 is outside the vocabulary"),
    "tiny_temperature": (lambda z, t: ["generate", z.artifact("gpt2"), "5 6", "--ids", "--do-sample",
                                       "--temperature", "1e-300"], 1, "temperature must be at least"),
    "infinite_repetition_penalty": (lambda z, t: ["generate", z.artifact("gpt2"), "5 6", "--ids",
                                                  "--repetition-penalty", "inf"], 1, "finite"),
    "optimize_into_a_locked_out": (lambda z, t: ["optimize", z.checkpoint("bert"), "--out", _locked(t / "o")], 1,
                                   "another hotrod process is writing"),
    "ids_not_integers": (lambda z, t: ["generate", z.artifact("t5"), "5 six", "--ids"], 1,
                         "space-separated integers"),
    "generate_on_encoder": (lambda z, t: ["generate", z.artifact("bert"), "5 6", "--ids"], 1, "encoder"),
    "text_without_tokenizer": (lambda z, t: ["generate", z.artifact("t5"), "hello"], 1, "no tokenizer"),
    "embed_on_decoder": (lambda z, t: ["embed", z.artifact("gpt2"), "5 6", "--ids"], 1, "decoder-only"),
    "embed_text_without_tokenizer": (lambda z, t: ["embed", _tokenizerless_checkpoint(z, t), "hello", "--backend",
                                                   "torch"], 1, "no tokenizer"),
    "missing_model": (lambda z, t: ["generate", t / "nowhere", "hello"], 1, "no such model directory"),
    "hub_id_offline": (lambda z, t: ["generate", "someone/not-cached", "hello"], 1, "'someone/not-cached'"),
    "negative_threads": (lambda z, t: ["generate", z.artifact("t5"), "5 6", "--ids", "--threads", "-1"], 1,
                         "threads"),
    "absurd_threads": (lambda z, t: ["generate", z.artifact("t5"), "5 6", "--ids", "--threads", "100000"], 1,
                       "threads must be at most"),
    "seed_past_64_bits": (lambda z, t: ["generate", z.artifact("gpt2"), "5 6", "--ids", "--do-sample", "--seed",
                                        str(2**64)], 1, "--seed must be in"),
    "temperature_without_sampling": (lambda z, t: ["generate", z.artifact("gpt2"), "5 6", "--ids", "--temperature",
                                                   "0.5"], 1, "--temperature applies only when sampling"),
    "seed_without_sampling": (lambda z, t: ["generate", z.artifact("gpt2"), "5 6", "--ids", "--seed", "3"], 1,
                              "--seed applies only when sampling"),
    "optimize_an_artifact": (lambda z, t: ["optimize", z.artifact("gpt2"), "--out", t / "o"], 1,
                             "is a hotrod artifact, not a checkpoint"),
    "info_not_an_artifact": (lambda z, t: ["info", z.checkpoint("bert")], 1, "not a hotrod artifact"),
    "info_corrupt_artifact": (lambda z, t: ["info", _corrupt_artifact(z, t)], 1, "corrupt"),
    "generate_corrupt_artifact": (lambda z, t: ["generate", _corrupt_artifact(z, t), "5", "--ids"], 1, "corrupt"),
    "optimize_unsupported": (lambda z, t: ["optimize", _unsupported_checkpoint(z, t), "--out", t / "o"], 1,
                             "unsupported model_type 'llama-ish'; supported: bart, bert, "),
    "optimize_without_weights": (lambda z, t: ["optimize", _weightless_checkpoint(z, t), "--out", t / "o"], 1,
                                 "has no weights"),
    "bad_backend": (lambda z, t: ["generate", z.artifact("t5"), "5", "--backend", "tensorflow"], 2, "invalid choice"),
    "max_new_tokens_not_int": (lambda z, t: ["generate", z.artifact("t5"), "5", "--max-new-tokens", "many"], 2,
                               "invalid int value"),
    "no_prompt": (lambda z, t: ["generate", z.artifact("t5")], 2, "PROMPT"),
    "optimize_without_out": (lambda z, t: ["optimize", z.checkpoint("bert")], 2, "--out"),
    "bad_precision": (lambda z, t: ["optimize", z.checkpoint("bert"), "--out", t / "o", "--precision", "int3"], 2,
                      "invalid choice"),
    "unknown_command": (lambda z, t: ["frobnicate"], 2, "invalid choice"),
    "engine_precision_on_onnxruntime": (lambda z, t: ["generate", z.artifact("t5"), "5", "--ids",
                                                      "--engine-precision", "bf16"], 1, "applies to the torch backend"),
    "engine_precision_on_a_cpu": (lambda z, t: ["generate", z.checkpoint("t5"), "5", "--ids", "--backend", "torch",
                                                "--engine-precision", "bf16"], 1, "runs on --device cuda"),
    "bad_engine_precision": (lambda z, t: ["generate", z.checkpoint("t5"), "5", "--backend", "torch",
                                           "--engine-precision", "int3"], 2, "invalid choice"),
    "assistant_of_another_kind": (lambda z, t: ["generate", z.artifact("gpt2"), "5 6", "--ids", "--assistant",
                                                z.artifact("t5")], 1, "assistant_model is a model of kind seq2seq"),
    "assistant_missing": (lambda z, t: ["generate", z.artifact("gpt2"), "5 6", "--ids", "--assistant",
                                        t / "nowhere"], 1, "no such model directory"),
    "assistant_with_beams": (lambda z, t: ["generate", z.artifact("gpt2"), "5 6", "--ids", "--num-beams", "2",
                                           "--assistant", z.artifact("gpt2-assistant")], 1, "not beam search"),
    "assistant_with_two_prompts": (lambda z, t: ["generate", z.artifact("gpt2"), "5 6", "7 8", "--ids",
                                                 "--assistant", z.artifact("gpt2-assistant")], 1, "one row at a time"),
    "assistant_and_prompt_lookup": (lambda z, t: ["generate", z.artifact("gpt2"), "5 6", "--ids", "--prompt-lookup",
                                                  "2", "--assistant", z.artifact("gpt2-assistant")], 1, "not both"),
    "assistant_tokens_zero": (lambda z, t: ["generate", z.artifact("gpt2"), "5 6", "--ids", "--assistant-tokens", "0",
                                            "--assistant", z.artifact("gpt2-assistant")], 1,
                              "num_assistant_tokens must be a whole number from 1 to 64"),
    "assistant_tokens_alone": (lambda z, t: ["generate", z.artifact("gpt2"), "5 6", "--ids", "--assistant-tokens",
                                             "3"], 1, "pass assistant_model too"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_every_mistake_is_one_error_line(zoo, capsys, tmp_path, mistake):
    argv, status, match = MISTAKES[mistake]
    assert_one_error_line(*run(capsys, *argv(zoo, tmp_path)), status, match)


def test_no_command_prints_help(capsys):
    code, out, _ = run(capsys)
    assert code == 2 and "usage: hotrod" in out


# -- real processes -------------------------------------------------------------------------------


def hotrod_process(*argv, tmp_path: Path) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("hotrod")  # the installed console script
    env = {**os.environ, "HOTROD_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([str(script), *map(str, argv)], capture_output=True, text=True, env=env, timeout=300)


def test_console_script_writes_an_artifact_this_process_loads(zoo, tmp_path):
    done = hotrod_process("optimize", zoo.checkpoint("t5_v1_1"), "--out", tmp_path / "art", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "art")
    ids, mask = prompt_batch(CASES["t5_v1_1"], (6, 3))
    kwargs = dict(attention_mask=mask, max_new_tokens=6, num_beams=3)
    assert_same_tokens(hotrod.load(tmp_path / "art").generate(ids, **kwargs),
                       zoo.model("t5_v1_1", "onnxruntime").generate(ids, **kwargs))


@pytest.mark.parametrize("argv, status, match", [
    (lambda z: ["generate", z.artifact("bert"), "5 6", "--ids"], 1, "encoder"),
    (lambda z: ["generate", "someone/not-cached", "hello"], 1, "'someone/not-cached'"),
    (lambda z: ["generate", z.artifact("t5"), "5", "--num-beams", "two"], 2, "invalid int value"),
], ids=["runtime_error", "hub_offline", "argparse_error"])
def test_a_real_process_prints_one_error_line(zoo, tmp_path, argv, status, match):
    done = hotrod_process(*argv(zoo), tmp_path=tmp_path)
    assert_one_error_line(done.returncode, done.stdout, done.stderr, status, match)


@pytest.mark.parametrize("option, value, message", [
    ("--max-batch-size", "0", "max_batch_size must be >= 1"),
    ("--max-queue-delay-ms", "inf", "max_queue_delay_ms must be a finite number"),
    ("--kv-cache-mb", "nan", "kv_cache_mb must be a finite number"),
    ("--kv-cache-mb", "inf", "kv_cache_mb must be a finite number"),
    ("--request-timeout", "inf", "request_timeout_s must be a finite number"),
    ("--shutdown-timeout", "-1", "shutdown_timeout_s must be >= 0"),
    ("--max-input-tokens", "0", "max_input_tokens must be an integer >= 1"),
    ("--max-batch-inputs", "0", "max_batch_inputs must be an integer >= 1"),
    ("--max-request-bytes", "-5", "max_request_bytes must be an integer >= 1"),
    ("--max-connections", "0", "max_connections must be an integer >= 1"),
    ("--api-key", "", "api_key must be a non-empty string"),
])
def test_serve_refuses_bad_numbers_before_loading(zoo, capsys, option, value, message):
    code, out, err = run(capsys, "serve", str(zoo.artifact("gpt2")), option, value)
    assert_one_error_line(code, out, err, 1, message)


def test_a_full_disk_during_optimize_is_one_line_and_leaves_nothing(zoo, capsys, tmp_path, fill_disk):
    fill_disk()
    code, out, err = run(capsys, "optimize", zoo.checkpoint("bert"), "--out", tmp_path / "o")
    last = err.splitlines()[-1]  # after the progress bars
    assert code == 1 and "Traceback" not in err and last.startswith("hotrod: error: cannot write")
    assert last.endswith("No space left on device")
    assert list(tmp_path.iterdir()) == []  # no staging directory, no lock file


def test_serve_refuses_bad_options_before_loading(zoo, capsys, tmp_path):
    import socket

    artifact = str(zoo.artifact("gpt2"))
    code, out, err = run(capsys, "serve", str(tmp_path / "missing"))
    assert_one_error_line(code, out, err, 1, "no such model directory")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        code, out, err = run(capsys, "serve", artifact, "--port", str(busy.getsockname()[1]))
    assert_one_error_line(code, out, err, 1, "cannot listen on")


def test_info_names_what_did_not_fuse(zoo, capsys, tmp_path):
    assert "  unfused   nothing" in ok(capsys, "info", zoo.artifact("bert"))
    plain = tmp_path / "plain"
    ok(capsys, "optimize", zoo.checkpoint("bert"), "--out", plain, "--no-fusion", "--verify-examples", "0")
    line = next(line for line in ok(capsys, "info", plain).splitlines() if line.startswith("  unfused"))
    assert "Erf x2 (GELU)" in line  # the exporter writes attention fused; GELU is left to the optimizer
