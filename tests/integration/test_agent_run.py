"""``metainfer agent run`` against the real control plane, as the adaptation Job runs it.

Each test creates an AdaptationRun for the digits example model, runs the agent
as a subprocess with the control plane's kubeconfig (as a Job pod would, minus
the kubelet), and checks what the run's status and the HardwareProfile say.
``METAINFER_FAST_MEASURE=1`` shrinks the micro-benchmarks and latency loops so
a whole adaptation takes seconds.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from metainfer.agent.zoo import build_examples
from metainfer.core.api import GROUP, VERSION, AdaptationRun, AdaptationRunSpec, AdaptationRunStatus
from metainfer.core.api.hardwareclass import HardwareClass
from metainfer.core.api.hardwareprofile import profile_name
from metainfer.core.api.policy import DataReference, ModelSource, SearchSettings, Slo
from metainfer.core.api.run import MAX_TRIALS
from metainfer.core.engine.modelinfo import sha256_file
from metainfer.core.engine.recipe import COMPUTED_FIELDS, Recipe
from metainfer.core.engine.transforms import build_variant

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    built = build_examples(tmp_path_factory.mktemp("examples"), ["digits"])["digits"]
    return built.model_path, built.data_path


@pytest.fixture
def hw_class(control_plane: Any, namespace: str) -> Iterator[HardwareClass]:
    """A hardware class of its own per test, so profile reuse is observed in isolation; its profile is removed."""
    cls = HardwareClass(vendor="cpu", product=f"Agent-Test-{secrets.token_hex(3)}", cpu_features=("AVX2",))
    yield cls
    try:
        client.CustomObjectsApi(control_plane.api_client).delete_cluster_custom_object(
            GROUP, VERSION, "hardwareprofiles", profile_name(cls.fingerprint(), namespace)
        )
    except ApiException as exc:
        if exc.status != 404:
            raise


def make_run(
    name: str,
    cls: HardwareClass,
    uri: str,
    sha: str,
    data: DataReference | None = None,
    budget: int = 3,
    slo_p95_ms: float = 1000,
    max_memory_mib: int | None = None,
) -> dict[str, Any]:
    spec = AdaptationRunSpec(
        policy_name="digits",
        policy_generation=1,
        class_fingerprint=cls.fingerprint(),
        hardware_class=cls,
        class_description=cls.description(),
        model_sha256=sha,
        batch_size=1,
        reason="NewHardwareClass",
        model=ModelSource(uri=uri, sha256=sha, data=data),
        slo=Slo(latency_p95_ms=slo_p95_ms, max_quality_drop=0.05, batch_size=1, max_memory_mib=max_memory_mib),
        search=SearchSettings(trial_budget=budget, time_budget_seconds=60, algorithm="random", seed=1),
    )
    return AdaptationRun(metadata={"name": name}, spec=spec).to_api()


def create_run(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "adaptationruns", body, field_validation="Strict"
    )


def get(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, "adaptationruns", name)


def agent(
    kubeconfig: Path, namespace: str, name: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONSAFEPATH": "1",
        "METAINFER_FAST_MEASURE": "1",
        "NODE_NAME": "node-a",
        "NO_PROXY": "127.0.0.1,localhost",
        **(extra_env or {}),
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "metainfer.agent.cli",
            "agent",
            "run",
            f"{namespace}/{name}",
            "--kubeconfig",
            str(kubeconfig),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_run_succeeds_and_profile_is_reused(control_plane: Any, namespace: str, digits, hw_class) -> None:
    model, data = digits
    sha = sha256_file(model)
    reference = DataReference(uri=data.as_uri(), sha256=sha256_file(data), validation_samples=200)
    create_run(control_plane.api_client, namespace, make_run("first", hw_class, model.as_uri(), sha, reference))

    result = agent(control_plane.kubeconfig, namespace, "first")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    obj = get(control_plane.api_client, namespace, "first")
    status = obj["status"]
    assert status["phase"] == "Succeeded", status
    parsed = AdaptationRunStatus.model_validate(status)
    assert parsed.best_recipe is not None and isinstance(Recipe.model_validate(status["bestRecipe"]), Recipe)
    assert status["bestRecipeKey"] == parsed.best_recipe.key()
    assert status["bestMetrics"]["p95Ms"] > 0 and status["bestMetrics"]["qualityMetric"] == "top1_accuracy"
    assert 1 <= len(status["trials"]) <= min(MAX_TRIALS, 3 + 1)  # the budget plus the FP32 baseline
    assert status["progress"]["trialsCompleted"] == 3 and status["progress"]["stage"] == "Done"
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert status["hardwareProfileName"] == profile_name(hw_class.fingerprint(), namespace)
    assert status["completionTime"] and status["startTime"]
    for type_, value in (("Succeeded", "True"), ("Ready", "True"), ("Progressing", "False")):
        assert condition(status, type_)["status"] == value
    assert condition(status, "Succeeded")["reason"] == "Succeeded"

    profiles = client.CustomObjectsApi(control_plane.api_client)
    profile = profiles.get_cluster_custom_object(
        GROUP, VERSION, "hardwareprofiles", profile_name(hw_class.fingerprint(), namespace)
    )
    assert profile["status"]["profile"]["ops"] and profile["status"]["measuredAt"]
    assert profile["status"]["nodes"] == ["node-a"]
    assert condition(profile["status"], "Ready")["reason"] == "ProfileMeasured"

    # A second run of the same class reuses the profile: the object is not written again.
    create_run(control_plane.api_client, namespace, make_run("second", hw_class, model.as_uri(), sha, reference, 2))
    again = agent(control_plane.kubeconfig, namespace, "second")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "reused" in again.stdout and "measuring" not in again.stdout
    assert get(control_plane.api_client, namespace, "second")["status"]["phase"] == "Succeeded"
    after = profiles.get_cluster_custom_object(
        GROUP, VERSION, "hardwareprofiles", profile_name(hw_class.fingerprint(), namespace)
    )
    assert after["metadata"]["resourceVersion"] == profile["metadata"]["resourceVersion"]

    # A retried Job pod on a finished run does nothing.
    before = get(control_plane.api_client, namespace, "first")["metadata"]["resourceVersion"]
    rerun = agent(control_plane.kubeconfig, namespace, "first")
    assert rerun.returncode == 0 and "nothing to do" in rerun.stdout
    assert get(control_plane.api_client, namespace, "first")["metadata"]["resourceVersion"] == before


def test_wrong_sha256_fails_with_both_hashes(control_plane: Any, namespace: str, digits, hw_class) -> None:
    model, _ = digits
    wrong = "0" * 64
    create_run(control_plane.api_client, namespace, make_run("badsha", hw_class, model.as_uri(), wrong))
    result = agent(control_plane.kubeconfig, namespace, "badsha")
    assert result.returncode == 0, result.stdout + result.stderr  # deterministic: the status is the outcome
    assert "Traceback" not in result.stderr
    status = get(control_plane.api_client, namespace, "badsha")["status"]
    assert status["phase"] == "Failed"
    failed = condition(status, "Succeeded")
    assert failed["status"] == "False" and failed["reason"] == "ChecksumMismatch"
    assert wrong in failed["message"] and sha256_file(model) in failed["message"]
    assert "bestRecipe" not in status


def test_a_gpu_class_whose_ep_cannot_run_here_fails_instead_of_adapting_on_the_cpu(
    control_plane: Any, namespace: str, digits
) -> None:
    """This image's ONNX Runtime has no CUDA EP: a session asking for it would silently run on the CPU, and the run
    would report CPU latencies as the GPU's (issue 29, item 3). The run fails, naming the EPs and why."""
    model, _ = digits
    gpu = HardwareClass(vendor="nvidia", product=f"A100-Test-{secrets.token_hex(3)}", driver_version="550")
    create_run(control_plane.api_client, namespace, make_run("nogpu", gpu, model.as_uri(), sha256_file(model)))
    result = agent(control_plane.kubeconfig, namespace, "nogpu")
    assert result.returncode == 0, result.stdout + result.stderr  # deterministic: the status is the outcome
    status = get(control_plane.api_client, namespace, "nogpu")["status"]
    failed = condition(status, "Succeeded")
    assert status["phase"] == "Failed" and failed["reason"] == "ExecutionProviderUnavailable"
    assert "CUDAExecutionProvider" in failed["message"] and "has no" in failed["message"]
    assert "bestRecipe" not in status and not status.get("trials")
    try:
        client.CustomObjectsApi(control_plane.api_client).delete_cluster_custom_object(
            GROUP, VERSION, "hardwareprofiles", profile_name(gpu.fingerprint(), namespace)
        )
    except ApiException as exc:
        if exc.status != 404:
            raise


