"""The precisions hotrod builds and runs in: one small class each, and the one place that lists them.

As in CTranslate2's quantization types and ONNX Runtime's tools, a precision is an object rather than a
string every floor re-reads: it says whether lowering a graph to it needs feeds recorded from the fp32
graph, lowers a graph to itself, says whether this onnxruntime has its kernels on a device, and
describes itself for the manifest. The options, the CLI's choices, `--precision auto`'s candidates, the
static engine's list and the benchmark's hardware floor all read this registry.

- fp32: the export as it is.
- fp16 / bf16: mixed precision, the nodes that overflow kept in fp32 by measurement (`optimize/mixed.py`).
- int8: dynamic quantization, per-channel weights, activations quantized per row (one scale per token), so
  a row's answer does not depend on its batch-mates.
- int8-call: the same with onnxruntime's own activation quantization, one scale per call: a row's answer
  depends on its batch-mates.
- int8-static: QDQ with activation ranges calibrated on recorded feeds.
- bf16-products: the fp32 graph, its products computed in bf16 with fp32 sums where the CPU has AMX-BF16 or
  AVX-512 BF16 (hotrod's kernels; its attention too, where it has AMX-BF16 or AVX-512), in fp32 elsewhere.
- int8-weight / int4 / int4-b128 / int4-b256: weight-only, block-quantized MatMulNBits (blocks of 32, 128 or 256).
- fp8: the torch engine's only (no ONNX graphs): e4m3 weights with per-channel scales through
  torch._scaled_mm, on GPUs with fp8 tensor cores (`runtime/fp8.py`).

The torch backend's static engine (`runtime/static.py`) runs the precisions marked `engine`; for it a
precision says the torch dtype it casts to (`torch_dtype`), how it stores its linear weights
(`engine_linears`, one of LINEAR_FORMATS, each a layer in `runtime/static.py`), whether a build measures
the modules to keep in fp32 (`measures_islands`), what its artifact's weights are (`describe_engine`) and
whether torch here has its kernels on a device (`engine_refusal`). Generic code asks these, never a name.

The graph passes are imported when a graph is lowered, so this module stays cheap for the options, the
CLI and the static engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ml_dtypes  # numpy's bfloat16; onnx itself depends on it
import numpy as np
from onnx import TensorProto

# The graph properties through which a build asks for bf16 attention and products (`Precision.attention`,
# `Precision.products`), read where the graph is loaded.
from hotrod.asks import ATTENTION_KEY, ATTENTIONS, PRODUCTS, PRODUCTS_KEY, ask
from hotrod.errors import check_choice

if TYPE_CHECKING:
    import onnx

Feed = dict[str, np.ndarray]

_PER_BLOCK = "fp32, quantized to int8 per block inside MatMulNBits (accuracy level 4)"


# How the static engine stores a precision's linear weights (`Precision.engine_linears`); the runtime maps
# each to the layer that quantizes a linear into it (`hotrod.runtime.static.QUANTIZERS`).
CAST = ""  # cast with the rest of the weights, to `torch_dtype`
INT8_PER_CHANNEL = "int8-per-channel"  # int8, one scale per output channel (`runtime.cast.Int8Linear`)
FP8_PER_CHANNEL = "fp8-e4m3-per-channel"  # e4m3, one scale per output channel (`runtime.fp8.Fp8Linear`)
LINEAR_FORMATS = (CAST, INT8_PER_CHANNEL, FP8_PER_CHANNEL)
TORCH_DTYPES = ("float32", "float16", "bfloat16")  # names of torch dtypes (`getattr(torch, name)`)


# Where the attention's products run, by what a precision asks of them (the manifest's "attention"; nothing for fp32).
_ATTENTION_WHERE = {
    "bf16": "bf16 products where the CPU has AMX-BF16 or AVX-512 (hotrod's kernel), fp32 elsewhere",
    "int8": ("int8 products where the CPU has AVX-512 VNNI (hotrod's kernel: Q, K and V per row, the softmax's "
             "numerators uint8 per row), bf16 where it has AVX-512 or AMX-BF16 only, fp32 elsewhere"),
}


@dataclass(frozen=True, kw_only=True)
class Precision:
    """One precision. `weights` and `activations` are what the manifest says of them (the name when empty);
    `activations` may name the calibration `{method}`."""

    name: str
    weight_bytes: float  # bytes read per weight; block formats carry one fp32 scale per block
    compute: str = "fp32"  # the matrix arithmetic: fp32, half or int8 (the benchmark's floor picks its rate)
    needs_feeds: bool = False  # lowering reads feeds recorded from the fp32 graph
    candidate: bool = True  # tried by onnxruntime's `--precision auto`
    onnx: bool = True  # lowers ONNX graphs (`hotrod optimize` for onnxruntime)
    engine: bool = False  # the torch backend's static engine runs in it too
    weights: str = ""
    activations: str = ""
    engine_weights: str = ""  # the engine's linear weights, for its artifact's manifest (the name when empty)
    engine_dtype: str = ""  # the engine's activations and other weights (the name when empty)
    torch_dtype: str = ""  # the engine's activations and other weights, a TORCH_DTYPES name (engine only)
    engine_linears: str = CAST  # how the engine stores its linear weights: one of LINEAR_FORMATS
    measures_islands: bool = False  # an engine build keeps the modules this precision overflows in fp32
    # The encoders' attention products on the CPU: fp32 (onnxruntime's kernel), bf16 (hotrod's, on AMX
    # tiles where the CPU has AMX-BF16, on AVX-512 where it has that only, fp32 elsewhere) or int8 (hotrod's, on
    # AVX-512 VNNI; bf16's where the CPU lacks it), asked for in the graph (ATTENTION_KEY) and so
    # measured by the build's verification.
    attention: str = "fp32"
    # An fp32 graph's products on the CPU: fp32 (onnxruntime's) or bf16 (hotrod's, on AMX tiles where the CPU has
    # AMX-BF16, on AVX-512 BF16 where it has that only, fp32 elsewhere), asked for in the graph (PRODUCTS_KEY) as
    # `attention` is.
    products: str = "fp32"
    devices: tuple[str, ...] = ("cpu", "cuda")  # the devices its onnxruntime graphs are built for

    def __post_init__(self):
        if self.engine and self.torch_dtype not in TORCH_DTYPES:
            raise ValueError(f"engine precision {self.name} needs a torch_dtype among {TORCH_DTYPES}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"precision {self.name}: attention {self.attention!r} not in {ATTENTIONS}")
        if self.products not in PRODUCTS:
            raise ValueError(f"precision {self.name}: products {self.products!r} not in {PRODUCTS}")
        if self.engine_linears not in LINEAR_FORMATS:
            raise ValueError(f"precision {self.name}: engine_linears {self.engine_linears!r} not in {LINEAR_FORMATS}")

    @property
    def invariant_rows(self) -> int:
        """What a graph call's rows (tokens) must be a multiple of for each row's result to be the same bit
        for bit at any batch size; a server pads its batches and prompt widths to it with dummy rows and
        columns (`hotrod.serve.runner`)."""
        return 1

    @property
    def converts(self) -> bool:
        """Whether this precision changes anything: fp32 leaves the graphs and weights as they are."""
        return True

    def lower(self, model: onnx.ModelProto, feeds: Sequence[Feed] | None = None, method: str = "minmax",
              name: str | None = None) -> tuple[onnx.ModelProto, dict]:
        """`model` (a fused fp32 graph) in this precision, and what to add to its manifest entry.

        `feeds` are inputs recorded from the fp32 graph (required where `needs_feeds`), `method` the
        calibration method, `name` the graph's name for error messages. The input model may be changed;
        use the returned one.
        """
        raise NotImplementedError

    def has_kernels(self, device: str) -> bool:
        """Whether this machine runs this precision's graphs on `device` with kernels of their own (onnxruntime's,
        or hotrod's where the precision asks for them)."""
        return True

    def cpu_refusal(self) -> str:
        """Why building this precision for a CPU without its kernels (`has_kernels`) is refused."""
        return (f"onnxruntime's CPU provider has no {self.name} kernels, so {self.name} on cpu would only be slower; "
                "build it with --device cuda, or choose int8/int4 for CPU")

    def describe(self, method: str = "minmax") -> dict[str, str]:
        """Where each kind of weight, and the activations, ended up (the manifest's "weights")."""
        weights = self.weights or self.name
        activations = (self.activations or self.name).format(method=method)
        described = {"matmul_weights": weights, "lm_head": weights, "embeddings": "fp32", "activations": activations}
        if self.attention in _ATTENTION_WHERE:
            described["attention"] = _ATTENTION_WHERE[self.attention]
        if self.products != "fp32":
            described["products"] = (f"{self.products} operands, fp32 sums, where the CPU has AMX-BF16 or AVX-512 "
                                     "BF16 (hotrod's kernel), fp32 elsewhere")
        return described

    def describe_engine(self) -> dict[str, str]:
        """The manifest's "weights" of a torch engine artifact (fp16's fp32 islands are listed beside them)."""
        dtype = self.engine_dtype or self.name
        return {"linear_weights": self.engine_weights or self.name, "other_weights": dtype, "activations": dtype}

    def engine_refusal(self, device: str) -> str | None:
        """Why torch here cannot run this precision on the static engine on `device`, or None when it can."""
        if not self.engine:
            return (f"{self.name} is onnxruntime's (quantized graphs); the torch engine runs "
                    f"{', '.join(names(lambda p: p.engine))}")
        return None


