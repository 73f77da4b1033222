"""What `hotrod bench --device cuda` needs beyond the CPU path: a device check before any work, and the
device memory each system adds. The timing itself waits for the GPU (`hotrod.timing.synchronized`).
"""

from __future__ import annotations

import torch

from hotrod.errors import HotrodError
from hotrod.options import DEVICES, check_choice


def check_device(device: str) -> None:
    """Refuses a device this machine cannot run on, before any work is done."""
    check_choice("device", device, DEVICES)
    if device == "cuda" and not torch.cuda.is_available():
        raise HotrodError(f"--device cuda, but this torch ({torch.__version__}) sees no CUDA device; "
                          "run on a machine with one, or use --device cpu")


def ort_has_cuda() -> bool:
    """Whether this onnxruntime is a GPU build; without one, hotrod runs on CUDA through its torch backend."""
    from hotrod.runtime.ort_sessions import providers_for

    try:
        providers_for("cuda")
    except HotrodError:
        return False
    return True


def gpu_start(device: str) -> int:
    """Device memory in use before a system is built (after handing cached blocks back), 0 on CPU."""
    if device != "cuda":
        return 0
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    free, total = torch.cuda.mem_get_info()
    return total - free


def gpu_figures(device: str, start: int) -> dict:
    """What a system added to device memory by loading and its first call: counted by the driver, so
    onnxruntime's and CTranslate2's allocations count too; torch's own peak is reported beside it."""
    if device != "cuda":
        return {}
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {"gpu_memory_bytes": total - free - start, "gpu_torch_peak_bytes": torch.cuda.max_memory_allocated()}
