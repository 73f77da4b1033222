"""The `hotrod` command: a thin layer over the Python API.

Every error a user can cause ends as one line, `hotrod: error: ...`, and exit status 1 (2 for a
malformed command line), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from hotrod.errors import HotrodError
from hotrod.options import AUTO, BACKENDS, BUILT_PRECISIONS, CALIBRATION_METHODS, DEVICES, ENGINE_PRECISIONS
from hotrod.tasks import TASKS


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
    p.add_argument("--task", default=None, choices=TASKS,
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
    p.add_argument("--pooling", default="mean", choices=("mean", "cls"))
    p.add_argument("--normalize", action="store_true")
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
    p.add_argument("--workload", type=_names, default=None, help="comma-separated workload ids (W1-W4, W6, W7); need no model")
    p.add_argument("--batch", type=_ints, default="1", help="comma-separated batch sizes for the sweep")
    p.add_argument("--seq", type=_ints, default="32", help="comma-separated prompt lengths for the sweep")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens to generate per case (language models)")
    p.add_argument("--precision", type=_names, default="fp32", help="comma-separated hotrod precisions to time")
    p.add_argument("--peers", type=_names, default="torch", help="comma-separated peers beside PyTorch eager: torch "
                   "(torch.compile), ctranslate2, llamacpp, openvino (in the environment HOTROD_OPENVINO_PYTHON "
                   "names), optimum (needs an environment of its own: reported as skipped)")
    p.add_argument("--device", default="cpu", choices=DEVICES)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="threads for every system (default: all cores)")
    p.add_argument("--out", default="bench-results", help="folder for results.json, report.md and charts")
    p.set_defaults(handler=_bench)

    p = sub.add_parser("profile", help="time an artifact operator by operator, against each graph's floor")
    p.add_argument("artifact")
    p.add_argument("--batch", type=int, default=1, help="rows of seeded token ids")
    p.add_argument("--length", type=int, default=32, help="tokens a row (the prompt, for language models)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per run (language models)")
    p.add_argument("--runs", type=int, default=3, help="profiled runs after a warm-up")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    p.add_argument("--top", type=int, default=12, help="operators listed per graph")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures to FILE")
    p.set_defaults(handler=_profile)

    from hotrod.serve.command import add_serve_parser

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
    from hotrod.options import OptimizeOptions

    options = OptimizeOptions(precision=args.precision, backend=args.backend, device=args.device, fusion=args.fusion,
                              calibration=args.calibration, calibration_method=args.calibration_method,
                              verify_texts=args.verify_texts, verify_examples=args.verify_examples,
                              max_drop=args.max_drop, force=args.force, task=args.task)
    out = hotrod.optimize(args.source, args.out, options)
    manifest = json.loads((out / "manifest.json").read_text())
    if manifest.get("auto"):
        from hotrod.auto import format_table

        print(format_table(manifest["auto"]["candidates"]), file=sys.stderr)
    if manifest.get("verification"):
        print(_figures_line(manifest["verification"]), file=sys.stderr)
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


# The task figures shown beside the score (`hotrod.verification`): agreement with the source's answers,
# score differences, and the examples' own targets where they were given.
TASK_FIGURES = ("label_agreement", "rank_agreement", "top1_agreement", "entity_f1", "answer_exact_match",
                "answer_f1", "score_mean_abs", "target_accuracy", "target_rank_agreement", "target_f1")


def _figures_line(figures: dict) -> str:
    shown = [f"{figures['score_name']} {figures['score']:.4f}"]
    for key in ("logits_max_abs", "logits_cosine", "token_agreement", "embedding_cosine", "hidden_max_abs",
                *TASK_FIGURES):
        if key in figures:
            shown.append(f"{key} {figures[key]:.4g}")
    return f"verified on {figures['examples']} examples against {figures['against']}: " + ", ".join(shown)


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
    model = _load(args)
    kwargs = {k: getattr(args, k) for k in ("max_new_tokens", "min_new_tokens", "num_beams", "num_return_sequences",
                                            "do_sample", "temperature", "top_k", "top_p", "repetition_penalty",
                                            "prompt_lookup_num_tokens", "num_assistant_tokens")}
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    if args.assistant is not None:
        kwargs["assistant_model"] = _load(args, args.assistant)
    if args.seed is not None:
        torch.manual_seed(args.seed)
    if args.ids:
        rows = _parse_ids(args.prompts)
        width = max(map(len, rows))
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
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
    vectors = model.embed(inputs, pooling=args.pooling, normalize=args.normalize)
    print(json.dumps({"pooling": args.pooling, "normalized": args.normalize, "dim": vectors.shape[1],
                      "embeddings": vectors.tolist()}))
    return 0


def _fusion_lines(manifest: dict, graph: dict, path: Path) -> list[str]:
    """What the graph still runs as separate ops where a fusion did not match (`fusion.UNFUSED_MARKERS`),
    and for an encoder the fusions its layers need against those found (`hotrod.optimize.audit`)."""
    import onnx

    from hotrod.kinds import spec as kind_spec
    from hotrod.optimize.audit import encoder_tallies, tally_line
    from hotrod.optimize.fusion import UNFUSED_MARKERS, unfused_op_counts

    left = unfused_op_counts(onnx.load(str(path), load_external_data=False))
    lines = ["  unfused   " + (", ".join(f"{op} x{n} ({UNFUSED_MARKERS[op]})" for op, n in left.items()) or "nothing")]
    if not kind_spec(manifest["kind"]).generates:  # an encoder: its layers' fusions, found against needed
        layers, device = manifest["dims"]["num_layers"], manifest["options"]["device"]
        tallies = encoder_tallies(graph.get("fused_ops") or {}, left, layers, device)
        lines.append("  layers    " + tally_line(tallies, layers, device))
    return lines


def _task_commands(sub) -> None:
    """classify, rerank, tag and answer: the encoder heads' task methods (`hotrod.pipelines`)."""
    p = sub.add_parser("classify", help="labels of texts (or text pairs) from a text-classification model")
    p.add_argument("model", help="artifact directory, checkpoint directory or hub id")
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--pair", action="append", metavar="TEXT", help="the second text of a pair, once per TEXT")
    p.add_argument("--top-k", type=_top, default=1, help="labels per input, best first; all: every label")
    p.add_argument("--function", default=None, choices=("softmax", "sigmoid", "none"),
                   help="applied to the logits (default: the pipeline's choice for the head)")
    _task_args(p, _classify, truncate=True)

    p = sub.add_parser("rerank", help="documents by a cross-encoder's relevance to a query, best first")
    p.add_argument("model", help="artifact directory, checkpoint directory or hub id")
    p.add_argument("documents", nargs="+", metavar="DOC")
    p.add_argument("--query", required=True)
    p.add_argument("--top-n", type=int, default=None, help="the best N only")
    _task_args(p, _rerank, truncate=True)

    p = sub.add_parser("tag", help="entities of texts from a token-classification (NER) model")
    p.add_argument("model", help="artifact directory, checkpoint directory or hub id")
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--aggregation", default="simple", choices=("none", "simple", "first", "average", "max"))
    _task_args(p, _tag, truncate=True)

    p = sub.add_parser("answer", help="the answer to a question, taken from a context (extractive QA)")
    p.add_argument("model", help="artifact directory, checkpoint directory or hub id")
    p.add_argument("--question", required=True)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--context")
    source.add_argument("--context-file", metavar="FILE", help="read the context from FILE (UTF-8)")
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--max-answer-len", type=int, default=15, help="tokens")
    p.add_argument("--max-seq-len", type=int, default=None, help="tokens a window (default 384, or the model's)")
    p.add_argument("--doc-stride", type=int, default=None, help="tokens windows share (default 128)")
    p.add_argument("--impossible", action="store_true", help="allow the answer that the context has none")
    p.add_argument("--no-align-to-words", dest="align_to_words", action="store_false",
                   help="answer the tokens' own characters, not their whole words")
    _task_args(p, _answer)