def test_corrupt_model_fails_invalid_model(control_plane: Any, namespace: str, tmp_path: Path, hw_class) -> None:
    corrupt = tmp_path / "model.onnx"
    corrupt.write_bytes(b"this is not an ONNX model\x00\x01" * 100)
    create_run(
        control_plane.api_client, namespace, make_run("corrupt", hw_class, corrupt.as_uri(), sha256_file(corrupt))
    )
    result = agent(control_plane.kubeconfig, namespace, "corrupt")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    status = get(control_plane.api_client, namespace, "corrupt")["status"]
    failed = condition(status, "Succeeded")
    assert status["phase"] == "Failed" and failed["reason"] == "InvalidModel"
    assert "not an ONNX model" in failed["message"] and "\n" not in failed["message"]
    assert failed["message"].startswith(corrupt.as_uri())


def test_bad_data_fails_invalid_data(control_plane: Any, namespace: str, tmp_path: Path, digits, hw_class) -> None:
    model, _ = digits
    bad = tmp_path / "data.npz"
    np.savez(bad, pixels=np.zeros((4, 64), dtype=np.float32))
    reference = DataReference(uri=bad.as_uri(), sha256=sha256_file(bad))
    create_run(
        control_plane.api_client, namespace, make_run("data", hw_class, model.as_uri(), sha256_file(model), reference)
    )
    result = agent(control_plane.kubeconfig, namespace, "data")
    assert result.returncode == 0, result.stdout + result.stderr
    failed = condition(get(control_plane.api_client, namespace, "data")["status"], "Succeeded")
    assert failed["reason"] == "InvalidData" and "pixels" in failed["message"] and bad.as_uri() in failed["message"]


