"""OpenVINO through optimum-intel, run as a bench peer in a Python environment of its own.

optimum-intel pins an older transformers than hotrod's, so it cannot be imported beside hotrod: the
harness starts this file with the other environment's Python (`hotrod.bench.remote`) and talks to it
over its stdin and stdout, one pickled request and one pickled reply at a time. It imports nothing from
hotrod, which that environment does not have.

It answers the requests of `loop.py`: `build` converts once into `target`, then loads and compiles. An
encoder is exported with its head (`HEADS`: optimum-intel's class for the task) and answers with the
model's named outputs (a head's logits, or the hidden states), on which the harness runs the same span
search or ranking as on PyTorch's; a language model answers with its tokens.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

# What each precision asks of optimum-intel: weight-only compression by NNCF, or NNCF's full
# quantization (int8 weights and activations, calibrated on the case's own inputs) for encoders;
# "fp32" is the export as it is, and "bf16" the same export computed in bf16 (`INFERENCE_PRECISIONS`).
WEIGHT_BITS = {"int8": 8, "int4": 4}
# An encoder's head, as the harness names it (transformers' pipeline task), and optimum-intel's class for it.
HEADS = {"question-answering": "OVModelForQuestionAnswering",
         "text-classification": "OVModelForSequenceClassification",
         "token-classification": "OVModelForTokenClassification"}
CALIBRATION_BATCHES = 8
# The CPU plugin's arithmetic by format: on a CPU with bf16 (AVX-512 BF16, AMX) it computes in bf16 unless told,
# so fp32 is asked for; bf16 is what it does there by default, said outright (fp32 where the CPU has no bf16).
INFERENCE_PRECISIONS = {"fp32": "f32", "bf16": "bf16"}
STAMP = "openvino-version.txt"  # the OpenVINO that converted the model


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))  # the loop beside this file (-I leaves it off the path)
    from loop import serve

    serve(Peer)


class Peer:
    """One converted model on OpenVINO's CPU plugin, answering for one case's inputs."""

    def __init__(self, kind: str, generates: bool, pads_left: bool, source: str, precision: str, target: str,
                 threads: int, ids, mask, new_tokens: int, task: str | None = None, types=None,
                 generate_kwargs: dict | None = None):
        """`task`: an encoder's head (None: the bare encoder); `types`: the rows' token types (text pairs),
        else zeros where the model takes them, as transformers fills them in; `generate_kwargs`: the case's
        search, as every system is told it (forced length, greedy or beams; None: greedy)."""
        import torch

        self.kind, self.task, self.new_tokens = kind, task, new_tokens
        self.generate_kwargs = generate_kwargs or {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens,
                                                   "do_sample": False, "num_beams": 1}
        self.generates, self.pads_left = generates, pads_left  # hotrod's kind spec, sent by the parent
        self.target = Path(target)
        self.ids, self.mask = torch.from_numpy(ids), torch.from_numpy(mask)
        self.types = torch.zeros_like(self.ids) if types is None else torch.from_numpy(types)
        stamp = self.target / STAMP
        if not stamp.is_file() or stamp.read_text() != _version():  # converted by another OpenVINO: again
            self._convert(source, precision)
        config = {"INFERENCE_NUM_THREADS": str(threads), "PERFORMANCE_HINT": "LATENCY", "CACHE_DIR": ""}
        if precision in INFERENCE_PRECISIONS:
            config["INFERENCE_PRECISION_HINT"] = INFERENCE_PRECISIONS[precision]
        self.model = _model_class(kind, generates, task).from_pretrained(self.target, ov_config=config, compile=True)

    def info(self) -> dict:
        return {"version": _version(), "size_bytes": _size(self.target)}

    def call(self, first: bool):
        import torch

        with torch.inference_mode():
            if not self.generates:
                outputs = self.model(**self._feeds(self.ids, self.mask, self.types, self.model.input_names))
                return {name: value.numpy() for name, value in outputs.items()}
            kwargs = dict(self.generate_kwargs)
            if first:
                kwargs.update(max_new_tokens=1, min_new_tokens=1)
            if self.pads_left and self.model.generation_config.pad_token_id is None:
                kwargs["pad_token_id"] = self.model.config.eos_token_id
            return self.model.generate(self.ids, attention_mask=self.mask, **kwargs).numpy()

    def _convert(self, source: str, precision: str) -> None:
        """Exports and compresses into a sibling directory, renamed into place only when whole."""
        from optimum.intel import OVWeightQuantizationConfig

        partial = self.target.with_name(self.target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        full = precision == "int8-full"
        bits = WEIGHT_BITS.get(precision)  # fp32 and bf16: the export as it is
        quantization = OVWeightQuantizationConfig(bits=bits) if bits else None
        model = _model_class(self.kind, self.generates, self.task).from_pretrained(source, export=True, compile=False,
                                                                   quantization_config=quantization)
        if full:
            model.model = self._quantized(model.model)
        model.save_pretrained(partial)
        (partial / STAMP).write_text(_version())
        shutil.rmtree(self.target, ignore_errors=True)
        partial.rename(self.target)

    def _quantized(self, graph):
        """NNCF's post-training int8 quantization of an encoder, calibrated on rows shaped like the case's."""
        import nncf
        import numpy as np

        if self.generates:
            raise ValueError("full int8 quantization is timed for encoders only")
        names = {port.get_any_name() for port in graph.inputs}
        rng = np.random.default_rng(0)
        mask, types = self.mask.numpy(), self.types.numpy()
        feeds = [self._feeds(rng.integers(2, 1000, size=self.ids.shape) * mask, mask, types, names)
                 for _ in range(CALIBRATION_BATCHES)]
        return nncf.quantize(graph, nncf.Dataset(feeds), model_type=nncf.ModelType.TRANSFORMER,
                             subset_size=len(feeds))

    @staticmethod
    def _feeds(ids, mask, types, names) -> dict:
        """An encoder's inputs: the ids and mask, and the token types where the model (`names`) takes them."""
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in names:
            feeds["token_type_ids"] = types
        return feeds


def _model_class(kind: str, generates: bool, task: str | None = None):
    """optimum-intel's class for the kind, or for an encoder's head (`generates`: the kind spec's, sent by
    the parent, which knows the kinds; this process runs without hotrod)."""
    import optimum.intel as intel

    if task is not None:
        if generates or task not in HEADS:
            raise ValueError(f"the OpenVINO peer runs {', '.join(HEADS)} heads of encoders, not a {task} head "
                             f"of a {kind}")
        return getattr(intel, HEADS[task])
    return {"encoder": intel.OVModelForFeatureExtraction, "decoder": intel.OVModelForCausalLM,
            "seq2seq": intel.OVModelForSeq2SeqLM}[kind]


def _version() -> str:
    import openvino

    return openvino.__version__.split("-")[0]


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


if __name__ == "__main__":
    main()
