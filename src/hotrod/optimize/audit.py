"""The fusions an encoder graph's layers should show, against the fused ops the graph holds.

ONNX Runtime's optimizer counts what it fused (`get_fused_operator_statistics`; hotrod records the same ops,
`hotrod.optimize.fusion.FUSED_OPS`, counted in the final graph, in each manifest entry). Those counts mean
little without what was due: an encoder layer (BERT's and its kin's) holds one attention, two norms and,
where its activation is a GELU, one GELU. On a GPU the norms should take their residual Add in
(SkipLayerNormalization) and the GELU its bias (BiasGelu, or FastGelu with its bias input); on the CPU
those two are left out on purpose (`hotrod.optimize.fusion.SLOWER_ON_CPU`), so there the plain fused norm
and GELU are what is due. `hotrod info` prints both, and names each fusion a layer lacks.
"""

from __future__ import annotations

from dataclasses import dataclass

_GELUS = ("Gelu", "FastGelu", "BiasGelu", "GemmFastGelu")
# Unfused ops (`hotrod.optimize.fusion.UNFUSED_MARKERS`) that mean the graph computes a GELU op by op.
_GELU_LEFT = ("Erf", "Pow")
CPU_NOTE = "on the CPU residual + norm and bias + GELU stay apart (faster there)"


@dataclass(frozen=True)
class Due:
    """One fusion each encoder layer should show: `per_layer` nodes of any of `ops`."""

    what: str
    ops: tuple[str, ...]
    per_layer: int


def encoder_dues(device: str) -> tuple[Due, Due, Due]:
    """Attention, two norms and a GELU a layer; on a GPU the norms with their residual and the GELU with its
    bias (see the module's docstring)."""
    if device == "cpu":
        norm = Due("layer norm", ("LayerNormalization", "SimplifiedLayerNormalization"), 2)
        gelu = Due("GELU", _GELUS, 1)
    else:
        norm = Due("skip layer norm", ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"), 2)
        gelu = Due("bias GELU", ("BiasGelu", "FastGelu", "GemmFastGelu"), 1)
    return Due("attention", ("Attention", "MultiHeadAttention"), 1), norm, gelu


@dataclass(frozen=True)
class Tally:
    what: str
    found: int
    needed: int

    @property
    def short(self) -> int:
        return max(0, self.needed - self.found)


def encoder_tallies(fused: dict[str, int], unfused: dict[str, int], layers: int, device: str) -> list[Tally]:
    """Each fusion due in an encoder graph of `layers` layers, found against needed. The GELU is due only
    where the graph computes one, fused or not (a ReLU network has none)."""
    attention, norm, gelu = encoder_dues(device)
    dues = [attention, norm]
    if any(fused.get(op) for op in _GELUS) or any(unfused.get(op) for op in _GELU_LEFT):
        dues.append(gelu)
    return [Tally(due.what, sum(fused.get(op, 0) for op in due.ops), due.per_layer * layers) for due in dues]


def tally_line(tallies: list[Tally], layers: int, device: str) -> str:
    """found/needed of each due fusion, then what did not fuse (or "all fused"), and on the CPU why the
    residual and bias fusions are not among them."""
    counts = ", ".join(f"{t.what} {t.found}/{t.needed}" for t in tallies)
    short = ", ".join(f"{t.what} in {t.short}" for t in tallies if t.short)
    line = f"{counts} (found/needed in {layers} layers); " + (f"not fused: {short}" if short else "all fused")
    return line + (f"; {CPU_NOTE}" if device == "cpu" else "")