def test_unreachable_slo_and_memory_fail_listing_the_closest(
    control_plane: Any, namespace: str, digits, hw_class
) -> None:
    """Nothing meets the p95 SLO and nothing fits 1 MiB: no FP32 fallback either (serving it could be OOM-killed)."""
    model, _ = digits
    body = make_run("fast", hw_class, model.as_uri(), sha256_file(model), budget=2, slo_p95_ms=0.0001,
                    max_memory_mib=1)  # fmt: skip
    create_run(control_plane.api_client, namespace, body)
    result = agent(control_plane.kubeconfig, namespace, "fast")
    assert result.returncode == 0, result.stdout + result.stderr
    status = get(control_plane.api_client, namespace, "fast")["status"]
    failed = condition(status, "Succeeded")
    assert status["phase"] == "Failed" and failed["reason"] == "NoFeasibleCandidate"
    assert "closest candidates" in failed["message"] and "> SLO 0.0001 ms" in failed["message"]
    assert status["trials"] and all(t["status"] != "feasible" for t in status["trials"])
    assert "bestRecipe" not in status


def test_a_latency_slo_nothing_meets_keeps_fp32_served_and_says_the_slo_is_unmet(
    control_plane: Any, namespace: str, digits, hw_class
) -> None:
    """Issue 65: FP32 missing only a latency SLO is still served (the class keeps serving), and the status says
    which SLO it misses, measured against its limit."""
    model, _ = digits
    body = make_run("slow", hw_class, model.as_uri(), sha256_file(model), budget=2, slo_p95_ms=0.0001)
    create_run(control_plane.api_client, namespace, body)
    result = agent(control_plane.kubeconfig, namespace, "slow")
    assert result.returncode == 0, result.stdout + result.stderr
    status = get(control_plane.api_client, namespace, "slow")["status"]
    done = condition(status, "Succeeded")
    assert status["phase"] == "Succeeded" and done["status"] == "True", status
    assert done["message"].startswith("SLO unmet") and "> SLO 0.0001 ms" in done["message"]
    assert status["bestRecipe"]["transform"]["quantization"]["mode"] == "fp32"
    assert status["bestVariantSha256"] and status["bestMetrics"]