@dataclass(frozen=True, kw_only=True)
class Full(Precision):
    """fp32: the export unchanged."""

    @property
    def converts(self) -> bool:
        return False

    def lower(self, model: onnx.ModelProto, feeds: Sequence[Feed] | None = None, method: str = "minmax",
              name: str | None = None) -> tuple[onnx.ModelProto, dict]:
        return model, {}


@dataclass(frozen=True, kw_only=True)
class Half(Precision):
    """fp16 or bf16 mixed precision. The tolerance is on each output's largest absolute difference from
    fp32, relative to its largest magnitude: bf16 keeps 8 significant bits to fp16's 11, so a wider band."""

    onnx_type: int
    numpy_type: type
    max_finite: float
    rtol: float
    atol: float
    compute: str = "half"
    needs_feeds: bool = True
    engine: bool = True

    def lower(self, model: onnx.ModelProto, feeds: Sequence[Feed] | None = None, method: str = "minmax",
              name: str | None = None) -> tuple[onnx.ModelProto, dict]:
        from hotrod.optimize.mixed import to_half

        model, report = to_half(model, self, feeds, name=name)
        return model, {"mixed_precision": report}

    def has_kernels(self, device: str) -> bool:
        from hotrod.runtime.kernels import half_supported

        return half_supported(self, device)


