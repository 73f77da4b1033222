"""Which of hotrod's CPU kernels this machine should run, chosen by measurement (`hotrod tune ARTIFACT`).

The artifact is loaded once with every kernel that applies to it and once without each of them in turn; the
loads' work (a greedy generation of a forced length, or one forward, as `hotrod profile` runs it) is timed
interleaved, a round at a time, so that a phase of the machine falls on every variant alike, and each kernel is
judged by the median over the rounds of its round's ratio (the work without it over the work with it, run
moments apart), which a phase that moves between rounds does not sway. A kernel is recorded as left out on this
machine (`hotrod.runtime.kernel_choice`) where the work ran faster without it in more rounds than chance
allows (a one-sided sign test at ALPHA: with 15 rounds, 13 or more) and both that median ratio and the ratio of
the two medians are below 1 / MARGIN; models loaded afterwards run onnxruntime's ops in its place. It is put
back only where the same test finds it faster (a win, the mirror of that loss). A measurement that passes
neither keeps the earlier choice, so that noise alone does not flip one: one artifact's tie (t5-small's products
on a Zen 4, 1.05x in 6 of 15 rounds) must not undo another's clear loss (GPT-2's, 0.82x in 14 of 15). A small
loss needs more rounds (`--runs`) to be found. The verdicts are the machine's, and this artifact's own too (a
verdict turns on the shapes): the artifact then loads with its own, others with the machine's. Kernels that do
not apply to this artifact keep what an earlier measurement chose for them.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from hotrod.bench.ops import time_work, work_inputs
from hotrod.errors import HotrodError
from hotrod.kinds import spec as kind_spec
from hotrod.runtime import kernel_choice
from hotrod.runtime.base import cpu_threads
from hotrod.timing import interleaved

ALL = "every kernel"
MARGIN = 1.02  # how much faster the work must run without a kernel for it to be left out
ALPHA = 0.01  # the chance, were the kernel no slower, of its losing as many rounds as it did
MIN_RUNS = math.ceil(math.log2(1 / ALPHA))  # the fewest rounds in which a loss in every one passes the test


@dataclass(frozen=True)
class KernelTiming:
    kernel: str
    with_ms: float  # the work's median with every kernel
    without_ms: float  # its median with this one left out
    speedup: float  # what the kernel gains here: the median over rounds of the work without it over with it
    lost: int  # rounds in which the work ran faster without it
    rounds: int

    @property
    def chance(self) -> float:
        """The sign test's p: the chance of losing at least `lost` of the rounds by a coin's toss."""
        return sum(math.comb(self.rounds, k) for k in range(self.lost, self.rounds + 1)) / 2 ** self.rounds

    @property
    def left_out(self) -> bool:
        return self.chance < ALPHA and self.speedup * MARGIN < 1.0 and self.without_ms * MARGIN < self.with_ms

    @property
    def wins(self) -> bool:
        """Faster with it by the same test a loss must pass: what puts back a kernel left out before."""
        won = self.rounds - self.lost
        chance = sum(math.comb(self.rounds, k) for k in range(won, self.rounds + 1)) / 2 ** self.rounds
        return chance < ALPHA and self.speedup > MARGIN and self.with_ms * MARGIN < self.without_ms

    @property
    def decided(self) -> bool | None:
        """Left out (True), run (False), or None where the measurement is no evidence either way."""
        return True if self.left_out else False if self.wins else None


@dataclass(frozen=True)
class Tuning:
    timings: list[KernelTiming]
    left_out: frozenset[str]  # for this artifact from now on (its own verdicts, else the machine's)
    record: Path


def tune_artifact(path: str | Path, batch: int = 1, length: int = 128, new_tokens: int = 32, runs: int = 15,
                  threads: int = 0) -> Tuning:
    """Times the artifact's work with each of hotrod's kernels and without it, and records for this machine and
    for this artifact the kernels whose absence was faster (and those whose presence was)."""
    import hotrod

    artifact, ids = work_inputs(path, batch, length, new_tokens, runs, "tune chooses among hotrod's CPU kernels")
    if runs < MIN_RUNS:  # a whole number within bounds: `work_inputs` checked it
        raise HotrodError(f"tune needs at least {MIN_RUNS} runs: with fewer, no loss passes its sign test "
                          f"(p < {ALPHA}), got {runs}")
    generates = kind_spec(artifact.manifest["kind"]).generates
    with kernel_choice.leaving_out(set()):
        models = {ALL: hotrod.load(artifact.path, device="cpu", threads=threads)}
    used = kernel_choice.kernels_in(set().union(*models[ALL].backend.kernel_ops.values()))
    if not used:
        raise HotrodError(f"none of hotrod's CPU kernels applies to {artifact.path} on this CPU: "
                          "onnxruntime's ops run it either way")
    for name in used:
        with kernel_choice.leaving_out({name}):
            models[name] = hotrod.load(artifact.path, device="cpu", threads=threads)

    def work(model):
        return lambda: time_work(model, ids, generates, new_tokens, 1)

    for model in models.values():  # the warm-up
        time_work(model, ids, generates, new_tokens, 1)
    # the order turns each round (`interleaved`), so that no variant always runs first after the pause
    times = interleaved({name: work(model) for name, model in models.items()}, runs=runs, warmup=0)
    medians = {name: statistics.median(samples) * 1e3 for name, samples in times.items()}
    ratios = {name: [b / a for a, b in zip(times[ALL], times[name])] for name in used}
    timings = [KernelTiming(name, medians[ALL], medians[name], statistics.median(ratios[name]),
                            sum(r < 1.0 for r in ratios[name]), runs) for name in used]
    measured = {t.kernel: {"with_ms": t.with_ms, "without_ms": t.without_ms, "speedup": t.speedup,
                           "rounds_faster_without": t.lost, "artifact": str(Path(artifact.path).resolve()),
                           "runs": runs, "threads": cpu_threads(threads)}
                for t in timings if t.decided is not None}  # the measurements that decided, as measured
    # kernels this artifact could not measure, or measured without evidence either way, keep their choice
    path, chosen = kernel_choice.record({t.kernel: t.decided for t in timings if t.decided is not None}, measured,
                                        kernel_choice.artifact_key(Path(artifact.path)))
    return Tuning(timings, chosen, path)


def format_tuning(tuning: Tuning) -> str:
    lines = [f"  {'kernel':<15} {'with it ms':>11} {'without ms':>11} {'gain':>6} {'lost':>8} {'p':>6}  here",
             *(f"  {t.kernel:<15} {t.with_ms:11.3f} {t.without_ms:11.3f} {t.speedup:5.2f}x {t.lost:3d} of {t.rounds:<2d} "
               f"{t.chance:6.3f}  {_verdict(t, tuning.left_out)}" for t in tuning.timings)]
    out = ", ".join(sorted(tuning.left_out)) or "none"
    machine = ", ".join(sorted(kernel_choice.left_out())) or "none"
    return "\n".join([*lines, f"left out for this artifact: {out}", f"left out on this machine (artifacts not tuned): "
                      f"{machine}", f"record: {tuning.record}"])


def _verdict(timing: KernelTiming, left_out: frozenset[str]) -> str:
    now = "onnxruntime runs instead" if timing.kernel in left_out else "runs"
    return now if timing.decided is not None else f"{now} (no evidence either way: the earlier choice stays)"