def test_missing_file_fails_fetch(control_plane: Any, namespace: str, tmp_path: Path, hw_class) -> None:
    missing = (tmp_path / "absent.onnx").as_uri()
    create_run(control_plane.api_client, namespace, make_run("missing", hw_class, missing, "1" * 64))
    result = agent(control_plane.kubeconfig, namespace, "missing")
    assert result.returncode == 0, result.stdout + result.stderr
    failed = condition(get(control_plane.api_client, namespace, "missing")["status"], "Succeeded")
    assert failed["reason"] == "ModelFetchFailed" and "no such file" in failed["message"]


def test_configmap_source_with_synthetic_data(control_plane: Any, namespace: str, digits, hw_class) -> None:
    model, _ = digits
    payload = model.read_bytes()
    client.CoreV1Api(control_plane.api_client).create_namespaced_config_map(
        namespace,
        {"metadata": {"name": "digits"}, "binaryData": {"model.onnx": base64.b64encode(payload).decode()}},
    )
    body = make_run("cm", hw_class, "configmap://digits/model.onnx", sha256_file(model), budget=2)
    create_run(control_plane.api_client, namespace, body)
    result = agent(control_plane.kubeconfig, namespace, "cm")
    assert result.returncode == 0, result.stdout + result.stderr
    status = get(control_plane.api_client, namespace, "cm")["status"]
    assert status["phase"] == "Succeeded", status
    assert status["bestMetrics"]["qualityMetric"] == "cosine_similarity"
    assert "random inputs" in condition(status, "Succeeded")["message"]


