"""What `hotrod info` prints of an artifact, and the one line of verification figures `optimize` and `info`
show: the graphs, their fusions, the static engine's weights, the verification and auto's table."""

from __future__ import annotations

import json
from pathlib import Path

from hotrod import tasks


def figures_line(figures: dict) -> str:
    """The score and each figure the task measures show (`Measure.shown`), in one line."""
    shown = [f"{figures['score_name']} {figures['score']:.4f}"]
    keys = dict.fromkeys(key for spec in tasks.all_specs() if spec.measure for key in spec.measure.shown)
    for key in keys:
        if key in figures:
            shown.append(f"{key} {figures[key]:.4g}")
    return f"verified on {figures['examples']} examples against {figures['against']}: " + ", ".join(shown)


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


def describe(path: str, as_json: bool = False) -> None:
    from hotrod.artifact import open_artifact

    manifest = open_artifact(path).manifest
    if as_json:
        print(json.dumps(manifest, indent=2))
        return
    source = manifest["source"]
    print(f"artifact    {Path(path).resolve()}")
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
        print("\n".join(_fusion_lines(manifest, graph, Path(path) / graph["file"])))
    if manifest.get("engine"):
        print("\n".join(_engine_lines(manifest["engine"], Path(path))))
    if manifest.get("sentence_transformers"):
        print("embedding   " + embedding_line(manifest["sentence_transformers"]))
    if "weights" in manifest:
        print("weights     " + ", ".join(f"{k}: {v}" for k, v in manifest["weights"].items()))
    verification = manifest.get("verification")
    print("verified    " + (figures_line(verification) if verification else "no (run `hotrod verify`)"))
    if manifest.get("auto"):
        from hotrod.build.auto import format_table

        section = manifest["auto"]
        print(f"auto        kept {section['chosen']}: fastest whose {section.get('score') or 'score'} "
              f"drops at most {section['max_drop']} below the source's")
        print(format_table(manifest["auto"]["candidates"]))


def embedding_line(section: dict) -> str:
    """A sentence-transformers checkpoint's embedding (the manifest's "sentence_transformers" section,
    `hotrod.pipelines.sentence`) in one line: its modules in order, its limits and its prompts."""
    parts = []
    for step in section.get("modules", []):
        if step.get("type") == "pooling":
            excluded = "" if step.get("include_prompt", True) else " (prompt excluded)"
            parts.append("+".join(step.get("modes", [])) + " pooling" + excluded)
        elif step.get("type") == "dense":
            activation = str(step.get("activation", "")).rpartition(".")[2].lower()
            parts.append(f"Dense {step.get('in_features')}->{step.get('out_features')} {activation}"
                         + (" residual" if step.get("use_residual") else ""))
        elif step.get("type") == "splade":  # a SparseEncoder's SpladePooling (`hotrod.pipelines.splade`)
            top = step.get("max_active_dims")
            parts.append(f"SPLADE {step.get('pooling_strategy')} pooling, {step.get('activation_function')}"
                         + (f", {top} active dims" if top else ""))
        else:
            parts.append("normalize")
    if section.get("max_seq_length"):
        parts.append(f"max {section['max_seq_length']} tokens")
    if section.get("do_lower_case"):
        parts.append("lowercased")
    line = ", ".join(parts)
    prompts = [name for name, text in (section.get("prompts") or {}).items() if text]
    if prompts:
        default = section.get("default_prompt_name")
        line += "; prompts: " + ", ".join(prompts) + (f" (default {default})" if default else "")
    return line


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


