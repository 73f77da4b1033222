"""hotrod on a Ray cluster on loopback: a head and a second node, one replica on each.

Started as users start it (`ray start`, then `hotrod serve ... --ray ADDRESS`), the same requests must give
the same tokens through Ray's proxy as the model alone; a replica killed under load must end only the
requests it held, with a 5xx, while Ray brings it back; SIGTERM must drain and delete the application.
Every wait is bounded. Skipped where Ray Serve is not installed (`make test-ray` installs it and runs this).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'hotrod[ray]'; `make test-ray`)")

import httpx  # noqa: E402
import ray  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from ray import serve  # noqa: E402

import hotrod  # noqa: E402

BIN = Path(sys.executable).parent
START_S = 180  # a deployment: two replicas each loading and warming their models
CONCURRENT = 24
REQUEST_TIMEOUT = 20  # hotrod's 504; Ray's proxy ends a request lost with its replica 10 s later (408)
CLUSTER_METRICS: list[str] = []  # the nodes' metrics endpoints, set by the cluster fixture
NEW_TOKENS = 24


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_node(*args: str, env: dict[str, str]) -> int:
    """`ray start` in a session of its own: every process of the node it starts is in one process group,
    so that this node alone can be stopped (`ray stop` would end every Ray cluster on the machine)."""
    start = subprocess.Popen([str(BIN / "ray"), "start", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=env, start_new_session=True)
    output, _ = start.communicate(timeout=120)
    assert start.returncode == 0, output[-2000:]
    return start.pid


@pytest.fixture(scope="module")
def cluster():
    """A head and a second node on loopback, one CPU each: two one-CPU replicas land one per node."""
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="hr-ray-")  # short: Ray's socket paths must fit in 107 bytes
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}
    common = ["--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats"]
    exports = [_free_port(), _free_port()]  # each node's Prometheus endpoint for Ray's metrics
    groups = [_start_node("--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp}", *common,
                          f"--metrics-export-port={exports[0]}", env=env)]
    try:
        groups.append(_start_node(f"--address=127.0.0.1:{port}", *common, f"--metrics-export-port={exports[1]}",
                                  env=env))
        address = f"127.0.0.1:{port}"
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        CLUSTER_METRICS[:] = [f"http://127.0.0.1:{p}" for p in exports]
        yield address
    finally:
        ray.shutdown()
        for group in groups:
            _stop_node(group)
        shutil.rmtree(temp, ignore_errors=True)


def _stop_node(group: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


@pytest.fixture(scope="module")
def served(cluster, tmp_path_factory, zoo):
    """`hotrod serve gpt2 bert --ray ADDRESS --replicas 2` in the foreground, as a user runs it."""
    root = tmp_path_factory.mktemp("ray-artifacts")
    artifacts = [zoo.copy_artifact(name, root / name) for name in ("gpt2", "bert")]
    port = _free_port()
    log = open(root / "serve.log", "w+")
    process = subprocess.Popen([str(BIN / "hotrod"), "serve", *map(str, artifacts), "--ray", cluster,
                                "--replicas", "2", "--num-cpus", "1", "--port", str(port),
                                "--request-timeout", str(REQUEST_TIMEOUT)],
                               stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url, process, log)
    yield url, process, artifacts
    if process.poll() is None:
        process.kill()
        process.wait(30)
    log.close()


def _wait_ready(url: str, process: subprocess.Popen, log) -> None:
    """Until the command says it serves: Ray's proxy answers as soon as one replica runs, the command only
    once all of them do."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        log.seek(0)
        output = log.read()
        if process.poll() is not None:
            pytest.fail(f"hotrod serve --ray exited with {process.returncode}:\n{output[-3000:]}")
        if "hotrod: serving" in output and httpx.get(f"{url}/ready", timeout=5).status_code == 200:
            return
        time.sleep(1)
    pytest.fail("the Ray deployment did not become ready in time")


def _replicas() -> list[str]:
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"].startswith("SERVE_REPLICA::hotrod#"))


