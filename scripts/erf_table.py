"""Prints the table of `src/hotrod/native/gelu_static.h`: Phi(z) = (1 + erf(z / sqrt 2)) / 2, the share of x
that GELU keeps, on [0, Z], Z = 3.925 sqrt 2 (the |x| where onnxruntime's erf clamps its argument, so its erf is
1 from there on), as 31 cubics in u, the position within each of 31 equal pieces, fit by interpolation at the
Chebyshev points (within a small factor of the best cubic); a 32nd piece is the constant 1, for every |x| from Z
on. The header's error bound is measured over every float the table serves (`scripts/gelu_near_error.c`); rerun
it, and `tests/runtime/test_gelu.py`, when the table changes."""

from __future__ import annotations

import math

import numpy as np

CLAMP = 3.925 * math.sqrt(2)  # |x| where onnxruntime's erf(x / sqrt 2) reaches its clamp (and is 1 in float32)
PIECES = 31  # and the constant piece: one two-register permute (VPERMT2PS) picks a coefficient among 32


def phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2)))


def table() -> np.ndarray:
    """Coefficients c0..c3 of each piece (rows), float32: Phi(z) ~ c0 + u (c1 + u (c2 + u c3))."""
    width = CLAMP / PIECES
    nodes = 0.5 - 0.5 * np.cos((2 * np.arange(4) + 1) * np.pi / 8)  # Chebyshev points of [0, 1]
    rows = [np.polyfit(nodes, [phi((piece + u) * width) for u in nodes], 3)[::-1] for piece in range(PIECES)]
    rows.append([1.0, 0.0, 0.0, 0.0])
    return np.array(rows, np.float32)


def main() -> None:
    print(f"#define HOTROD_GELU_PIECES_PER_X {float(np.float32(PIECES / CLAMP)):.9e}f /* {PIECES} / Z */")
    coefficients = table()
    for degree in range(4):
        values = [f"{float(v):.9e}f," for v in coefficients[:, degree]]
        print(f"    {{/* c{degree} */")
        for start in range(0, len(values), 6):
            print("     " + " ".join(values[start:start + 6]))
        print("    },")


if __name__ == "__main__":
    main()
