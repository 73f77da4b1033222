"""Reading a source: a local Hugging Face checkpoint directory or a hub id.

Weights come from safetensors (single or sharded) or, for old checkpoints, from pytorch_model.bin
through `torch.load(weights_only=True)`, which refuses pickled code. No `trust_remote_code`: the
family is chosen by `model_type` from hotrod's own registry.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from hotrod.errors import HotrodError, first_line
from hotrod.files import file_sha256, inside
from hotrod.models import get_family
from hotrod.pipelines.activation import recorded_in_files
from hotrod.registry import Family
from hotrod.tasks import TASK_KEY, check_task
from hotrod.tasks.registry import read_files

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLED = "pytorch_model.bin"
PICKLED_INDEX = "pytorch_model.bin.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "spiece.model")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "merges.txt"]


@dataclass(frozen=True)
class Source:
    """A checkpoint on local disk, with the string the user gave to find it."""

    origin: str
    path: Path
    from_hub: bool
    config: object
    family: Family


def open_source(source: str | Path, task: str | None = None) -> Source:
    """Find the checkpoint (downloading a hub id), read its config and pick its family; `task` overrides the
    head its `architectures` names (`hotrod.tasks`). A head the family does not run is refused here."""
    origin = str(source)
    path = Path(origin).expanduser()
    from_hub = False
    if not path.exists():
        if _looks_like_path(origin) or not _HUB_ID.match(origin):
            raise HotrodError(f"no such model directory: {origin}")
        path, from_hub = _download(origin), True
    if not path.is_dir():
        raise HotrodError(f"not a model directory: {origin}")
    if (path / "manifest.json").is_file():  # an artifact (ONNX graphs or engine weights) where a checkpoint is asked
        raise HotrodError(f"{origin} is a hotrod artifact, not a checkpoint: build from the checkpoint it was made "
                          "from, or load the artifact itself")
    if any(path.glob("*.onnx")) and not any(path.glob("*.safetensors")) and not any(path.glob("pytorch_model*.bin")):
        raise HotrodError(f"{origin} holds ONNX graphs but no manifest.json: an incomplete or damaged artifact")
    config = read_config(path)
    family = get_family(config.model_type)
    if task is not None:
        asked = getattr(config, TASK_KEY, None)  # what its own files say (a SparseEncoder's modules)
        if asked and asked != task:
            raise HotrodError(f"{origin} is a {asked} model (its own files say so), so it cannot be built for {task}")
        setattr(config, TASK_KEY, check_task(task, family))
    family.dims(config)  # the head: supported, and as wide as the label map
    return Source(origin=origin, path=path, from_hub=from_hub, config=config, family=family)


def read_config(path: Path):
    """Check `model_type` against the registry before transformers sees it, then parse the config; what the
    checkpoint's own files say of its task goes on it too (`hotrod.tasks.registry.read_files`)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise HotrodError(f"{path} has no config.json; is it a Hugging Face checkpoint?")
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise HotrodError(f"cannot read {config_file}: {exc}") from None
    if not isinstance(raw, dict):
        raise HotrodError(f"cannot read {config_file}: a JSON object was expected, got {type(raw).__name__}")
    get_family(raw.get("model_type"))
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError, TypeError) as exc:
        raise HotrodError(f"cannot parse {config_file}: {first_line(exc)}") from None
    read_files(path, config)  # the task its own files beside the config ask for, and its settings
    for key, value in (recorded_in_files(path) or {}).items():  # a CrossEncoder's activation (sentence-transformers 6)
        setattr(config, key, value)
    return config


def weight_files(path: Path) -> list[Path]:
    """The checkpoint's weight files, preferring safetensors; raises if there are none."""
    for index_name, single in ((SAFETENSORS_INDEX, SAFETENSORS), (PICKLED_INDEX, PICKLED)):
        index = path / index_name
        if index.is_file():
            files = _shards(path, index)
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise HotrodError(f"{path} is missing weight shard(s): {', '.join(missing)}")
            return files
        if (path / single).is_file():
            return [path / single]
    raise HotrodError(f"{path} has no weights (expected {SAFETENSORS}, sharded safetensors or {PICKLED})")


def _shards(path: Path, index: Path) -> list[Path]:
    """The shard files an index names, each a file of the checkpoint itself (never a path leading elsewhere)."""
    try:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HotrodError(f"cannot read {index}: {exc}") from None
    if not all(isinstance(name, str) for name in names):
        raise HotrodError(f"cannot read {index}: its weight_map must map tensor names to file names")
    return [inside(path, name, str(index)) for name in names]


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        state.update(_read_weights(file))
    return state