@dataclass(frozen=True, kw_only=True)
class Int8Dynamic(Precision):
    """Per-channel int8 weights; activations quantized on every call (per row with `per_row`), so nothing
    to calibrate."""

    compute: str = "int8"
    per_row: bool = False

    def lower(self, model: onnx.ModelProto, feeds: Sequence[Feed] | None = None, method: str = "minmax",
              name: str | None = None) -> tuple[onnx.ModelProto, dict]:
        from hotrod.optimize.quantize import int8_dynamic

        return ask(int8_dynamic(model, self.per_row), ATTENTION_KEY, self.attention), {}


@dataclass(frozen=True, kw_only=True)
class Int8Static(Precision):
    """QDQ int8 with activation ranges calibrated on the recorded feeds."""

    compute: str = "int8"
    needs_feeds: bool = True

    def lower(self, model: onnx.ModelProto, feeds: Sequence[Feed] | None = None, method: str = "minmax",
              name: str | None = None) -> tuple[onnx.ModelProto, dict]:
        from hotrod.optimize.quantize import int8_static

        return ask(int8_static(model, feeds, method), ATTENTION_KEY, self.attention), {}


@dataclass(frozen=True, kw_only=True)
class Bf16Products(Precision):
    """The fp32 graph as it is, asking for its products and attention in bf16 with fp32 sums where it is loaded on
    a CPU with AMX-BF16 (`hotrod.runtime.bf16`, `hotrod.runtime.attention`; its products also on one with AVX-512
    BF16 but no AMX, its attention on any AVX-512); elsewhere it runs in fp32. 8
    significant bits on both operands of every product, each value with its own exponent: on trained heads the
    answers stay fp32's where 8-bit activations do not."""

    compute: str = "half"
    attention: str = "bf16"
    products: str = "bf16"
    devices: tuple[str, ...] = ("cpu",)  # on a GPU the graph would be fp32's: fp16 and bf16 are the GPU's

    def lower(self, model: onnx.ModelProto, feeds: Sequence[Feed] | None = None, method: str = "minmax",
              name: str | None = None) -> tuple[onnx.ModelProto, dict]:
        return ask(ask(model, ATTENTION_KEY, self.attention), PRODUCTS_KEY, self.products), {}

    def has_kernels(self, device: str) -> bool:
        """Where hotrod's bf16 kernels run: elsewhere the graph is fp32's, and the fp32 build is the same."""
        from hotrod.runtime import bf16

        return device == "cpu" and bf16.available()

    def cpu_refusal(self) -> str:
        return (f"{self.name}'s products run on hotrod's bf16 kernels (AMX-BF16 or AVX-512 BF16), which this CPU "
                "lacks (or the kernels' library was built without), so it would only be fp32; choose fp32, or "
                "int8/int4 for CPU")


