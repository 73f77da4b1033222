"""llama.cpp as a bench peer, in a process of its own (started with hotrod's own Python).

llama.cpp runs its threads with GNU OpenMP, and CTranslate2 brings Intel's OpenMP runtime: once both
are loaded in one process, llama.cpp's parallel regions ran several times slower (the two runtimes'
threads contend for the same cores). Each peer with a native runtime of its
own is therefore timed in its own process, as the OpenVINO worker is.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch


class Peer:
    """One GGUF format of a checkpoint, loaded by llama.cpp, answering for one case's inputs."""

    def __init__(self, name: str, source: str, kind: str, lengths: tuple[int, ...], new_tokens: int, format: str,
                 threads: int, ids: np.ndarray, mask: np.ndarray):
        from hotrod.bench import llamacpp
        from hotrod.bench.case import Case

        case = Case(name, source, kind, tuple(lengths), new_tokens)
        self.path = llamacpp.quantized(source, kind, format, threads)
        self.runner = llamacpp.Runner(self.path, case, torch.from_numpy(ids), torch.from_numpy(mask), threads)

    def info(self) -> dict:
        return {"size_bytes": self.path.stat().st_size}

    def call(self, first: bool) -> np.ndarray:
        output = self.runner.generate(1) if first else self.runner.call()
        return output.numpy()


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))  # the loop beside this file (-I leaves it off the path)
    from loop import serve

    serve(Peer)


if __name__ == "__main__":
    main()