def _read_weights(file: Path) -> dict[str, torch.Tensor]:
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(file))
        _check_safe_unpickling(file)
        return torch.load(file, map_location="cpu", weights_only=True)
    except HotrodError:
        raise
    except Exception as exc:  # noqa: BLE001  (any parse failure means a corrupt or unsafe file)
        raise HotrodError(f"cannot read weights {file}: {first_line(exc)}") from None


SAFE_TORCH = "2.6"  # torch.load(weights_only=True) could be made to run code before this (CVE-2025-32434)


def _check_safe_unpickling(file: Path) -> None:
    """Refuse a pickled checkpoint when this torch's `weights_only` loader is known to be bypassable."""
    from torch.torch_version import TorchVersion

    if TorchVersion(str(torch.__version__)) < SAFE_TORCH:
        raise HotrodError(f"{file.name} is a pickled checkpoint, which torch {torch.__version__} cannot load "
                          f"safely; install torch >= {SAFE_TORCH} or convert the checkpoint to safetensors")


def weights_sha256(path: Path) -> str:
    """One hash over every weight file, so an artifact names exactly the weights it came from."""
    digest = hashlib.sha256()
    for file in weight_files(path):
        digest.update(file.name.encode())
        digest.update(file_sha256(file).encode())
    return digest.hexdigest()


def cache_dir() -> Path:
    """Where hotrod keeps what it builds on its own (exports of checkpoints, workload checkpoints, the demo)."""
    return Path(os.environ.get("HOTROD_CACHE", Path.home() / ".cache" / "hotrod"))


def source_fingerprint(path: Path) -> str:
    """A hash of everything an export reads: the weights, and every config and tokenizer file."""
    digest = hashlib.sha256(weights_sha256(path).encode())
    for file in sorted(path.iterdir()):
        if file.is_file() and file.suffix in (".json", ".txt", ".model") and not file.name.endswith(".index.json"):
            digest.update(file.name.encode())
            digest.update(file_sha256(file).encode())
    from hotrod.pipelines.sentence import SentencePipeline  # below source.py's readers, imported when needed

    pipeline = SentencePipeline.read(path)  # its module folders' configs and weights change the vectors too
    for name in pipeline.files if pipeline else ():
        if "/" in name:
            digest.update(name.encode())
            digest.update(file_sha256(path / name).encode())
    return digest.hexdigest()


def has_tokenizer(path: Path) -> bool:
    return any((path / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(path: Path):
    """The checkpoint's tokenizer as transformers builds it, or None when it ships without one."""
    if not has_tokenizer(path):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError, TypeError) as exc:
        raise HotrodError(f"cannot load the tokenizer in {path}: {first_line(exc)}") from None


def load_generation_config(path: Path, config):
    """generation_config.json if present; else, as transformers' from_pretrained reads it, the generation
    settings an older checkpoint keeps in config.json (BART's num_beams, max_length, no_repeat_ngram_size...),
    which the loaded model config no longer carries."""
    from transformers import GenerationConfig

    for name, options in (("generation_config.json", {}),
                          ("config.json", {"config_file_name": "config.json", "_from_model_config": True})):
        if (path / name).is_file():
            try:
                return GenerationConfig.from_pretrained(path, **options)
            except (OSError, ValueError) as exc:
                raise HotrodError(f"cannot read {path / name}: {first_line(exc)}") from None
    return GenerationConfig.from_model_config(config)


def _looks_like_path(text: str) -> bool:
    return text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text


def _download(repo_id: str) -> Path:
    """Fetch config, tokenizer and weights (safetensors when the repo has them) from the hub."""
    from huggingface_hub import HfApi, snapshot_download

    try:  # already in the local hub cache: no network needed
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS + ["pytorch_model*.bin"], local_files_only=True))
    except Exception:  # noqa: BLE001  (not cached: go online below)
        pass
    try:
        files = HfApi().list_repo_files(repo_id)
        patterns = list(_HUB_PATTERNS)
        if not any(f.endswith(".safetensors") for f in files):
            patterns.append("pytorch_model*.bin")
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as exc:  # noqa: BLE001  (offline, unknown repo, gated repo, rate limit...)
        raise HotrodError(
            f"cannot download {repo_id!r} from the Hugging Face hub ({first_line(exc)}); "
            "give a local checkpoint directory or connect to the hub"
        ) from None
