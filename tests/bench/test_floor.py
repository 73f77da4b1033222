"""The hardware floor: machine figures measured once and cached, and the floor arithmetic."""

from __future__ import annotations

import ctypes

import pytest
import transformers

from hotrod.bench import floor
from hotrod.bench.floor import Machine, forward_floor, generation_floor, machine, matmul_params

MACHINE = Machine(cpu="test", threads=2, bandwidth_gbs=20.0, matmul_gflops=200.0, int8_gops=800.0, measured="now")


def test_machine_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(floor, "_bandwidth", lambda megabytes: calls.append(megabytes) or 12.5 + 512 / megabytes)
    monkeypatch.setattr(floor, "_matmul_rate", lambda: 150.0)
    monkeypatch.setattr(floor, "_int8_rate", lambda: None)
    monkeypatch.setattr(floor, "_cpu_half_rate", lambda size, threads: None)
    first = machine(2, root=tmp_path)
    second = machine(2, root=tmp_path)
    assert first == second and calls == list(floor.READ_MB)
    assert first.bandwidth_gbs == 13.5 and first.reads_gbs["4"] == 12.5 + 128  # memory's: the largest set's
    assert machine(2, root=tmp_path, refresh=True) == first and calls == 2 * list(floor.READ_MB)
    assert first.rate("int8") == first.rate("fp32") == 150e9  # no int8 GEMM: the fp32 rate stands in


def test_real_measurements_are_positive_rates():
    assert floor._bandwidth(megabytes=16) > 0.1  # GB/s
    assert floor._matmul_rate(size=256) > 0.1  # GFLOP/s
    int8 = floor._int8_rate(size=256)
    assert int8 > floor._matmul_rate(size=256) / 10  # onnxruntime's kernel, not a reference loop (~50x slower)


def test_the_cpu_int8_rate_is_the_fastest_path_measured(monkeypatch):
    """A kernel's rate at one size is beaten by the same kernel elsewhere: the VNNI units' own rate, where this
    CPU has them and it is faster, is the floor's."""
    monkeypatch.setattr(floor, "_onnxruntime_int8_rate", lambda size, threads: 100.0)
    monkeypatch.setattr(floor, "_vnni_unit_rate", lambda threads: 300.0)
    assert floor._int8_rate() == 300.0
    monkeypatch.setattr(floor, "_onnxruntime_int8_rate", lambda size, threads: 500.0)  # AMX's tiles: the kernel's
    assert floor._int8_rate() == 500.0
    monkeypatch.setattr(floor, "_vnni_unit_rate", lambda threads: None)  # no VNNI, or no library
    assert floor._int8_rate() == 500.0


def test_the_vnni_units_rate_is_measured_where_they_are():
    from hotrod.runtime import native

    unit = native.entry("hotrod_vnni_unit_ops", ctypes.c_double, [ctypes.c_int64])
    here = unit is not None and native.has_flags(("avx512f", "avx512_vnni"))
    rate = floor._vnni_unit_rate(2, seconds=0.01, repeats=1)
    assert (rate is not None) == here
    if here:
        assert rate > 10  # GOP/s: a 512-bit multiply-add of 64 bytes a cycle at any clock, on either thread
        assert unit(1 << 10) > 0
    elif unit is not None:  # the library, on a CPU without the instruction: refused, not run
        assert unit(1 << 10) == -1.0
    if unit is not None:
        assert unit(0) == unit(-5) == -1.0  # no steps: refused, not timed


def test_matmul_params_count_matrices_not_embeddings():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100))
    step, total = matmul_params(gpt2, "decoder")
    per_layer = 32 * 96 + 32 * 32 + 32 * 128 + 128 * 32
    assert step == total == 2 * per_layer + 100 * 32  # the tied head counted once, positions left out
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4))
    step, total = matmul_params(t5, "seq2seq")
    assert step < total  # a decoding step does not read the encoder


