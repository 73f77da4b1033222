#!/usr/bin/env bash
# Everything on one CUDA GPU, written to one folder (OUT, default benchmarks/results/gpu), stage by stage:
#   env       OUT/environment.txt: the device, driver and library versions;
#   tests     OUT/tests.log: the CUDA tests (CUDA graphs against eager fp32, the parity table on backend
#             "cuda": fp32 tokens against transformers', fp8 kernels);
#   engine    OUT/<variant>/: G1-G5 on the static engine (benchmarks/gpu_engine.py) for each variant of
#             VARIANTS, a precision with "+compile" where each graph is compiled first (results.json,
#             report.md, summary.json);
#   profile   OUT/profile/: kernels against wall time and the host's Python per workload, for each
#             precision of PROFILE_PRECISIONS (benchmarks/gpu_profile.py);
#   serve     OUT/serve/: G6, W5's GPT-2 built for cuda (`hotrod optimize --device cuda --precision
#             SERVE_PRECISION`, auto by default) and served by `hotrod serve` to 64 clients, continuous
#             batching against one request at a time (benchmarks/serve_load.py);
#   onnxruntime  OUT/onnxruntime/: W1-W4 through `hotrod bench --device cuda` beside PyTorch eager,
#             torch.compile and CTranslate2, where this onnxruntime has its CUDA provider.
#
#   bash benchmarks/gpu.sh [OUT]
#
# It runs from the source tree without installing it (PYTHONPATH=src), with whatever the machine has:
# a peer that is not installed, or a precision the device cannot run, is reported as skipped with its
# reason. Each stage stops after its own limit and keeps what it finished (the engine writes its results
# after each workload). Settings, by environment: PYTHON, STAGES, VARIANTS, GPU_WORKLOADS, ENGINE_PEERS,
# ENGINE_RUNS, PROFILE_PRECISIONS, SERVE_PRECISION, SERVE_REQUESTS, WORKLOADS, PRECISIONS, PEERS, RUNS, the
# limits TESTS_LIMIT_S, ENGINE_LIMIT_S (per variant), PROFILE_LIMIT_S, SERVE_LIMIT_S, LIMIT_S (onnxruntime),
# and HOTROD_CACHE
# (where checkpoints, artifacts and conversions are kept between runs).
set -uo pipefail
cd "$(dirname "$0")/.."

out="${1:-benchmarks/results/gpu}"
python="${PYTHON:-python}"
stages=" ${STAGES:-env tests engine profile serve onnxruntime} "
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export HOTROD_CACHE="${HOTROD_CACHE:-${TMPDIR:-/tmp}/hotrod-gpu-cache}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
status=0

limited() {  # limited SECONDS LOG COMMAND...: the command's output to the terminal and LOG, stopped at SECONDS
    local seconds=$1 log=$2
    shift 2
    timeout --signal=INT --kill-after=20 "$seconds" "$@" 2>&1 | tee "$log" || status=$?
}

if [[ $stages == *" env "* ]]; then
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null \
            || echo "no nvidia-smi"
        "$python" - <<'EOF'
import importlib
import platform

print("python", platform.python_version())
for name in ("torch", "transformers", "onnxruntime", "onnx", "ctranslate2", "triton", "fastapi", "uvicorn"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:  # what is missing is part of the record
        print(name, "unavailable:", type(exc).__name__)
import torch

print("torch cuda", torch.version.cuda, "available:", torch.cuda.is_available())
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    print("device", props.name, "capability", f"{props.major}.{props.minor}", "multiprocessors",
          props.multi_processor_count, "memory GiB", round(props.total_memory / 2**30, 1))
try:
    import onnxruntime

    print("onnxruntime providers", ", ".join(onnxruntime.get_available_providers()))
except ImportError:
    pass
EOF
    } > "$out/environment.txt" 2>&1
    cat "$out/environment.txt"
fi

if [[ $stages == *" tests "* ]]; then
    limited "${TESTS_LIMIT_S:-150}" "$out/tests.log" "$python" -m pytest -q -p no:cacheprovider -rfEs \
        tests/runtime/test_static.py tests/runtime/test_fp8.py tests/generation/test_parity.py -k "cuda or fp8 or gpu"
fi

if [[ $stages == *" engine "* ]]; then
    for variant in ${VARIANTS:-bf16 fp16+compile}; do
        precision=${variant%%+*}
        flags=()
        [[ $variant == *+compile ]] && flags+=(--compile)
        mkdir -p "$out/$variant"
        limited "${ENGINE_LIMIT_S:-300}" "$out/$variant/engine.log" "$python" benchmarks/gpu_engine.py \
            --out "$out/$variant" --workloads "${GPU_WORKLOADS:-G1,G2,G3,G4,G5}" --precision "$precision" \
            --runs "${ENGINE_RUNS:-10}" --peers "${ENGINE_PEERS-G1,G2}" "${flags[@]}"
    done
fi

if [[ $stages == *" profile "* ]]; then
    mkdir -p "$out/profile"
    for precision in ${PROFILE_PRECISIONS:-bf16}; do
        limited "${PROFILE_LIMIT_S:-150}" "$out/profile/profile-$precision.log" "$python" benchmarks/gpu_profile.py \
            --workloads "${GPU_WORKLOADS:-G1,G2,G3,G4,G5}" --precision "$precision" --out "$out/profile"
    done
fi

if [[ $stages == *" serve "* ]]; then
    mkdir -p "$out/serve"
    artifact="$HOTROD_CACHE/w5-cuda-${SERVE_PRECISION:-auto}"
    limited "${SERVE_LIMIT_S:-240}" "$out/serve/serve.log" bash -c '
        set -e
        source=$("$0" -c "from hotrod.bench.workloads import WORKLOADS, checkpoint; print(checkpoint(WORKLOADS[\"W1\"]))")
        "$0" -m hotrod.cli optimize "$source" --out "$1" --backend torch --device cuda --precision "$2" --force
        "$0" -m hotrod.cli info "$1"
        "$0" benchmarks/serve_load.py --artifact "$1" --batching continuous,none --concurrency 64 \
            --requests "$3" --time-limit 60 --out "$4"
    ' "$python" "$artifact" "${SERVE_PRECISION:-auto}" "${SERVE_REQUESTS:-128}" "$out/serve/w5"
fi

if [[ $stages == *" onnxruntime "* ]]; then
    if ! "$python" -c "import onnxruntime, sys; sys.exit('CUDAExecutionProvider' not in onnxruntime.get_available_providers())"; then
        echo "onnxruntime here has no CUDA provider: W1-W4 on onnxruntime skipped" | tee "$out/onnxruntime-skipped.txt"
    else
        mkdir -p "$out/onnxruntime"
        limited "${LIMIT_S:-450}" "$out/onnxruntime/bench.log" "$python" -m hotrod.cli bench \
            --workload "${WORKLOADS:-W1,W2,W3,W4}" --device cuda --precision "${PRECISIONS:-fp32,fp16}" \
            --peers "${PEERS:-torch,ctranslate2}" --runs "${RUNS:-5}" --out "$out/onnxruntime"
        if [ -f "$out/onnxruntime/results.json" ] && ! [ -f "$out/onnxruntime/report.md" ]; then
            # Stopped early (the time limit, or an error in a later case): report the cases that finished.
            "$python" - "$out/onnxruntime" <<'EOF' 2>&1 | tee -a "$out/onnxruntime/bench.log"
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
    fi
fi
echo "results in $out (exit status $status)"
exit "$status"
