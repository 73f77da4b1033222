"""The `hotrod` command: a thin layer over the Python API.

Every error a user can cause ends as one line, `hotrod: error: ...`, and exit status 1 (2 for a
malformed command line), never a traceback.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Sequence

from hotrod import tasks
from hotrod.errors import HotrodError
from hotrod.options import AUTO, BACKENDS, BUILT_PRECISIONS, CALIBRATION_METHODS, DEVICES, ENGINE_PRECISIONS
from hotrod.timing import SETTLE_S


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of argparse's usage dump
        print(f"hotrod: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args) or 0
    except HotrodError as exc:
        print(f"hotrod: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a full disk, a permission denied: the system's one line, not a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"hotrod: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("hotrod: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hotrod", description="Hugging Face transformers at real-time latency.")
    from hotrod.version import __version__

    parser.add_argument("--version", action="version", version=f"hotrod {__version__}")
    sub = parser.add_subparsers(parser_class=_Parser, metavar="COMMAND")

    p = sub.add_parser("optimize", help="export and optimize a checkpoint into an artifact directory")
    p.add_argument("source", help="local Hugging Face checkpoint directory or hub id")
    p.add_argument("--out", required=True, help="artifact directory to write")
    p.add_argument("--precision", default="fp32", choices=(*BUILT_PRECISIONS, AUTO),
                   help="auto: build every candidate, keep the fastest within --max-drop; with --backend torch: "
                        f"{', '.join(ENGINE_PRECISIONS)} or auto")
    p.add_argument("--backend", default="onnxruntime", choices=BACKENDS,
                   help="onnxruntime: ONNX graphs; torch: the static engine's weights (fp16 with measured fp32 islands)")
    p.add_argument("--device", default="cpu", choices=DEVICES, help="the device it is built for and loads on")
    p.add_argument("--force", action="store_true", help="replace an existing --out directory whole")
    p.add_argument("--no-fusion", dest="fusion", action="store_false", help="skip kernel fusion")
    p.add_argument("--task", default=None, choices=tasks.names(),
                   help="the head to build (default: the one the checkpoint's architectures name)")
    p.add_argument("--calibration", metavar="FILE", help="calibration texts, one per line (default: built-in set)")
    p.add_argument("--calibration-method", default="minmax", choices=CALIBRATION_METHODS)
    p.add_argument("--max-drop", type=float, default=0.01,
                   help="with --precision auto: the largest score drop below the source's to accept")
    p.add_argument("--verify-texts", metavar="FILE", help="examples to verify on, in the task's format: "
                   "input[<TAB>target], text<TAB>label, query<TAB>document<TAB>score, question<TAB>context<TAB>answer, "
                   "or plain texts (token-classification)")
    p.add_argument("--verify-examples", type=int, default=32, help="how many examples to verify on (0: skip)")
    p.set_defaults(handler=_optimize)

    p = sub.add_parser("verify", help="compare an artifact's outputs with its source model's")
    p.add_argument("artifact")
    p.add_argument("--against", metavar="SOURCE", help="checkpoint or hub id (default: the recorded source)")
    p.add_argument("--texts", metavar="FILE", help="examples in the task's format, as optimize's --verify-texts "
                   "(default: built-in)")
    p.add_argument("--examples", type=int, default=100, help="how many examples to use")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(handler=_verify)

    p = sub.add_parser("generate", help="generate text with an artifact (or a checkpoint)")
    p.add_argument("model", help="artifact directory, checkpoint directory or hub id")
    p.add_argument("prompts", nargs="+", metavar="PROMPT")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--min-new-tokens", type=int, default=None)
    p.add_argument("--num-beams", type=int, default=None)
    p.add_argument("--num-return-sequences", type=int, default=None)
    p.add_argument("--do-sample", action="store_true", default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--seed", type=int, default=None, help="seed torch's generator, for reproducible sampling")
    p.add_argument("--target-language", metavar="CODE", help="a language of the tokenizer (fr_XX, fr, fra_Latn)")
    p.add_argument("--forced-bos-token-id", type=int, metavar="N", help="the token generated first (default: the model's)")
    p.add_argument("--prompt-lookup", type=int, default=None, metavar="N", dest="prompt_lookup_num_tokens",
                   help="draft up to N tokens a pass from the text so far (greedy, one prompt; the same tokens)")
    p.add_argument("--assistant", metavar="MODEL", default=None,
                   help="draft with this smaller model of the same kind and vocabulary, loaded as the model is "
                        "(one prompt; greedy: the same tokens)")
    p.add_argument("--assistant-tokens", type=int, default=None, metavar="N", dest="num_assistant_tokens",
                   help="the assistant's first draft length (default 5; then longer after a draft kept whole, "
                        "shorter after one that is not)")
    p.add_argument("--ids", action="store_true", help="prompts are space-separated token ids; print ids")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of text lines")
    _runtime_args(p)
    p.set_defaults(handler=_generate)

    p = sub.add_parser("embed", help="sentence embeddings as JSON")
    p.add_argument("model", help="artifact directory, checkpoint directory or hub id")
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--pooling", choices=("mean", "cls"), help="default: the checkpoint's own")
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction, help="default: the checkpoint's own")
    for flag, value in (("--prompt-name", str), ("--prompt", str), ("--truncate-dim", int)):
        p.add_argument(flag, type=value, help="as SentenceTransformer.encode's")
    p.add_argument("--ids", action="store_true", help="texts are space-separated token ids")
    _runtime_args(p)
    p.set_defaults(handler=_embed)

    _task_commands(sub)

    p = sub.add_parser("info", help="describe an artifact")
    p.add_argument("artifact")
    p.add_argument("--json", action="store_true", help="print the whole manifest")
    p.set_defaults(handler=_info)

    p = sub.add_parser("bench", help="time hotrod against PyTorch (and installed peers) against the hardware floor")
    p.add_argument("source", nargs="?", help="checkpoint or hub id for a batch x sequence sweep")
    p.add_argument("--workload", type=_names, default=None, help="comma-separated workload ids (W1-W4, W6, W7, W10, W11); need no model")
    p.add_argument("--batch", type=_ints, default=None, help="comma-separated batch sizes for the sweep (default 1)")
    p.add_argument("--seq", type=_ints, default=None, help="comma-separated prompt lengths for the sweep (default 32)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens to generate per case of a language model's "
                   "sweep (default 32)")
    p.add_argument("--precision", type=_names, default="fp32", help="comma-separated hotrod precisions to time")
    p.add_argument("--peers", type=_names, default="torch", help="comma-separated peers beside PyTorch eager: torch "
                   "(torch.compile), ctranslate2, llamacpp, openvino (in the environment HOTROD_OPENVINO_PYTHON "
                   "names), optimum (needs an environment of its own: reported as skipped)")
    p.add_argument("--device", default="cpu", choices=DEVICES)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--settle", type=float, default=SETTLE_S, metavar="S", help="idle seconds before each timed run, "
                   "so that one system's spinning threads are not timed in the next (0: back to back)")
    p.add_argument("--threads", type=int, default=0, help="threads for every system (default: all cores)")
    p.add_argument("--out", default="bench-results", help="folder for results.json, report.md and charts")
    p.set_defaults(handler=_bench)


    from hotrod.cli.measure import add_measure_parsers
    from hotrod.serve.command import add_serve_parser

    add_measure_parsers(sub)
    add_serve_parser(sub, _runtime_args)

    p = sub.add_parser("demo", help="optimize the built-in models for this machine, verify them, time them "
                                    "against PyTorch and write a report")
    p.add_argument("--models", type=_names, default=None, help="comma-separated demo model names (default: all)")
    p.add_argument("--runs", type=int, default=3, help="timed runs per system (medians are reported)")
    p.add_argument("--max-drop", type=float, default=0.01, help="accuracy budget for --precision auto")
    p.add_argument("--out", default=None, help="where to keep the demo's artifacts and report")
    p.set_defaults(handler=_demo)
    return parser


def _runtime_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default=None, choices=BACKENDS,
                   help="default: the artifact's (onnxruntime for a checkpoint)")
    p.add_argument("--device", default=None, choices=DEVICES)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    p.add_argument("--engine-precision", default=None, choices=ENGINE_PRECISIONS,
                   help="weights of the torch backend's static engine (on a GPU; default fp32)")


def _load(args, source: str | None = None):
    """The command's model (or `source`, with the same runtime options)."""
    import hotrod

    return hotrod.load(source or args.model, backend=args.backend, device=args.device, threads=args.threads,
                       precision=args.engine_precision)