def _applications() -> dict:
    """Serve's applications on the cluster; none once Serve itself is shut down."""
    from ray.serve import context

    if not any(a["name"] == "SERVE_CONTROLLER_ACTOR" for a in ray.util.list_named_actors(all_namespaces=True)):
        return {}
    try:
        return serve.status().applications
    except ray.exceptions.ActorDiedError:  # a handle to the controller of an earlier Serve: find the new one
        context._disconnect()
        return serve.status().applications


def _running() -> int:
    app = _applications().get("hotrod")
    deployment = None if app is None else app.deployments.get("hotrod")
    return 0 if deployment is None else deployment.replica_states.get("RUNNING", 0)


def _prompts(count: int) -> list[list[int]]:
    return [[5 + i % 40, 6 + i % 13, 7 + i % 29, 9] for i in range(count)]


def _alone(artifact: Path, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt through the model itself, one at a time: what every served answer must equal."""
    model = hotrod.load(artifact)
    return [model.generate([p], max_new_tokens=NEW_TOKENS)[0, len(p):].tolist() for p in prompts]


async def _generate_all(url: str, prompts: list[list[int]], kill_after: float | None = None) -> list:
    async def one(client: httpx.AsyncClient, prompt: list[int]):
        body = {"model": "gpt2", "token_ids": prompt, "max_new_tokens": NEW_TOKENS}
        response = await client.post(f"{url}/v1/generate", json=body, timeout=120)
        return response.json()["token_ids"] if response.status_code == 200 else response.status_code

    async with httpx.AsyncClient() as client:
        tasks = [asyncio.create_task(one(client, p)) for p in prompts]
        if kill_after is not None:
            await asyncio.sleep(kill_after)
            ray.kill(ray.get_actor(_replicas()[0], namespace="serve"), no_restart=True)
        return await asyncio.gather(*tasks)


def _trim(tokens, eos: int = 0) -> list[int]:
    """Up to the end of sequence: the server does not send it, and `generate` pads after it."""
    return tokens[:tokens.index(eos)] if eos in tokens else tokens


def test_two_replicas_on_two_nodes_answer_as_the_model_alone(served):
    url, _, (gpt2, bert) = served
    assert _running() == 2 and len(_replicas()) == 2
    assert ray.available_resources().get("CPU", 0) == 0  # one replica per one-CPU node
    prompts = _prompts(CONCURRENT)
    got = asyncio.run(_generate_all(url, prompts))
    assert [_trim(t) for t in got] == [_trim(t) for t in _alone(gpt2, prompts)]
    infer = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [2, 4], "data": prompts[:2]}],
              "parameters": {"max_new_tokens": NEW_TOKENS}, "outputs": [{"name": "output_ids"}]}
    answer = httpx.post(f"{url}/v2/models/gpt2/infer", json=infer, timeout=60)  # the Open Inference Protocol
    assert answer.status_code == 200
    rows = answer.json()["outputs"][0]["data"]
    width = len(rows) // 2
    assert [_trim([t for t in rows[i * width:(i + 1) * width] if t != -1]) for i in range(2)] == \
        [_trim(t) for t in got[:2]]
    embedded = httpx.post(f"{url}/v1/embed", json={"model": "bert", "token_ids": [[2, 7, 8, 3]]}, timeout=60)
    expected = hotrod.load(bert).embed([[2, 7, 8, 3]], normalize=True)
    assert embedded.status_code == 200
    assert embedded.json()["embeddings"][0] == pytest.approx(expected[0].tolist(), abs=1e-5)


def _cluster_requests() -> tuple[float, set[str]]:
    """hotrod's generate requests as Ray's metrics count them, summed over nodes, and the replicas counted."""
    total, replicas = 0.0, set()
    for url in CLUSTER_METRICS:
        for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
            for sample in family.samples:
                if sample.name == "ray_hotrod_requests_total" and sample.labels.get("endpoint") == "generate":
                    total += sample.value
                    replicas.add(sample.labels["replica"])
    return total, replicas


def test_rays_metrics_sum_the_replicas(served):
    """Each replica's counts reach Ray's metrics, tagged with the replica: one scrape of the nodes sums them."""
    url, _, _ = served
    asyncio.run(_generate_all(url, _prompts(2 * CONCURRENT)))
    deadline = time.monotonic() + 60  # Ray exports on an interval
    while time.monotonic() < deadline and _cluster_requests()[0] < 2 * CONCURRENT:
        time.sleep(2)
    total, replicas = _cluster_requests()
    assert total >= 2 * CONCURRENT and len(replicas) == 2
    own = httpx.get(f"{url}/metrics", timeout=10).text  # one replica's own registry, which says whose it is
    assert "hotrod_replica_info{replica=" in own


def test_a_replica_killed_under_load_ends_only_its_requests_and_comes_back(served):
    url, _, (gpt2, _) = served
    before = _replicas()
    prompts = _prompts(4 * CONCURRENT)
    got = asyncio.run(_generate_all(url, prompts, kill_after=0.3))
    expected = _alone(gpt2, prompts)
    failed = [r for r in got if isinstance(r, int)]
    assert all(500 <= status < 600 or status == 408 for status in failed), failed  # 408: Ray's proxy timeout
    assert len(failed) < len(prompts)  # the other replica went on
    for answer, alone in zip(got, expected):
        if not isinstance(answer, int):
            assert _trim(answer) == _trim(alone)
    deadline, replaced = time.monotonic() + START_S, False
    # the state Ray reported when it had replaced the replica (asked again, a busy machine's health checks can
    # catch the new replica still warming up)
    while time.monotonic() < deadline and not (replaced := _running() == 2 and
                                               len(set(_replicas()) - set(before)) == 1):
        time.sleep(1)
    assert replaced, "Ray did not replace the replica"
    again = asyncio.run(_generate_all(url, prompts[:4]))
    assert [_trim(t) for t in again] == [_trim(t) for t in expected[:4]]


def test_sigterm_drains_and_deletes_the_application(served):
    url, process, _ = served
    pending = subprocess.Popen([sys.executable, "-c", _SLOW_REQUEST, url], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    assert process.wait(120) == 0
    assert pending.communicate(timeout=60)[0].strip() == "200"  # in flight at SIGTERM: finished, not dropped
    assert "hotrod" not in _applications()  # and Serve, which the command started, is shut down too


def test_a_serve_config_deploys_through_the_application_builder(cluster, served, tmp_path):
    """`serve run config.yaml`, as Ray users deploy: hotrod.serve.ray:app builds the application from args."""
    _, _, (gpt2, _) = served
    port = _free_port()
    config = tmp_path / "hotrod.yaml"
    config.write_text(f"""http_options: {{host: 127.0.0.1, port: {port}}}
applications:
  - name: hotrod
    route_prefix: /
    import_path: hotrod.serve.ray:app
    args: {{artifacts: ["{gpt2}"], replicas: 1, num_cpus: 1, max_batch_size: 8}}
""")
    log = open(tmp_path / "serve-run.log", "w+")
    runner = subprocess.Popen([str(BIN / "serve"), "run", "--address", cluster, str(config)], stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and _running() < 1:
            assert runner.poll() is None, log.seek(0) or log.read()[-3000:]
            time.sleep(1)
        assert _running() == 1
        prompts = _prompts(4)
        assert [_trim(t) for t in asyncio.run(_generate_all(url, prompts))] == \
            [_trim(t) for t in _alone(gpt2, prompts)]
    finally:
        os.killpg(runner.pid, signal.SIGINT)  # `serve run` deletes what it deployed on Ctrl-C
        try:
            runner.wait(60)
        except subprocess.TimeoutExpired:  # its teardown can outlast a minute on a loaded machine; serve.shutdown
            os.killpg(runner.pid, signal.SIGKILL)  # below removes what it deployed either way
            runner.wait(30)
        serve.shutdown()
        log.close()


_SLOW_REQUEST = """
import sys, httpx
body = {"model": "gpt2", "token_ids": [5, 6, 7], "max_new_tokens": 48}
print(httpx.post(sys.argv[1] + "/v1/generate", json=body, timeout=120).status_code)
"""
