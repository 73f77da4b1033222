"""sentence-transformers in process on one of its backends (W9: `benchmarks/serve_embeddings.py`), run in
whichever Python environment has that backend.

sentence-transformers' ONNX backend needs optimum-onnx, which pins transformers 4, and its OpenVINO backend
optimum-intel: neither imports beside hotrod's transformers, so the benchmark starts this file with the
environment's Python (`hotrod.bench.remote.Worker`: `make peers` adds sentence-transformers to the Infinity
and OpenVINO environments). It imports nothing from hotrod.

It answers the requests of `loop.py`. `build` loads the checkpoint on `backend`, exporting it first where
that backend needs an export, with sentence-transformers' own functions, into `work` (once; again when the
libraries that made it change):

- `torch`: the checkpoint as it is;
- `onnx`: the ONNX export as it is (what Infinity's optimum engine is given);
- `onnx-O3`: `export_optimized_onnx_model(model, "O3", ...)` (O4 is O3 with fp16, for GPUs);
- `onnx-int8`: `export_dynamic_quantized_onnx_model(model, <this CPU's config>, ...)` (`avx512_vnni` where
  the CPU has VNNI: qint8 weights; `avx2`: quint8);
- `openvino`: the OpenVINO export as it is, in the plugin's default precision;
- `openvino-int8`: `export_static_quantized_openvino_model`, calibrated on `calibration` texts (its default
  calibration set, GLUE SST-2, is on the Hub, which this machine cannot reach).

`call(first=True)` encodes the warm-up requests and returns nothing; `call(first=False)` encodes the timed
requests one after another, each whole request (32 texts) in one `encode`, and returns each request's
seconds, its vectors' shape and the first request's vectors.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

BACKENDS = ("torch", "onnx", "onnx-O3", "onnx-int8", "openvino", "openvino-int8")
STAMP = "w9-export.json"  # the library versions that made an export directory


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))  # the loop beside this file (-I leaves it off the path)
    from loop import serve

    serve(Peer)


class Peer:
    """One SentenceTransformer on one backend, and the requests it encodes."""

    def __init__(self, source: str, work: str, backend: str, threads: int, requests: list[list[str]],
                 warmup: list[list[str]], calibration: list[str] | None = None):
        import torch

        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; one of {', '.join(BACKENDS)}")
        torch.set_num_threads(threads)
        self.backend, self.requests, self.warmup = backend, requests, warmup
        self.file = ""
        family = backend.split("-")[0]
        if family == "torch":
            self.model = _sentence_transformer(source)
        else:
            target = Path(work)
            self.file = _export(source, target, backend, calibration or [])
            self.model = _sentence_transformer(str(target), backend=family,
                                               model_kwargs={"file_name": self.file, **_runtime(family, threads)})

    def info(self) -> dict:
        from importlib.metadata import version

        info = {"sentence_transformers": version("sentence-transformers"), "file": self.file}
        for package in ("torch", "onnxruntime", "openvino", "optimum", "optimum-onnx", "optimum-intel",
                        "transformers"):
            try:
                info[package] = version(package)
            except Exception:  # not installed in this environment
                pass
        if self.backend.startswith("openvino"):
            info["inference_precision"] = _openvino_precision(self.model)
        return info

    def call(self, first: bool):
        if first:
            for texts in self.warmup:
                self._encode(texts)
            return None
        seconds, shapes, vectors = [], [], None
        for texts in self.requests:
            start = time.perf_counter()
            out = self._encode(texts)
            seconds.append(time.perf_counter() - start)
            shapes.append(tuple(out.shape))
            if vectors is None:
                vectors = out
        return {"seconds": seconds, "shapes": shapes, "first": vectors}

    def _encode(self, texts: list[str]):
        return self.model.encode(texts, batch_size=len(texts), convert_to_numpy=True, show_progress_bar=False)


def _sentence_transformer(path: str, **kwargs):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device="cpu", **kwargs)


def _runtime(family: str, threads: int) -> dict:
    """The backend's own thread setting: an ONNX Runtime session's, or the OpenVINO plugin's."""
    if family == "onnx":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        return {"provider": "CPUExecutionProvider", "session_options": options}
    return {"ov_config": {"INFERENCE_NUM_THREADS": str(threads)}}