@dataclass(frozen=True, kw_only=True)
class WeightOnly(Precision):
    """Symmetric weights of `bits` bits in blocks of `block_size` through MatMulNBits, computed with int8
    activations. Larger blocks carry fewer fp32 scales (4 bytes a block), so a decoding step reads fewer
    bytes and the kernel does less per weight, for a coarser fit of each weight."""

    bits: int
    block_size: int = 32
    compute: str = "int8"  # accuracy level 4: int8 math
    activations: str = _PER_BLOCK

    @property
    def invariant_rows(self) -> int:
        """onnxruntime's 4-bit MatMulNBits takes rows in pairs on some CPUs (AVX-512 VNNI, blocks of 64
        and more: an odd call's last row goes alone, through a kernel that sums in another order) and on
        others takes a single row apart (AVX2: M=1 differs in the last bits, every M from 2 to 64 agrees at
        any row position). Calls of an even number of rows, each row an even number of tokens wide, are
        invariant on both; its 8-bit kernel has one path."""
        return 2 if self.bits == 4 else 1

    def lower(self, model: onnx.ModelProto, feeds: Sequence[Feed] | None = None, method: str = "minmax",
              name: str | None = None) -> tuple[onnx.ModelProto, dict]:
        from hotrod.optimize.quantize import weight_only

        return weight_only(model, self.bits, self.block_size), {}


@dataclass(frozen=True, kw_only=True)
class Fp8(Precision):
    """e4m3 weights with one fp32 scale per output channel, multiplied by torch._scaled_mm with activations
    quantized per row as they come (`hotrod.runtime.fp8`): the torch engine's only, on GPUs with fp8
    tensor cores. onnxruntime gets no such graphs."""

    compute: str = "fp8"
    candidate: bool = False
    onnx: bool = False
    engine: bool = True

    def lower(self, model: onnx.ModelProto, feeds: Sequence[Feed] | None = None, method: str = "minmax",
              name: str | None = None) -> tuple[onnx.ModelProto, dict]:
        from hotrod.errors import HotrodError

        raise HotrodError("fp8 is the torch engine's precision; build it with --backend torch")

    def has_kernels(self, device: str) -> bool:
        return False

    def engine_refusal(self, device: str) -> str | None:
        from hotrod.runtime.fp8 import refusal

        return refusal(device)