def _task_args(p: argparse.ArgumentParser, handler, truncate: bool = False) -> None:
    if truncate:
        p.add_argument("--truncate", action="store_true", help="cut inputs longer than the model's positions")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    _runtime_args(p)
    p.set_defaults(handler=handler)


def _top(value: str) -> int | None:
    if value == "all":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or all, got {value!r}") from None


def _classify(args) -> int:
    model = _load(args)
    if args.pair is not None and len(args.pair) != len(args.texts):
        raise HotrodError(f"--pair was given {len(args.pair)} times for {len(args.texts)} texts; give one per text")
    inputs = list(zip(args.texts, args.pair)) if args.pair else list(args.texts)
    results = model.classify(inputs, top_k=args.top_k, function_to_apply=args.function, truncate=args.truncate)
    if args.json:
        print(json.dumps(results))
        return 0
    for text, result in zip(args.texts, results):
        labels = result if isinstance(result, list) else [result]
        print("  ".join(f"{r['label']} {r['score']:.4f}" for r in labels) + f"\t{text}")
    return 0


def _rerank(args) -> int:
    ranked = _load(args).rerank(args.query, args.documents, top_n=args.top_n, truncate=args.truncate)
    if args.json:
        print(json.dumps(ranked))
        return 0
    for entry in ranked:
        print(f"{entry['score']:.4f}\t[{entry['index']}] {args.documents[entry['index']]}")
    return 0


def _tag(args) -> int:
    results = _load(args).tag(list(args.texts), aggregation_strategy=args.aggregation, truncate=args.truncate)
    if args.json:
        print(json.dumps(results))
        return 0
    for text, entities in zip(args.texts, results):
        print(text)
        for e in entities:
            label = e.get("entity_group") or e.get("entity")
            if e["start"] is None:  # a slow tokenizer: no characters, the tokens' own text
                print(f"  {label:<10} {e['score']:.4f}  -  {e['word']}")
            else:
                print(f"  {label:<10} {e['score']:.4f}  {e['start']}-{e['end']}  {text[e['start']:e['end']]}")
    return 0