def _export(source: str, target: Path, backend: str, calibration: list[str]) -> str:
    """The file of `backend` in `target` (`onnx/...` or `openvino/...`), exported once with
    sentence-transformers' own functions; a directory made by other library versions is made again."""
    family = backend.split("-")[0]
    stamp = target / STAMP
    versions = _versions(family)
    made = json.loads(stamp.read_text()) if stamp.is_file() else {}
    if made.get("versions") != versions:
        shutil.rmtree(target, ignore_errors=True)
        made = {"versions": versions, "files": {}}
    if backend in made["files"] and (target / made["files"][backend]).is_file():
        return made["files"][backend]
    plain = "onnx/model.onnx" if family == "onnx" else "openvino/openvino_model.xml"
    if (target / plain).is_file() and (target / "modules.json").is_file():
        model = _sentence_transformer(str(target), backend=family, model_kwargs={"file_name": plain})
    else:  # the plain export, kept: the other exports start from it
        model = _sentence_transformer(source, backend=family)
        model.save(str(target))
    made["files"][family] = plain
    if backend == "onnx-O3":
        _st("export_optimized_onnx_model")(model, "O3", str(target))
        made["files"][backend] = "onnx/model_O3.onnx"
    elif backend == "onnx-int8":
        from optimum.onnxruntime.configuration import AutoQuantizationConfig

        name = _quantization_config()
        config = getattr(AutoQuantizationConfig, name)(is_static=False)
        suffix = f"{config.weights_dtype.name.lower()}_{name}"  # qint8_avx512_vnni; quint8_avx2
        _st("export_dynamic_quantized_onnx_model")(model, config, str(target), file_suffix=suffix)
        made["files"][backend] = f"onnx/model_{suffix}.onnx"
    elif backend == "openvino-int8":
        _static_openvino(model, target, calibration)
        made["files"][backend] = "openvino/openvino_model_qint8_quantized.xml"
    if not (target / made["files"][backend]).is_file():
        raise RuntimeError(f"the {backend} export left no {made['files'][backend]} in {target}")
    stamp.write_text(json.dumps(made, indent=2))
    return made["files"][backend]


def _st(name: str):
    """An export function of sentence-transformers: at its top level (3.2 on), or in its backend module."""
    import sentence_transformers

    found = getattr(sentence_transformers, name, None)
    if found is None:
        from sentence_transformers import backend

        found = getattr(backend, name)
    return found


def _static_openvino(model, target: Path, calibration: list[str]) -> None:
    """sentence-transformers' static int8 OpenVINO export, calibrated on `calibration` (texts like the
    requests) instead of its default Hub dataset: the quantizer's dataset loader is replaced by one that
    builds the same `datasets.Dataset` from these texts and applies the same preprocessing."""
    if not calibration:
        raise ValueError("the static OpenVINO export needs calibration texts")
    from optimum.intel import OVQuantizationConfig, OVQuantizer

    def local(self, dataset_name, num_samples=None, dataset_config_name=None, dataset_split="train",
              preprocess_function=None, preprocess_batch=True, **_):
        from datasets import Dataset

        data = Dataset.from_dict({"sentence": calibration[:num_samples]})
        return data.map(preprocess_function, batched=preprocess_batch) if preprocess_function else data

    loader = OVQuantizer.get_calibration_dataset
    OVQuantizer.get_calibration_dataset = local
    try:
        _st("export_static_quantized_openvino_model")(model, OVQuantizationConfig(num_samples=len(calibration)),
                                                      str(target))
    finally:
        OVQuantizer.get_calibration_dataset = loader


def _quantization_config() -> str:
    """optimum's dynamic int8 configuration for this CPU: avx512_vnni, avx512, avx2, or arm64."""
    import platform

    if platform.machine().lower() in ("arm64", "aarch64"):
        return "arm64"
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        flags = []
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    return "avx512" if "avx512f" in flags else "avx2"


def _versions(family: str) -> dict:
    from importlib.metadata import version

    names = ("sentence-transformers", "transformers", "optimum", "optimum-onnx", "onnxruntime") \
        if family == "onnx" else ("sentence-transformers", "transformers", "optimum-intel", "openvino", "nncf")
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except Exception:
            found[name] = None
    return found


def _openvino_precision(model) -> str:
    """The precision OpenVINO's CPU plugin compiled the model for (bf16 on CPUs with AVX-512 BF16 or AMX,
    unless told otherwise)."""
    try:
        auto = getattr(model, "transformers_model", None) or model[0].auto_model
        compiled = auto.request if hasattr(auto.request, "get_property") else auto.request.get_compiled_model()
        hint = compiled.get_property("INFERENCE_PRECISION_HINT")
        return str(hint.get_type_name() if hasattr(hint, "get_type_name") else hint)
    except Exception:  # another optimum-intel's layout: not known, not a failure
        return "unknown"


if __name__ == "__main__":
    main()
