"""`hotrod profile` (where an artifact's time goes, `hotrod.bench.ops`) and `hotrod tune` (which of hotrod's
CPU kernels this machine runs, chosen by measurement, `hotrod.bench.tune`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _work_args(p: argparse.ArgumentParser, length: int, new_tokens: int) -> None:
    """The work an artifact is timed on: seeded token ids, and the tokens a language model generates."""
    p.add_argument("--batch", type=int, default=1, help="rows of seeded token ids")
    p.add_argument("--length", type=int, default=length, help="tokens a row (the prompt, for language models)")
    p.add_argument("--new-tokens", type=int, default=new_tokens, help="tokens generated per run (language models)")


def add_measure_parsers(sub) -> None:
    p = sub.add_parser("profile", help="time an artifact operator by operator, against each graph's floor")
    p.add_argument("artifact")
    _work_args(p, length=32, new_tokens=64)
    p.add_argument("--runs", type=int, default=3, help="profiled runs after a warm-up")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    p.add_argument("--top", type=int, default=12, help="operators listed per graph")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures to FILE")
    p.set_defaults(handler=_profile)

    p = sub.add_parser("tune", help="time an artifact with each of hotrod's CPU kernels and without it, and keep "
                                    "onnxruntime's ops on this machine where they were faster")
    p.add_argument("artifact", nargs="?", help="a CPU artifact whose work times the kernels it uses")
    _work_args(p, length=128, new_tokens=32)
    p.add_argument("--runs", type=int, default=15, help="interleaved rounds of timed runs")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    p.add_argument("--show", action="store_true", help="say what this machine leaves out now, and measure nothing")
    p.add_argument("--forget", action="store_true", help="remove this machine's record: every kernel runs again")
    p.set_defaults(handler=_tune)


def _profile(args: argparse.Namespace) -> int:
    from hotrod.bench.ops import check_output, format_profile, profile_artifact, write_profile
    from hotrod.errors import check_number

    check_number("--top", args.top, 1)
    if args.json:
        check_output(Path(args.json))
    profile = profile_artifact(args.artifact, batch=args.batch, length=args.length, new_tokens=args.new_tokens,
                               runs=args.runs, threads=args.threads)
    print(format_profile(profile, top=args.top))
    if args.json:
        print(f"figures: {write_profile(profile, Path(args.json))}")
    return 0


def _tune(args: argparse.Namespace) -> int:
    from hotrod.errors import HotrodError
    from hotrod.runtime import kernel_choice

    if args.show and args.forget:
        raise HotrodError("--show and --forget are each a whole command: give one")
    if args.show or args.forget:
        if args.artifact:
            raise HotrodError(f"--{'show' if args.show else 'forget'} measures nothing: leave out {args.artifact}")
        if args.forget:
            print("record removed: every kernel runs" if kernel_choice.forget() else "no record: every kernel runs")
            return 0
        out = ", ".join(sorted(kernel_choice.left_out())) or "none"
        print(f"left out on this machine: {out}\nrecord: {kernel_choice.record_path()}")
        return 0
    if not args.artifact:
        raise HotrodError("tune needs an artifact to time (or --show, or --forget)")
    from hotrod.bench.tune import format_tuning, tune_artifact

    tuning = tune_artifact(args.artifact, batch=args.batch, length=args.length, new_tokens=args.new_tokens,
                           runs=args.runs, threads=args.threads)
    print(format_tuning(tuning))
    return 0