def _optimize(args) -> int:
    import hotrod
    from hotrod.cli.describe import figures_line
    from hotrod.options import OptimizeOptions

    options = OptimizeOptions(precision=args.precision, backend=args.backend, device=args.device, fusion=args.fusion,
                              calibration=args.calibration, calibration_method=args.calibration_method,
                              verify_texts=args.verify_texts, verify_examples=args.verify_examples,
                              max_drop=args.max_drop, force=args.force, task=args.task)
    out = hotrod.optimize(args.source, args.out, options)
    manifest = json.loads((out / "manifest.json").read_text())
    if manifest.get("auto"):
        from hotrod.build.auto import format_table

        print(format_table(manifest["auto"]["candidates"]), file=sys.stderr)
    if manifest.get("verification"):
        print(figures_line(manifest["verification"]), file=sys.stderr)
    print(out)
    return 0


def _verify(args) -> int:
    import hotrod

    figures = hotrod.verify(args.artifact, against=args.against, texts=args.texts, examples=args.examples,
                            max_new_tokens=args.max_new_tokens, threads=args.threads)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    width = max(map(len, figures))
    for key, value in figures.items():
        print(f"{key:<{width}}  {value:.6g}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    return 0


def _parse_ids(texts: Sequence[str]) -> list[list[int]]:
    """Token id rows; an id no tensor can hold is refused here (the model refuses ids outside its vocabulary)."""
    rows = []
    for text in texts:
        try:
            rows.append([int(tok) for tok in text.split()])
        except ValueError:
            raise HotrodError(f"--ids expects space-separated integers, got {text!r}") from None
        if not rows[-1]:
            raise HotrodError("empty prompt")
        bad = next((i for i in rows[-1] if not -(2**63) <= i < 2**63), None)
        if bad is not None:
            raise HotrodError(f"token id {bad} is outside the vocabulary")
    return rows


def _generate(args) -> int:
    import torch

    if any(not p.strip() for p in args.prompts):
        raise HotrodError("empty prompt")
    if args.seed is not None and not -2**63 <= args.seed < 2**64:  # torch's seeds
        raise HotrodError(f"--seed must be in [-2**63, 2**64 - 1], got {args.seed}")
    model = _load(args)
    kwargs = {k: getattr(args, k) for k in ("max_new_tokens", "min_new_tokens", "num_beams", "num_return_sequences",
                                            "do_sample", "temperature", "top_k", "top_p", "repetition_penalty",
                                            "prompt_lookup_num_tokens", "num_assistant_tokens", "target_language",
                                            "forced_bos_token_id")}
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    if args.assistant is not None:
        kwargs["assistant_model"] = _load(args, args.assistant)
    from hotrod.generation import config as gen_config
    from hotrod.model_inputs import padded_batch

    told = [flag for flag, name in SAMPLING_FLAGS.items() if getattr(args, name) is not None]
    # do_sample as generate() resolves it: a checkpoint's generation config may sample by default
    asked = {} if args.do_sample is None else {"do_sample": args.do_sample}
    if told and not gen_config.merge(model.generation_config, None, asked)["do_sample"]:
        raise HotrodError(f"{told[0]} applies only when sampling: add --do-sample")
    if args.seed is not None:
        torch.manual_seed(args.seed)
    if args.ids:
        rows = _parse_ids(args.prompts)
        ids, mask = padded_batch(rows, left=model.spec.pads_left)
        out = model.generate(ids, attention_mask=mask, **kwargs)
        results = [{"prompt": p, "token_ids": row} for p, row in zip(_repeat(args.prompts, out), out.tolist())]
    else:
        batch = _tokenize(model, args.prompts)
        out = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], **kwargs)
        texts = model.tokenizer.batch_decode(out, skip_special_tokens=True)
        results = [{"prompt": p, "text": t, "token_ids": row}
                   for p, t, row in zip(_repeat(args.prompts, out), texts, out.tolist())]
    if args.json:
        print(json.dumps(results))
    else:
        for result in results:
            print(result["text"] if "text" in result else " ".join(map(str, result["token_ids"])))
    return 0