REFERENCE = "fp32"  # the precision every other is measured against: the export as it is, converted to nothing
REGISTRY: dict[str, Precision] = {p.name: p for p in (
    Full(name="fp32", weight_bytes=4.0, engine=True, torch_dtype="float32"),
    # fp16 tops out at 65504 (T5's feed-forward blocks pass it): the engine keeps those modules in fp32.
    Half(name="fp16", weight_bytes=2.0, onnx_type=TensorProto.FLOAT16, numpy_type=np.float16,
         max_finite=65504.0, rtol=1e-2, atol=1e-3, torch_dtype="float16", measures_islands=True),
    Half(name="bf16", weight_bytes=2.0, onnx_type=TensorProto.BFLOAT16, numpy_type=ml_dtypes.bfloat16,
         max_finite=float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), rtol=5e-2, atol=1e-2, torch_dtype="bfloat16"),
    # Activations per row (one symmetric scale per token): batch-invariant, and on real weights at least as
    # close to fp32 as one scale per call (the demo's MiniLM tagger: entity F1 0.946 against 0.938), for
    # about int8-call's CPU time (benchmarks/results/int8-rows-cpu.json).
    # Its attention products in bf16 where the CPU has AMX-BF16 or AVX-512: 8 significant bits, finer than the
    # 8-bit rows of every product around them.
    Int8Dynamic(name="int8", weight_bytes=1.0, per_row=True, weights="int8 per-channel, 7-bit range (dynamic)",
                activations="uint8 per row, symmetric, range measured on every call (dynamic)", attention="bf16"),
    # onnxruntime's own dynamic quantization, one activation range per call: a row's answer depends on its
    # batch-mates, so auto never picks it; kept for comparison and for graphs built that way.
    Int8Dynamic(name="int8-call", weight_bytes=1.0, candidate=False,
                weights="int8 per-channel, 7-bit range (int8-call, dynamic)",
                activations="uint8 per-tensor, range measured on every call (dynamic)"),
    Int8Static(name="int8-static", weight_bytes=1.0, weights="int8 per-channel, 7-bit range (int8-static, QDQ)",
               activations="uint8 per-tensor, static ranges calibrated with {method}", attention="bf16"),
    # int8-static with the attention's two products in int8 too (OpenVINO's full int8 arithmetic): the fastest
    # encoder precision on a CPU with AVX-512 VNNI, at the accuracy its build's verification measures; auto leaves
    # it to be asked for (8-bit numerators cost answers on trained heads that int8-static keeps).
    Int8Static(name="int8-full", weight_bytes=1.0, candidate=False,
               weights="int8 per-channel, 7-bit range (int8-full, QDQ)",
               activations=("uint8 per-tensor, static ranges calibrated with {method}; attention's operands int8 "
                            "per row"),
               attention="int8"),
    # Every product (and the attention's) in bf16 with fp32 sums where the CPU has AMX-BF16 (the products also on
    # AVX-512 BF16 alone, the attention on AVX-512), from the fp32 graph:
    # the accurate fast precision of an encoder on such a CPU (benchmarks/README.md: "bf16 products").
    Bf16Products(name="bf16-products", weight_bytes=2.0, weights="fp32 (rounded to bf16 as the graph is loaded "
                 "where the CPU has AMX-BF16 or AVX-512 BF16)", activations="fp32, rounded to bf16 for each "
                 "product where the CPU has AMX-BF16 or AVX-512 BF16"),
    # int4's layout and kernel with twice the bits, for models int4 hurts; auto leaves it to be asked for.
    WeightOnly(name="int8-weight", weight_bytes=1.0 + 4 / 32, bits=8, candidate=False, engine=True,
               weights="int8 block-32 symmetric (int8-weight, MatMulNBits)",
               engine_weights="int8 per output channel, symmetric, bf16 scales", engine_dtype="bf16",
               torch_dtype="bfloat16", engine_linears=INT8_PER_CHANNEL),
    WeightOnly(name="int4", weight_bytes=0.5 + 4 / 32, bits=4, weights="int4 block-32 symmetric (MatMulNBits)"),
    # Fewer, larger blocks: fewer scales to read and apply per weight (MatMulNBits' int8 kernel spends per
    # block), for a coarser fit: batch-1 decoding reads fewer bytes a weight (benchmarks/README.md has the
    # figures). Each is kept only where the accuracy gate allows it.
    WeightOnly(name="int4-b128", weight_bytes=0.5 + 4 / 128, bits=4, block_size=128,
               weights="int4 block-128 symmetric (int4-b128, MatMulNBits)"),
    WeightOnly(name="int4-b256", weight_bytes=0.5 + 4 / 256, bits=4, block_size=256,
               weights="int4 block-256 symmetric (int4-b256, MatMulNBits)"),
    Fp8(name="fp8", weight_bytes=1.0, engine_weights="fp8 e4m3 per output channel, fp32 scales (torch._scaled_mm)",
        engine_dtype="bf16", torch_dtype="bfloat16", engine_linears=FP8_PER_CHANNEL),
)}


def invariant_rows(name: str | None) -> int:
    """`Precision.invariant_rows` of the precision called `name`; 1 for one hotrod does not build (or None)."""
    precision = REGISTRY.get(name or "")
    return precision.invariant_rows if precision else 1


def get(name: str) -> Precision:
    """The precision called `name`; an unknown name is one line that lists the known ones."""
    return REGISTRY[check_choice("precision", name, tuple(REGISTRY))]


def half(name: str) -> Half:
    """The half precision called `name` (fp16 or bf16)."""
    return REGISTRY[check_choice("half precision", name, names(lambda p: isinstance(p, Half)))]  # type: ignore[return-value]


def names(where: Callable[[Precision], bool] | None = None) -> tuple[str, ...]:
    """The precisions' names, in the registry's order (those `where` accepts, if given)."""
    return tuple(name for name, precision in REGISTRY.items() if where is None or where(precision))