def test_weights_that_fit_a_measured_working_set_are_read_at_its_rate():
    """A CPU with a large last-level cache reads small weights again far faster than memory: the floor takes the
    rate of the largest measured set they fill (a larger set's where noise measured it faster), memory's past
    every set measured."""
    cached = Machine(cpu="test", threads=2, bandwidth_gbs=20.0, matmul_gflops=200.0, int8_gops=800.0, measured="now",
                     reads_gbs={"8": 90.0, "64": 60.0, "128": 65.0, "512": 20.0})
    mb = 2**20
    assert cached.read_gbs(4 * mb) == cached.read_gbs(8 * mb) == 90.0  # smaller than any set: the smallest's
    assert cached.read_gbs(32 * mb) == 90.0 and cached.read_gbs(100 * mb) == 65.0 == cached.read_gbs(64 * mb)
    assert cached.read_gbs(300 * mb) == 65.0 and cached.read_gbs(512 * mb) == cached.read_gbs(600 * mb) == 20.0
    assert MACHINE.read_gbs(mb) == 20.0  # none measured (a GPU's record, or an old one): memory's bandwidth
    weights = 10**8 * 0.625  # int4 bytes, 60 MB: read at the 8 MB set's 90 GB/s
    assert generation_floor(10**8, 10**8, 0, 10, "int4", cached) == pytest.approx(10 * weights / 90e9)
    assert forward_floor(10**9, 1, "int8", cached) == pytest.approx(10**9 / 20e9)  # 954 MB: past every set


def test_floors_follow_bytes_and_work():
    per_token = 1e8 * 0.625 / 20e9  # int4 weights over bandwidth beat 2 * 1e8 ops at 800 GOP/s
    assert generation_floor(10**8, 10**8, 0, 10, "int4", MACHINE) == pytest.approx(10 * per_token)
    assert generation_floor(10**8, 10**8, 0, 10, "fp32", MACHINE) == pytest.approx(10 * 1e8 * 4 / 20e9)
    assert forward_floor(10**8, 1000, "fp32", MACHINE) == pytest.approx(2e11 / 200e9)
    assert forward_floor(10**8, 1000, "int8", MACHINE) == pytest.approx(2e11 / 800e9)


def test_an_encoder_decoder_prompt_reads_the_encoder_and_a_step_does_the_work_of_its_rows():
    # 512 prompt tokens through the 3e8 encoder weights only (the 1e8 a step reads are the decoder and head).
    prefill = 2 * 3e8 * 512 / 200e9
    assert generation_floor(10**8, 4 * 10**8, 512, 0, "fp32", MACHINE, encoder_only=True) == pytest.approx(prefill)
    assert generation_floor(10**8, 4 * 10**8, 512, 0, "fp32", MACHINE) == pytest.approx(4 / 3 * prefill)
    # 64 rows (16 x 4 beams) a step: their work (2 * 1e8 * 64 at 200 GFLOP/s) outweighs the weights' bytes.
    assert generation_floor(10**8, 10**8, 0, 1, "fp32", MACHINE, rows=64) == pytest.approx(2e8 * 64 / 200e9)
    assert generation_floor(10**8, 10**8, 0, 1, "fp32", MACHINE, rows=4) == pytest.approx(1e8 * 4 / 20e9)


def test_half_precision_uses_the_gpus_half_rate_where_measured():
    gpu = Machine(cpu="test", threads=2, bandwidth_gbs=4000.0, matmul_gflops=50_000.0, int8_gops=None,
                  measured="now", device="cuda", gpu="test gpu", half_gflops=700_000.0)
    assert gpu.rate("fp16") == gpu.rate("bf16") == 700_000e9 and gpu.rate("fp32") == 50_000e9
    assert MACHINE.rate("fp16") == MACHINE.rate("fp32")  # a CPU: no half rate measured, fp32 stands in


def test_a_cpu_with_amx_bf16_measures_hotrods_bf16_product_as_its_half_rate():
    from hotrod.runtime import bf16

    rate = floor._cpu_half_rate(256, 2)
    if not bf16.available():
        assert rate is None
        return
    assert rate > floor._matmul_rate(size=256) / 10
    cpu = Machine(cpu="test", threads=2, bandwidth_gbs=20.0, matmul_gflops=200.0, int8_gops=800.0, measured="now",
                  half_gflops=rate)
    assert cpu.rate("bf16-products") == rate * 1e9 and cpu.rate("fp32") == 200e9