def _repeat(prompts: Sequence[str], out) -> list[str]:
    per_prompt = out.shape[0] // len(prompts)
    return [p for p in prompts for _ in range(per_prompt)]


# Options that only a sampled draw reads: given without --do-sample, they would change nothing.
SAMPLING_FLAGS = {"--temperature": "temperature", "--top-k": "top_k", "--top-p": "top_p", "--seed": "seed"}


def _tokenize(model, prompts: Sequence[str]):
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise HotrodError("this model has no tokenizer; pass token ids with --ids")
    if model.spec.pads_left:
        tokenizer.padding_side = "left"  # decoder-only prompts are left-padded, as transformers expects
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer(list(prompts), return_tensors="pt", padding=True)


def _embed(args) -> int:
    model = _load(args)
    inputs = _parse_ids(args.texts) if args.ids else list(args.texts)
    vectors = model.embed(inputs, args.pooling, args.normalize, prompt_name=args.prompt_name, prompt=args.prompt, truncate_dim=args.truncate_dim)
    print(json.dumps({**model.embedding_settings(args.pooling, args.normalize, args.truncate_dim), "dim": vectors.shape[1], "embeddings": vectors.tolist()}))
    return 0


def _task_commands(sub) -> None:
    """One subcommand per task that has one (`hotrod.tasks.TaskSpec.command`): classify, rerank, tag, answer."""
    for spec in tasks.all_specs():
        command = spec.command
        if command is None:
            continue
        p = sub.add_parser(command.name, help=command.help)
        p.add_argument("model", help="artifact directory, checkpoint directory or hub id")
        command.arguments(p)
        if command.truncate:
            p.add_argument("--truncate", action="store_true",
                           help="cut inputs longer than the model takes (its positions, or the tokenizer's "
                                "model_max_length where the reference cuts there)")
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        _runtime_args(p)
        p.set_defaults(handler=functools.partial(_run_task, command))