def _answer(args) -> int:
    context = args.context if args.context is not None else _read_text(args.context_file)
    result = _load(args).answer(args.question, context, top_k=args.top_k, max_answer_len=args.max_answer_len,
                                max_seq_len=args.max_seq_len, doc_stride=args.doc_stride,
                                handle_impossible_answer=args.impossible, align_to_words=args.align_to_words)
    if args.json:
        print(json.dumps(result))
        return 0
    for a in result if isinstance(result, list) else [result]:
        print(f"{a['score']:.4f}\t{a['start']}-{a['end']}\t{a['answer']}")
    return 0


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise HotrodError(f"{path} is not UTF-8 text") from None


def _info(args) -> int:
    from hotrod.artifact import open_artifact

    manifest = open_artifact(args.artifact).manifest
    if args.json:
        print(json.dumps(manifest, indent=2))
        return 0
    source = manifest["source"]
    print(f"artifact    {Path(args.artifact).resolve()}")
    print(f"made by     hotrod {manifest['hotrod_version']} on {manifest['created']}")
    print(f"source      {source['origin']} (weights sha256 {source['weights_sha256'][:16]}...)")
    print(f"model       {manifest['model_type']} ({manifest['family']} family, {manifest['kind']})")
    print("dims        " + ", ".join(f"{k}={v}" for k, v in manifest["dims"].items() if v))
    if manifest.get("task"):
        labels = manifest.get("labels") or {}
        labels = [labels[k] for k in sorted(labels, key=int)] if isinstance(labels, dict) else labels
        print(f"task        {manifest['task']}" + (f" (labels: {', '.join(map(str, labels))})" if labels else ""))
    print("options     " + ", ".join(f"{k}={v}" for k, v in manifest["options"].items()))
    print("versions    " + ", ".join(f"{k} {v}" for k, v in manifest["versions"].items()))
    for name, graph in manifest["graphs"].items():
        size = graph["bytes"] + (graph["external_data"]["bytes"] if graph.get("external_data") else 0)
        ins = ", ".join(i["name"] for i in graph["inputs"] if "past_key_values" not in i["name"] and "cross" not in i["name"])
        print(f"graph       {name:<13} {size / 1e6:8.1f} MB  inputs: {ins}{_cache_note(graph)}")
        fused = graph.get("fused_ops") or {}
        print("  fused     " + (", ".join(f"{op} x{n}" for op, n in fused.items()) or "none"))
        print("\n".join(_fusion_lines(manifest, graph, Path(args.artifact) / graph["file"])))
    if manifest.get("engine"):
        print("\n".join(_engine_lines(manifest["engine"], Path(args.artifact))))
    if "weights" in manifest:
        print("weights     " + ", ".join(f"{k}: {v}" for k, v in manifest["weights"].items()))
    verification = manifest.get("verification")
    print("verified    " + (_figures_line(verification) if verification else "no (run `hotrod verify`)"))
    if manifest.get("auto"):
        from hotrod.auto import format_table

        section = manifest["auto"]
        print(f"auto        kept {section['chosen']}: fastest whose {section.get('score') or 'score'} "
              f"drops at most {section['max_drop']} below the source's")
        print(format_table(manifest["auto"]["candidates"]))
    return 0


def _engine_lines(section: dict, path: Path) -> list[str]:
    """A torch engine artifact's weights and fp16's fp32 islands."""
    size = (path / section["weights"]).stat().st_size
    islands = section.get("islands") or []
    return [f"engine      torch static engine, {section['precision']} weights: {section['weights']} "
            f"{size / 1e6:8.1f} MB",
            "islands     " + (", ".join(islands) + " (kept in fp32)" if islands else "none")]


def _cache_note(graph: dict) -> str:
    caches = sum(1 for i in graph["inputs"] if "past_key_values" in i["name"] or "cross" in i["name"])
    return f" + {caches} cache tensors" if caches else ""


def _bench(args) -> int:
    import torch

    from hotrod.bench import harness
    from hotrod.bench.report import write_report
    from hotrod.runtime.base import cpu_threads

    harness.check_device(args.device)
    if bool(args.workload) == bool(args.source):
        raise HotrodError("give either a model to sweep or --workload W1,..., not both or neither")
    harness.check_options(args.precision, args.peers, args.runs, args.device)  # before any checkpoint is built
    if args.workload:
        cases = harness.workload_cases(args.workload)
    else:
        cases = harness.sweep_cases(args.source, args.batch, args.seq, args.new_tokens)
    threads = cpu_threads(args.threads)
    torch.set_num_threads(threads)
    out = Path(args.out)
    results = harness.run(cases, args.precision, args.peers, args.runs, threads, out, device=args.device)
    report = write_report(results, out)
    print(report.read_text())
    print(f"report: {report}")
    return 0


def _profile(args) -> int:
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
    from hotrod.demo import run_demo

    run_demo(args.models, runs=args.runs, out=args.out, max_drop=args.max_drop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
