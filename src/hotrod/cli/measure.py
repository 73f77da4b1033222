"""`hotrod profile` (where an artifact's time goes, `hotrod.bench.ops`) and `hotrod tune` (which of hotrod's
CPU kernels this machine runs, chosen by measurement, `hotrod.bench.tune`)."""

from __future__ import annotations

import argparse
from pathlib import Path

# tune's work when its options are not given; left unset by the parser so that --show and --forget, which
# measure nothing, can refuse them rather than ignore them
TUNE_WORK = {"batch": 1, "length": 128, "new_tokens": 32, "runs": 15, "threads": 0}
PROFILE_WORK = {"batch": 1, "length": 32, "new_tokens": 64}


def _work_args(p: argparse.ArgumentParser, length: int, new_tokens: int, unset: bool = False) -> None:
    """The work an artifact is timed on: seeded token ids, and the tokens a language model generates; with
    `unset`, options not given are None (their defaults said in the help)."""
    def option(name: str, value: int, what: str) -> None:
        p.add_argument(name, type=int, default=None if unset else value, metavar="N",
                       help=f"{what} (default {value})" if unset else what)

    option("--batch", 1, "rows of seeded token ids")
    option("--length", length, "tokens a row (the prompt, for language models)")
    option("--new-tokens", new_tokens, "tokens generated per run (language models)")


def add_measure_parsers(sub) -> None:
    p = sub.add_parser("profile", help="time an artifact operator by operator, against each graph's floor")
    p.add_argument("artifact")
    _work_args(p, length=PROFILE_WORK["length"], new_tokens=PROFILE_WORK["new_tokens"], unset=True)
    p.add_argument("--runs", type=int, default=3, help="profiled runs after a warm-up")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    p.add_argument("--top", type=int, default=12, help="operators listed per graph")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures to FILE")
    p.set_defaults(handler=_profile)

    p = sub.add_parser("tune", help="time an artifact with each of hotrod's CPU kernels and without it, and keep "
                                    "onnxruntime's ops on this machine where they were faster")
    p.add_argument("artifact", nargs="?", help="a CPU artifact whose work times the kernels it uses")
    _work_args(p, length=TUNE_WORK["length"], new_tokens=TUNE_WORK["new_tokens"], unset=True)
    p.add_argument("--runs", type=int, default=None, metavar="N",
                   help=f"interleaved rounds of timed runs (default {TUNE_WORK['runs']})")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads (default: all cores)")
    p.add_argument("--show", action="store_true", help="say what this machine leaves out now, and measure nothing")
    p.add_argument("--forget", action="store_true", help="remove this machine's record: every kernel runs again")
    p.set_defaults(handler=_tune)


def _profile(args: argparse.Namespace) -> int:
    from hotrod.bench.ops import check_output, format_profile, profile_artifact, write_profile
    from hotrod.errors import check_number

    check_number("--top", args.top, 1)
    if args.json:
        check_output(Path(args.json))
    _check_new_tokens(args.artifact, args.new_tokens)
    profile = profile_artifact(args.artifact, **_work(args, PROFILE_WORK), runs=args.runs, threads=args.threads)
    print(format_profile(profile, top=args.top))
    if args.json:
        print(f"figures: {write_profile(profile, Path(args.json))}")
    return 0


def _work(args: argparse.Namespace, defaults: dict[str, int]) -> dict[str, int]:
    """The work's options as given, each not given at its default."""
    return {name: default if getattr(args, name) is None else getattr(args, name) for name, default in defaults.items()}


def _check_new_tokens(path: str, given: int | None) -> None:
    """--new-tokens times a language model's generation: given for an encoder, it would change nothing."""
    from hotrod import artifact as art
    from hotrod.errors import HotrodError
    from hotrod.kinds import spec

    if given is not None and not spec(art.open_artifact(path).manifest["kind"]).generates:
        raise HotrodError(f"--new-tokens applies to a language model's artifact; {path} holds an encoder")


def _tune(args: argparse.Namespace) -> int:
    from hotrod.errors import HotrodError
    from hotrod.runtime import kernel_choice

    if args.show and args.forget:
        raise HotrodError("--show and --forget are each a whole command: give one")
    if args.show or args.forget:
        given = [f"--{name.replace('_', '-')}" for name in TUNE_WORK if getattr(args, name) is not None]
        what = f"--{'show' if args.show else 'forget'} measures nothing: leave out"
        if args.artifact:
            raise HotrodError(f"{what} {args.artifact}")
        if given:
            raise HotrodError(f"{what} {', '.join(given)}")
        if args.forget:
            print("record removed: every kernel runs" if kernel_choice.forget() else "no record: every kernel runs")
            return 0
        out = ", ".join(sorted(kernel_choice.left_out())) or "none"
        own = kernel_choice.tuned_artifacts()
        print(f"left out on this machine: {out}" + (f" (and {own} tuned artifacts run their own verdicts)" if own else "")
              + f"\nrecord: {kernel_choice.record_path()}")
        return 0
    if not args.artifact:
        raise HotrodError("tune needs an artifact to time (or --show, or --forget)")
    from hotrod.bench.tune import format_tuning, tune_artifact

    _check_new_tokens(args.artifact, args.new_tokens)
    tuning = tune_artifact(args.artifact, **_work(args, TUNE_WORK))
    print(format_tuning(tuning))
    return 0