def _run_task(command, args) -> int:
    result = command.call(_load(args), args)
    if args.json:
        print(json.dumps(result))
        return 0
    for line in command.show(args, result):
        print(line)
    return 0


def _info(args) -> int:
    from hotrod.cli.describe import describe

    describe(args.artifact, args.json)
    return 0


def _bench(args) -> int:
    import torch

    from hotrod.bench import harness
    from hotrod.bench.report import write_report
    from hotrod.runtime.base import cpu_threads

    harness.check_device(args.device)
    if bool(args.workload) == bool(args.source):
        raise HotrodError("give either a model to sweep or --workload W1,..., not both or neither")
    harness.check_options(args.precision, args.peers, args.runs, args.device, args.settle)  # before any build
    out = harness.check_out(args.out)
    if args.workload:
        given = [flag for flag, value in (("--batch", args.batch), ("--seq", args.seq),
                                          ("--new-tokens", args.new_tokens)) if value is not None]
        if given:
            raise HotrodError(f"{given[0]} applies to a model's sweep; a workload has its own shapes")
        cases = harness.workload_cases(args.workload)
    else:
        cases = harness.sweep_cases(args.source, args.batch or [1], args.seq or [32], args.new_tokens)
    threads = cpu_threads(args.threads)
    torch.set_num_threads(threads)
    results = harness.run(cases, args.precision, args.peers, args.runs, threads, out, device=args.device,
                          settle=args.settle)
    report = write_report(results, out)
    print(report.read_text())
    print(f"report: {report}")
    return 0


def _names(text: str) -> list[str]:
    """argparse type: a comma-separated list, none of it empty (argparse names the option on error)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expects a comma-separated list, got an empty one")
    return names


def _ints(text: str) -> list[int]:
    """argparse type: comma-separated integers."""
    try:
        return [int(n) for n in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects comma-separated integers, got {text!r}") from None


def _demo(args) -> int:
    from hotrod.demo.run import run_demo

    run_demo(args.models, runs=args.runs, out=args.out, max_drop=args.max_drop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
