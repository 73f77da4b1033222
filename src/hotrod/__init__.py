"""hotrod: Hugging Face transformers at real-time latency, with the same answers."""

from hotrod.api import load, optimize, verify
from hotrod.errors import HotrodError
from hotrod.options import OptimizeOptions
from hotrod.version import __version__

__all__ = ["HotrodError", "OptimizeOptions", "__version__", "load", "optimize", "verify"]