@pytest.fixture
def http_dir(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTP server over a temp dir: (base URL, directory)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", tmp_path
    finally:
        server.shutdown()
        server.server_close()


def test_http_source_and_fetch_failures(control_plane: Any, namespace: str, digits, hw_class, http_dir) -> None:
    model, _ = digits
    base, root = http_dir
    (root / "model.onnx").write_bytes(model.read_bytes())
    sha = sha256_file(model)
    # A policy author may not point the agent at the pod's loopback (or metadata, link-local...): permanent.
    create_run(control_plane.api_client, namespace, make_run("local", hw_class, f"{base}/model.onnx", sha))
    result = agent(control_plane.kubeconfig, namespace, "local")
    assert result.returncode == 0, result.stdout + result.stderr
    refused = condition(get(control_plane.api_client, namespace, "local")["status"], "Succeeded")
    assert refused["reason"] == "ModelFetchFailed" and "127.0.0.1, a loopback address" in refused["message"]

    # The rest of this test serves from loopback, as a platform that allows it says so.
    allow = {"METAINFER_FETCH_ALLOW_CIDRS": "127.0.0.1/32"}
    create_run(control_plane.api_client, namespace, make_run("web", hw_class, f"{base}/model.onnx", sha, budget=1))
    result = agent(control_plane.kubeconfig, namespace, "web", allow)
    assert result.returncode == 0, result.stdout + result.stderr
    assert get(control_plane.api_client, namespace, "web")["status"]["phase"] == "Succeeded"

    # 404 is permanent: Failed, exit 0 (no pointless Job retries).
    create_run(control_plane.api_client, namespace, make_run("gone", hw_class, f"{base}/absent.onnx", sha))
    result = agent(control_plane.kubeconfig, namespace, "gone", allow)
    assert result.returncode == 0, result.stdout + result.stderr
    failed = condition(get(control_plane.api_client, namespace, "gone")["status"], "Succeeded")
    assert failed["reason"] == "ModelFetchFailed" and "404" in failed["message"]

    # Nothing listening is transient: the run stays Running with the reason, exit 75 so the Job retries.
    with socket_port() as port:
        uri = f"http://127.0.0.1:{port}/model.onnx"
    create_run(control_plane.api_client, namespace, make_run("down", hw_class, uri, sha))
    result = agent(control_plane.kubeconfig, namespace, "down", allow)
    assert result.returncode == 75, result.stdout + result.stderr
    status = get(control_plane.api_client, namespace, "down")["status"]
    retry = condition(status, "Succeeded")
    assert status["phase"] == "Running" and retry["status"] == "Unknown" and retry["reason"] == "ModelFetchFailed"
    assert "will retry" in retry["message"]


@contextlib.contextmanager
def socket_port() -> Iterator[int]:
    """A loopback port that nothing listens on once the block ends."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_unknown_run_and_bad_reference(control_plane: Any, namespace: str) -> None:
    assert agent(control_plane.kubeconfig, namespace, "nope").returncode == 2
    bad = subprocess.run(
        [sys.executable, "-m", "metainfer.agent.cli", "agent", "run", "no-slash"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        timeout=60,
    )
    assert bad.returncode == 2 and "NAMESPACE/RUN" in bad.stderr


def test_unreachable_api_server_is_transient(tmp_path: Path) -> None:
    with socket_port() as port:
        server = f"https://127.0.0.1:{port}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}', insecure-skip-tls-verify: true}}}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    result = agent(kubeconfig, "ns", "run")
    assert result.returncode == 75, result.stdout + result.stderr  # the Job retries
    assert "Traceback" not in result.stdout + result.stderr


def test_a_killed_agent_is_resumed_by_the_next_attempt_without_measuring_twice(
    control_plane: Any, namespace: str, tmp_path: Path, digits, hw_class
) -> None:
    """The Job's pod dies mid-search (SIGKILL: a drained node, the OOM killer). The next pod of the Job continues
    from status.checkpoint: it measures only the candidates the first did not, and the run ends with the budget."""
    model, data = digits
    sha = sha256_file(model)
    reference = DataReference(uri=data.as_uri(), sha256=sha256_file(data))
    create_run(control_plane.api_client, namespace, make_run("resumed", hw_class, model.as_uri(), sha, reference, 12))
    # The killed attempt's temporary files stay where a pod's would go with its emptyDir: in this test's directory.
    env = {**os.environ, "PYTHONSAFEPATH": "1", "METAINFER_FAST_MEASURE": "1", "NODE_NAME": "node-a",
           "NO_PROXY": "127.0.0.1,localhost", "TMPDIR": str(tmp_path)}  # fmt: skip
    argv = [sys.executable, "-m", "metainfer.agent.cli", "agent", "run", f"{namespace}/resumed",
            "--kubeconfig", str(control_plane.kubeconfig)]  # fmt: skip
    first = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            saved = (get(control_plane.api_client, namespace, "resumed").get("status") or {}).get("checkpoint") or {}
            if saved.get("trials", 0) >= 3 or first.poll() is not None:
                break
            time.sleep(0.2)
        assert first.poll() is None, "the first attempt finished before it could be killed"
        assert saved.get("trials", 0) >= 3, f"no checkpoint with 3 trials in time: {saved}"
    finally:
        first.kill()
        first.wait(timeout=30)
    status = get(control_plane.api_client, namespace, "resumed")["status"]
    assert status["phase"] == "Running" and status["checkpoint"]["trials"] >= 3

    again = agent(control_plane.kubeconfig, namespace, "resumed")
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = int(re.search(r"resuming: (\d+) trials", again.stdout).group(1))  # type: ignore[union-attr]
    assert resumed >= 3
    measured = re.findall(r"^metainfer agent: trial \d+/12: ", again.stdout, flags=re.MULTILINE)
    assert len(measured) == 12 - resumed, again.stdout  # nothing measured twice
    final = get(control_plane.api_client, namespace, "resumed")["status"]
    assert final["phase"] == "Succeeded" and final["progress"]["trialsCompleted"] == 12
    assert "checkpoint" not in final  # a finished run drops it


def test_the_validated_variant_is_stored_by_sha256_and_serving_loads_or_rebuilds_exactly_it(
    control_plane: Any, namespace: str, tmp_path: Path, digits, hw_class
) -> None:
    """Issue 14 item 6: serving pods used to re-quantize at every start, with nothing checking that they built the
    variant the Job had measured. (Rebuilding a static int8 recipe from its calibration samples is checked in
    test_serve.py.)"""
    from serve_harness import ServeProcess

    model, data = digits
    sha = sha256_file(model)
    reference = DataReference(uri=data.as_uri(), sha256=sha256_file(data), validation_samples=200)
    body = make_run("stored", hw_class, model.as_uri(), sha, reference, budget=2)
    create_run(control_plane.api_client, namespace, body)
    store = tmp_path / "store"
    result = agent(control_plane.kubeconfig, namespace, "stored", {"METAINFER_VARIANT_STORE": str(store)})
    assert result.returncode == 0, result.stdout + result.stderr
    status = get(control_plane.api_client, namespace, "stored")["status"]
    recipe = Recipe.model_validate(status["bestRecipe"])
    variant_sha = status["bestVariantSha256"]
    stored = store / "sha256" / f"{variant_sha}.onnx"
    assert stored.is_file() and sha256_file(stored) == variant_sha, "the Job keeps the bytes it validated"

    def serve(*extra: str) -> ServeProcess:
        served = ServeProcess(tmp_path)
        served.start([
            "serve", "--model-uri", model.as_uri(), "--model-sha256", sha,
            "--recipe-json", recipe.model_dump_json(exclude=set(COMPUTED_FIELDS)),
            "--data-uri", data.as_uri(), "--data-sha256", reference.sha256 or "",
            "--calibration-samples", str(reference.calibration_samples),
            "--host", "127.0.0.1", "--port", str(served.port), "--variant-sha256", variant_sha, *extra,
        ], {})  # fmt: skip
        return served

    for extra, words in ((["--variant-store", str(store)], "loaded from the store"), ([], "building variant")):
        served = serve(*extra)
        try:
            served.wait_ready()
            log_text = served.log.read_text()
            assert words in log_text and f"ready: variant sha256 {variant_sha}" in log_text, log_text[-2000:]
        finally:
            served.stop()

    stored.chmod(0o644)
    stored.write_bytes(b"not the validated bytes")  # a corrupt store copy: ignored, rebuilt, still the same bytes
    served = serve("--variant-store", str(store))
    try:
        served.wait_ready()
        assert "the variant will be rebuilt" in served.log.read_text()
    finally:
        served.stop()

    served = serve("--variant-sha256", "0" * 64)  # the last flag wins: a sha the rebuild cannot match
    assert served.proc is not None and served.proc.wait(timeout=60) == 2
    assert f"but the adaptation validated {'0' * 64}" in served.log.read_text()


def test_an_openvino_variant_is_stored_compiled_and_serving_imports_it_instead_of_compiling(
    tmp_path: Path, digits, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30 item 3: what the Job stores for a variant it ships on OpenVINO (the bytes, and the blob OpenVINO
    compiled) lets a serving pod import instead of compiling; a missing or damaged blob is compiled, never imported.
    (A Job choosing OpenVINO on the real node, with a PVC: tests/e2e/test_chart_upgrade_e2e.py.)"""
    pytest.importorskip("openvino")
    from serve_harness import ServeProcess

    from metainfer.agent import run, variant_store

    model, _ = digits
    sha = sha256_file(model)
    recipe = Recipe.model_validate({"session": {"runtime": "openvino"}})
    store = tmp_path / "store"
    monkeypatch.setenv(variant_store.ENV, str(store))
    variant = build_variant(model.read_bytes(), recipe.transform, None)
    variant_sha, _ = variant_store.put(store, variant)
    assert run._store_compiled(variant, variant_sha, recipe) is None
    (cache,) = (store / "openvino-cache").iterdir()

    def serve() -> str:
        served = ServeProcess(tmp_path)
        served.start([
            "serve", "--model-uri", model.as_uri(), "--model-sha256", sha, "--recipe-json", recipe.model_dump_json(),
            "--host", "127.0.0.1", "--port", str(served.port), "--variant-sha256", variant_sha,
            "--variant-store", str(store),
        ], {})  # fmt: skip
        try:
            served.wait_ready()
            return served.log.read_text()
        finally:
            served.stop()

    assert "OpenVINO model imported from the store's compiled cache" in serve()
    blob = next(p for p in cache.iterdir() if p.suffix == ".blob")
    cache.chmod(0o755)
    blob.chmod(0o644)
    blob.write_bytes(blob.read_bytes()[:-16])  # truncated: ignored, compiled, still served
    log_text = serve()
    assert "does not match its manifest" in log_text and "OpenVINO model compiled" in log_text, log_text[-2000:]


def test_an_ended_run_keeps_its_trials_and_a_later_run_starts_from_them(
    control_plane: Any, namespace: str, digits, hw_class
) -> None:
    """Issue 17: the trials outlive the run (status.trialHistory, in the API server), and a run whose spec names
    it in historyFrom hands them to its search, saying in its status where they came from."""
    model, data = digits
    sha = sha256_file(model)
    reference = DataReference(uri=data.as_uri(), sha256=sha256_file(data), validation_samples=200)
    first = make_run("cold", hw_class, model.as_uri(), sha, reference, budget=6)
    first["spec"]["search"]["algorithm"] = "hybrid"
    create_run(control_plane.api_client, namespace, first)
    assert agent(control_plane.kubeconfig, namespace, "cold").returncode == 0
    cold = AdaptationRunStatus.model_validate(get(control_plane.api_client, namespace, "cold")["status"])
    assert cold.trial_history is not None and cold.trial_history.trials >= 1 and cold.history is None

    later = make_run("warm", hw_class, model.as_uri(), sha, reference, budget=6)
    later["spec"]["search"]["algorithm"] = "hybrid"
    later["spec"]["historyFrom"] = ["cold", "gone"]  # a run that no longer exists is left out, not fatal
    create_run(control_plane.api_client, namespace, later)
    result = agent(control_plane.kubeconfig, namespace, "warm")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "history: run gone left out" in result.stdout and "history: 1 of 2 earlier runs" in result.stdout
    warm = AdaptationRunStatus.model_validate(get(control_plane.api_client, namespace, "warm")["status"])
    assert warm.phase == "Succeeded" and warm.history is not None, warm
    (source,) = warm.history.sources
    assert source.run == "cold" and source.similarity == 1.0 and source.trials == cold.trial_history.trials
    assert warm.history.from_classes == hw_class.description()
    assert "warm start" in (warm.history.note or "")


def test_a_decoder_run_measures_tokens_ships_a_variant_and_serving_streams_from_the_stored_bytes(
    control_plane: Any, namespace: str, tmp_path: Path, hw_class
) -> None:
    """Issue 66: a decoder's AdaptationRun adapts it on its own workload (TTFT, time per output token, perplexity
    against FP32), reports per-token metrics, stores the variant, and serve streams tokens from exactly it."""
    import http.client
    import json as json_module

    from serve_harness import ServeProcess

    from metainfer.agent.zoo.decoder import build_tiny_decoder
    from metainfer.core.api.policy import DecoderSlo

    model = tmp_path / "tiny.onnx"
    model.write_bytes(build_tiny_decoder())
    sha = sha256_file(model)
    body = make_run("decoder", hw_class, model.as_uri(), sha, budget=3)
    decoder = DecoderSlo(prompt_tokens=16, decode_tokens=8, concurrency=2, max_perplexity_rise=1.0)
    body["spec"]["slo"] = {"decoder": decoder.model_dump(mode="json", by_alias=True), "maxQualityDrop": 0.05,
                           "batchSize": 1}  # fmt: skip
    create_run(control_plane.api_client, namespace, body)
    store = tmp_path / "store"
    result = agent(control_plane.kubeconfig, namespace, "decoder", {"METAINFER_VARIANT_STORE": str(store)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "trial: " in result.stdout + result.stderr
    status = get(control_plane.api_client, namespace, "decoder")["status"]
    done = condition(status, "Succeeded")
    assert status["phase"] == "Succeeded" and done["status"] == "True", status
    assert "TTFT p95" in done["message"] and "perplexity" in done["message"]
    assert status["bestMetrics"]["qualityMetric"] == "perplexity_rise" and status["bestMetrics"]["p95Ms"] > 0
    assert len(status["trials"]) == 3 and status["bestVariantSha256"]
    recipe = Recipe.model_validate(status["bestRecipe"])

    served = ServeProcess(tmp_path)
    served.start([
        "serve", "--model-uri", model.as_uri(), "--model-sha256", sha,
        "--recipe-json", recipe.model_dump_json(exclude=set(COMPUTED_FIELDS)), "--host", "127.0.0.1",
        "--port", str(served.port), "--variant-sha256", status["bestVariantSha256"], "--variant-store", str(store),
    ], {})  # fmt: skip
    try:
        served.wait_ready()
        assert "loaded from the store" in served.log.read_text()
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
        connection.request("POST", "/v1/completions", json_module.dumps(
            {"prompt": "Objects are", "max_tokens": 6, "temperature": 0, "stream": True}))  # fmt: skip
        response = connection.getresponse()
        events = [line for line in response.read().decode().split("\n") if line.startswith("data: ")]
        assert response.status == 200 and events[-1] == "data: [DONE]" and len(events) >= 2
    finally:
        served.stop()
