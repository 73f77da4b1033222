#!/usr/bin/env bash
# Everything on one CUDA GPU, written to one folder:
#   1. G1-G5 on the static engine (benchmarks/gpu_engine.py): results.json, report.md, summary.json;
#   2. W1-W4 through `hotrod bench --device cuda` (onnxruntime's GPU providers, where that onnxruntime
#      has them) beside PyTorch eager, torch.compile and CTranslate2: OUT/onnxruntime/.
#
#   bash benchmarks/gpu.sh [OUT]        (OUT defaults to benchmarks/results/gpu)
#
# It runs from the source tree without installing it (PYTHONPATH=src), with whatever the machine has:
# a peer that is not installed, or a precision the device cannot run, is reported as skipped with its
# reason. The run stops after LIMIT_S seconds and keeps every case it finished (the report is rebuilt
# from results.json). Settings, by environment: PYTHON, WORKLOADS, PRECISIONS, PEERS, RUNS, LIMIT_S,
# HOTROD_CACHE (where checkpoints, artifacts and conversions are kept between runs).
set -euo pipefail
cd "$(dirname "$0")/.."

out="${1:-benchmarks/results/gpu}"
python="${PYTHON:-python}"
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export HOTROD_CACHE="${HOTROD_CACHE:-${TMPDIR:-/tmp}/hotrod-gpu-cache}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    "$python" - <<'EOF'
import importlib
import platform

print("python", platform.python_version())
for name in ("torch", "transformers", "onnxruntime", "onnx", "ctranslate2", "triton", "matplotlib"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:  # what is missing is part of the record
        print(name, "unavailable:", type(exc).__name__)
import torch

print("torch cuda", torch.version.cuda, "available:", torch.cuda.is_available())
try:
    import onnxruntime

    print("onnxruntime providers", ", ".join(onnxruntime.get_available_providers()))
except ImportError:
    pass
EOF
} > "$out/environment.txt" 2>&1
cat "$out/environment.txt"

status=0
timeout --signal=INT --kill-after=30 "${ENGINE_LIMIT_S:-450}" \
    "$python" benchmarks/gpu_engine.py --out "$out" --workloads "${GPU_WORKLOADS:-G1,G2,G3,G4,G5}" \
    --precision "${ENGINE_PRECISION:-bf16}" ${ENGINE_FLAGS:-} 2>&1 | tee "$out/engine.log" || status=$?

if ! "$python" -c "import onnxruntime, sys; sys.exit('CUDAExecutionProvider' not in onnxruntime.get_available_providers())"; then
    echo "onnxruntime here has no CUDA provider: W1-W4 on onnxruntime skipped" | tee "$out/onnxruntime-skipped.txt"
    exit "$status"
fi
out="$out/onnxruntime"
mkdir -p "$out"
timeout --signal=INT --kill-after=30 "${LIMIT_S:-450}" \
    "$python" -m hotrod.cli bench --workload "${WORKLOADS:-W1,W2,W3,W4}" --device cuda \
    --precision "${PRECISIONS:-fp32,fp16}" --peers "${PEERS:-torch,ctranslate2}" --runs "${RUNS:-5}" \
    --out "$out" 2>&1 | tee "$out/bench.log" || status=$?

if [ "$status" -ne 0 ] && [ -f "$out/results.json" ]; then
    # Stopped early (the time limit, or an error in a later case): report the cases that finished.
    "$python" - "$out" <<'EOF' 2>&1 | tee -a "$out/bench.log"
import json
import sys
from pathlib import Path

from hotrod.bench.harness import Result
from hotrod.bench.report import write_report

out = Path(sys.argv[1])
results = [Result(**r) for r in json.loads((out / "results.json").read_text())["results"]]
print(f"stopped early; the report covers the {len(results)} case(s) that finished: {write_report(results, out)}")
EOF
fi
echo "results in $out (exit status $status)"
exit "$status"
