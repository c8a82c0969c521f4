"""Operator scale on the real control plane: convergence time, API requests, peak RSS, reaction time.

For each node count a fresh control plane (etcd + kube-apiserver from hack/controlplane, with a
Metadata-level audit log) gets N Node objects in 20 hardware classes and P AdaptationPolicies;
then the real operator process starts (``metainfer operator``, as the integration harness runs it).

* convergence: from spawning the operator process (nodes and policies already exist, as after an
  operator restart) until every expected AdaptationRun (P x 20) exists, and until every run's Job
  exists, as seen by a watch of this benchmark;
* API requests: counted in kube-apiserver's audit log, which records every request whatever the
  client thinks it sent; the operator's are those not made by the control plane or this benchmark
  (which uses its own user agent), from spawn until the operator has made no write for 3 s;
* peak RSS: VmHWM of the operator process after everything, reactions included, and VmRSS by phase
  (first run created, all runs, all Jobs);
* CPU: user + system seconds of each process (and of the operator's event-loop thread) while it
  converges; with ``--profile``, one more converge under cProfile says where that loop's time goes
  (bench/scale_profile.py);
* reaction: one node's driver label changes to a version no class has, so it forms a new class;
  from the label patch until the first and until the P-th run of that class exist, and the
  operator's requests for the change (until 3 s without a write). Each repetition moves the same
  node to yet another driver, so the previous repetition's class vanishes and its unfinished runs
  are deleted: that is part of what one label change costs.

No kubelet runs, so Jobs never start and every run stays Pending: the cluster-wide limit of runs in
flight (METAINFER_MAX_CONCURRENT_RUNS) is raised above P x classes, otherwise only that many runs
could ever exist and "all runs created" would measure the limiter, not the operator.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from bench import benchlib, scale_profile
from bench import scale_lib as sl
from hack.controlplane import assets, crds, launch
from metainfer.core.api import GROUP, VERSION
from metainfer.core.control.hardware import classify_node

NAMESPACE = "scale"
AGENT_ACCOUNT = "metainfer-agent"  # OperatorConfig's default agent_service_account
QUIET_S = 3.0  # the operator is done with a change once it made no write for this long
FULL = {"nodes": [100, 250, 500, 1000], "policies": 100, "reactions": 5}
QUICK = {"nodes": [100, 1000], "policies": 20, "reactions": 3}
TARGET_CONVERGE_S, TARGET_RSS_MB = 10.0, 200.0
TITLE = "Operator scale on the real control plane"


def log(message: str) -> None:
    print(f"[operator-scale {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Watcher:
    """First-seen times of AdaptationRuns (with their class) and Jobs in the namespace, by name."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.runs: dict[str, tuple[float, str]] = {}
        self.jobs: dict[str, float] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
        runs_list = (custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, "adaptationruns"))
        jobs_list = (batch.list_namespaced_job, (namespace,))
        self.threads = [
            threading.Thread(target=self._loop, args=(*runs_list, self._on_run), daemon=True),
            threading.Thread(target=self._loop, args=(*jobs_list, self._on_job), daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _on_run(self, obj: Any) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            self.runs.setdefault(name, (time.monotonic(), obj["spec"]["classFingerprint"]))

    def _on_job(self, obj: Any) -> None:
        with self.lock:
            self.jobs.setdefault(obj.metadata.name, time.monotonic())

    def _loop(self, list_fn: Callable[..., Any], args: tuple[Any, ...], on_add: Callable[[Any], None]) -> None:
        while not self._stop.is_set():
            try:
                for event in watch.Watch().stream(list_fn, *args, timeout_seconds=30):
                    if event["type"] == "ADDED":
                        on_add(event["object"])
                    if self._stop.is_set():
                        return
            except Exception as exc:  # a dropped watch re-lists: ADDED is replayed, setdefault keeps first times
                log(f"watch restarted: {exc}")
                time.sleep(0.2)

    def counts(self, fingerprint: str | None = None) -> tuple[int, int]:
        with self.lock:
            runs = sum(1 for _, fp in self.runs.values() if fingerprint is None or fp == fingerprint)
            return runs, len(self.jobs)

    def run_times(self, fingerprint: str) -> list[float]:
        with self.lock:
            return sorted(t for t, fp in self.runs.values() if fp == fingerprint)

    def stop(self) -> None:
        self._stop.set()


class Audit:
    """Incremental reader of the audit log: requests since a mark."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def operator_since(self, offset: int) -> list[sl.Request]:
        with self.path.open("rb") as f:
            f.seek(offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1].decode(errors="replace")
        return [r for r in sl.parse_audit(complete.splitlines()) if sl.is_operator(r)]

    def wait_quiet(self, offset: int, timeout_s: float) -> list[sl.Request]:
        """The operator's requests since ``offset``, once it has made no write for QUIET_S."""
        deadline = time.monotonic() + timeout_s
        last_writes, quiet_since = -1, time.monotonic()
        while True:
            requests = self.operator_since(offset)
            writes = len(sl.mutating(requests))
            if writes != last_writes:
                last_writes, quiet_since = writes, time.monotonic()
            elif time.monotonic() - quiet_since >= QUIET_S or time.monotonic() > deadline:
                return requests
            time.sleep(0.5)


def wait_until(what: str, predicate: Callable[[], bool], timeout_s: float, proc: subprocess.Popen[bytes]) -> float:
    """Monotonic time at which ``predicate`` first held (polled every 50 ms)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            raise RuntimeError(f"the operator exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic()


def vm_mb(pid: int, field: str) -> float:
    """A memory figure of /proc/<pid>/status in MB: VmRSS (resident now) or VmHWM (the peak of it)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def vm_hwm_mb(pid: int) -> float:
    return vm_mb(pid, "VmHWM")


# The operator's main thread: its asyncio event loop, which runs kopf and every reconcile. Its other threads run
# the API requests (the client is synchronous) and kopf's executor. Not a process: left out of the sums.
LOOP_THREAD = "operator event loop"


def _stat_cpu(path: Path) -> float:
    # The command name (field 2) may hold spaces; the fields after its closing parenthesis do not.
    fields = path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15 of stat(5)


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds each process has used so far (its threads included), from /proc/<pid>/stat, and
    the operator's event-loop thread alone (/proc/<pid>/task/<pid>/stat) when the operator runs."""
    used = {name: _stat_cpu(Path(f"/proc/{pid}/stat")) for name, pid in pids.items()}
    if "operator" in pids:
        used[LOOP_THREAD] = _stat_cpu(Path(f"/proc/{pids['operator']}/task/{pids['operator']}/stat"))
    return used


def cpu_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before.get(name, 0.0) for name in after}


def api_client(kubeconfig: Path) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = 16
    api = client.ApiClient(cfg)
    api.user_agent = sl.BENCH_USER_AGENT
    return api


def start_operator(
    kubeconfig: Path,
    logfile: Path,
    max_runs: int,
    mapping: Path | None,
    profile: Path | None = None,
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PYTHONSAFEPATH": "1",
        "METAINFER_WAIT_FOR_AVAILABLE": "false",
        "METAINFER_METRICS_PORT": "0",
        "METAINFER_MAX_CONCURRENT_RUNS": str(max_runs),
        # Every policy lives in one namespace here: its share must not hold creation back either.
        "METAINFER_MAX_CONCURRENT_RUNS_PER_NAMESPACE": str(max_runs),
        "METAINFER_PEERING_NAME": "metainfer-scale",
        # A class new to a policy waits this long for its nodes' labels to hold still (30 s by default): a wait the
        # operator chooses, not work it does, so it would be most of every figure here.
        "METAINFER_CLASS_SETTLE_SECONDS": "0",
        # The nodes are NVIDIA's: as the chart's defaults do, their classes run the CUDA flavour (not refused).
        "METAINFER_AGENT_IMAGES": '{"nvidia": {"image": "metainfer:scale-cuda"}}',
    }
    if mapping is not None:
        env["METAINFER_LABEL_MAPPING_FILE"] = str(mapping)
    cmd = [sys.executable, "-m", "metainfer.agent.cli", "operator", "-n", NAMESPACE, "--liveness", ""]
    if profile is not None:  # where the event loop's CPU goes: written when it exits on SIGTERM; slows it
        cmd[1:1] = ["-m", "cProfile", "-o", str(profile)]
    with logfile.open("wb") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)


def audit_seconds(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp()


def measure(
    nodes: int,
    policies: int,
    reactions: int,
    found: Any,
    documents: list[dict[str, Any]],
    workaround: bool,
    profile: Path | None = None,
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"metainfer-scale-{nodes}-"))
    mapping = None
    if workaround:
        mapping = root / "label-mapping.json"
        mapping.write_text(json.dumps(sl.mapping_without_gpu_resource()))
    plane = launch.start(
        root, found, log=log, controller_manager=False, die_with_parent=True, crd_documents=documents, audit=True
    )
    assert plane.audit_log is not None
    audit = Audit(plane.audit_log)
    api = api_client(plane.kubeconfig)
    proc: subprocess.Popen[bytes] | None = None
    watcher: Watcher | None = None
    try:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        # As the chart leaves a workload namespace: the agent's ServiceAccount exists (the operator checks before
        # each Job, and warns on every reconcile where it is missing).
        core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": AGENT_ACCOUNT}})
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: core.create_node(sl.node_manifest(i)), range(nodes)))
            list(
                pool.map(
                    lambda i: custom.create_namespaced_custom_object(
                        GROUP, VERSION, NAMESPACE, "adaptationpolicies", sl.policy_manifest(NAMESPACE, i, 64)
                    ),
                    range(policies),
                )
            )
        expected = policies * sl.CLASSES
        log(f"{nodes} nodes, {policies} policies created; starting the operator (expects {expected} runs)")
        watcher = Watcher(api, NAMESPACE)
        time.sleep(1.0)  # both watches established before the operator's first write
        offset = audit.mark()
        # Who uses the machine's cores while it converges: the operator, the control plane, this benchmark's watch.
        watched = {name: pid for name, pid in plane.pids.items() if name in ("kube-apiserver", "etcd")}
        watched["benchmark"] = os.getpid()
        cpu_at_spawn = cpu_seconds(watched)
        spawn_wall, spawn = time.time(), time.monotonic()
        proc = start_operator(plane.kubeconfig, root / "logs" / "operator.log", 10 * expected + 1000, mapping, profile)
        watched["operator"] = proc.pid
        w = watcher
        # Resident memory by phase: started and indexed (every Node and policy seen, the first run created),
        # then with every run, then with every Job too.
        wait_until("first run", lambda: w.counts()[0] >= 1, 600, proc)
        rss_phases = {"first_run": vm_mb(proc.pid, "VmRSS")}
        all_runs = wait_until("all runs", lambda: w.counts()[0] >= expected, 600, proc) - spawn
        rss_phases["all_runs"] = vm_mb(proc.pid, "VmRSS")
        cpu_at_runs = cpu_seconds(watched)
        all_jobs = wait_until("all Jobs", lambda: w.counts()[1] >= expected, 600, proc) - spawn
        cpu_at_jobs = cpu_seconds(watched)
        rss_phases["all_jobs"] = vm_mb(proc.pid, "VmRSS")
        rss_converged = vm_hwm_mb(proc.pid)
        converge_requests = audit.wait_quiet(offset, 300)
        first_request = audit_seconds(converge_requests[0].time) - spawn_wall if converge_requests else float("nan")
        # Until the first run is created the operator starts up: kopf lists every watched kind and indexes each
        # object before any daemon may run. What follows is the creation throughput.
        run_creates = [r for r in converge_requests if r.key == "create adaptationruns"]
        first_run = audit_seconds(run_creates[0].time) - spawn_wall if run_creates else float("nan")
        log(f"converged: all runs {all_runs:.1f}s, all Jobs {all_jobs:.1f}s, {len(converge_requests)} requests")

        node, reps = sl.node_name(0), []
        for rep in range(reactions):
            labels = {**sl.node_labels(0), sl.DRIVER_LABEL: f"999.0.{rep}"}
            fingerprint = classify_node(labels).fingerprint
            offset = audit.mark()
            t0 = time.monotonic()
            core.patch_node(node, {"metadata": {"labels": {sl.DRIVER_LABEL: labels[sl.DRIVER_LABEL]}}})
            first = wait_until("first reaction run", lambda fp=fingerprint: w.counts(fp)[0] >= 1, 120, proc) - t0
            every = wait_until("all reaction runs", lambda fp=fingerprint: w.counts(fp)[0] >= policies, 300, proc)
            requests = audit.wait_quiet(offset, 120)
            reps.append(
                {
                    "first_run_s": first,
                    "all_runs_s": every - t0,
                    "requests": len(requests),
                    "breakdown": sl.breakdown(requests),
                }
            )
            log(f"reaction {rep}: first run {first:.2f}s, all {every - t0:.2f}s, {len(requests)} requests")
        rss_peak = vm_hwm_mb(proc.pid)
        return {
            "nodes": nodes,
            "policies": policies,
            "classes": sl.CLASSES,
            "expected_runs": expected,
            "spawn_to_first_request_s": first_request,
            "spawn_to_first_run_s": first_run,
            "spawn_to_all_runs_s": all_runs,
            "spawn_to_all_jobs_s": all_jobs,
            "converge_requests": len(converge_requests),
            "converge_breakdown": sl.breakdown(converge_requests),
            "rss_at_convergence_mb": rss_converged,
            "rss_by_phase_mb": rss_phases,
            "cpu_to_all_runs_s": cpu_between(cpu_at_spawn, cpu_at_runs),
            "cpu_runs_to_all_jobs_s": cpu_between(cpu_at_runs, cpu_at_jobs),
            "cores": os.cpu_count(),
            "rss_peak_mb": rss_peak,
            "reactions": reps,
            "reaction_first_run_median_s": sl.median([r["first_run_s"] for r in reps]),
            "reaction_all_runs_median_s": sl.median([r["all_runs_s"] for r in reps]),
            "reaction_requests_median": sl.median([float(r["requests"]) for r in reps]),
        }
    except BaseException:
        oplog = root / "logs" / "operator.log"
        if oplog.exists():
            log("operator log tail:\n" + "\n".join(oplog.read_text(errors="replace").splitlines()[-30:]))
        try:  # why it did not converge, from the first policy's own status
            first_policy = custom.get_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, "adaptationpolicies", "scale-000"
            )
            log(f"policy scale-000 conditions: {(first_policy.get('status') or {}).get('conditions')}")
        except Exception as exc:
            log(f"cannot read policy scale-000: {exc}")
        raise
    finally:
        if watcher is not None:
            watcher.stop()
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=120 if profile else 20)  # cProfile writes its file on the way out
            except subprocess.TimeoutExpired:
                proc.kill()
        api.close()
        plane.stop()
        shutil.rmtree(root, ignore_errors=True)  # what stop() leaves: the label mapping


def _fmt_breakdown(breakdown: dict[str, int], limit: int = 12) -> str:
    ordered = sorted(breakdown.items(), key=lambda kv: (-kv[1], kv[0]))  # JSON round-trips sort by key
    rows = ordered[:limit]
    rest = sum(count for _, count in ordered[limit:])
    if rest:
        rows.append(("(other)", rest))
    return benchlib.markdown_table(["request", "count"], rows)


CPU_ORDER = ("operator", "kube-apiserver", "etcd", "benchmark")


def _fmt_cpu(point: dict[str, Any]) -> str:
    to_runs, to_jobs = point["cpu_to_all_runs_s"], point["cpu_runs_to_all_jobs_s"]
    windows = (point["spawn_to_all_runs_s"], point["spawn_to_all_jobs_s"] - point["spawn_to_all_runs_s"])
    rows: list[list[Any]] = [[name, f"{to_runs[name]:.1f}", f"{to_jobs[name]:.1f}"] for name in CPU_ORDER]
    if LOOP_THREAD in to_runs:  # results saved before the benchmark measured the thread have none
        loop = [f"{to_runs[LOOP_THREAD]:.1f}", f"{to_jobs[LOOP_THREAD]:.1f}"]
        rows.insert(1, ["of it, the operator's event-loop thread", *loop])
        rows.insert(2, ["of it, its other threads (API requests)", *(
            f"{w['operator'] - w[LOOP_THREAD]:.1f}" for w in (to_runs, to_jobs))])  # fmt: skip
    rows.append(["all of them", f"{_processes(to_runs):.1f}", f"{_processes(to_jobs):.1f}"])
    rows.append([f"what {point['cores']} cores give in the window", *(f"{point['cores'] * w:.1f}" for w in windows)])
    return benchlib.markdown_table(
        ["process", f"spawn → all runs ({windows[0]:.1f} s)", f"all runs → all Jobs ({windows[1]:.1f} s)"], rows
    )


def _processes(used: dict[str, float]) -> float:
    return sum(v for name, v in used.items() if name != LOOP_THREAD)


def cpu_bound(point: dict[str, Any]) -> str:
    """What the CPU measurement says bounds the converge window (spawn → all runs), in one sentence."""
    used, window, cores = point["cpu_to_all_runs_s"], point["spawn_to_all_runs_s"], point["cores"]
    total = _processes(used)
    split = (
        f"in those {window:.1f} s the operator used {used['operator']:.1f} CPU seconds, kube-apiserver "
        f"{used['kube-apiserver']:.1f}, etcd {used['etcd']:.1f} and this benchmark's watch {used['benchmark']:.1f}: "
        f"{total:.1f} of the {cores * window:.1f} its {cores} cores give ({total / (cores * window):.0%})"
    )
    if used["operator"] >= 0.85 * window:
        return (
            f"{split}. The operator is one Python process whose event loop runs kopf and every reconcile, with the "
            f"client's requests in a few threads under one interpreter lock: its CPU time came to "
            f"{used['operator'] / window:.0%} of the window, so its own CPU is the bound"
        )
    loop = used.get(LOOP_THREAD)
    if total >= 0.85 * cores * window:
        return f"{split}. The cores are saturated, shared by the operator and the control plane" + (
            f" (the operator's event-loop thread, which runs kopf and every reconcile, {loop:.1f} s of its "
            f"{used['operator']:.1f}; the threads that carry its API requests the rest)"
            if loop is not None
            else ""
        )
    if loop is None:  # results saved before the benchmark measured the event-loop thread
        return (
            f"{split}. Neither the cores nor the operator's one interpreter are saturated (the operator's CPU came "
            f"to {used['operator'] / window:.0%} of the window); what the rest of the window waits on was not measured"
        )
    return (
        f"{split}. Neither the cores nor the operator's one interpreter are saturated: the operator's CPU came to "
        f"{used['operator'] / window:.0%} of the window, {loop:.1f} s of it ({loop / window:.0%} of the window) on "
        f"its event-loop thread, which runs kopf and every reconcile, and {used['operator'] - loop:.1f} s on the "
        "threads that carry its API requests. For the rest of the window the loop sleeps in epoll, every daemon "
        "waiting on an answer from kube-apiserver, which shares the same two cores"
    )


Profile = dict[str, Any]


def render(
    points: list[dict[str, Any]], quick: bool, load: str, workaround: bool, profile: Profile | None = None
) -> str:
    rows = [
        [
            p["nodes"],
            p["policies"],
            p["expected_runs"],
            f"{p['spawn_to_first_request_s']:.1f}",
            f"{p['spawn_to_all_runs_s']:.1f}",
            f"{p['spawn_to_all_jobs_s']:.1f}",
            p["converge_requests"],
            f"{p['rss_peak_mb']:.0f}",
            f"{p['reaction_first_run_median_s']:.2f}",
            f"{p['reaction_all_runs_median_s']:.2f}",
            f"{p['reaction_requests_median']:.0f}",
        ]
        for p in points
    ]
    header = [
        "nodes", "policies", "runs expected", "spawn → 1st request (s)", "spawn → all runs (s)",
        "spawn → all Jobs (s)", "operator requests to converge", "peak RSS (MB)",
        "label change → 1st new run (s, median)", "label change → all new runs (s, median)",
        "operator requests per label change (median)",
    ]  # fmt: skip
    big, small = points[-1], points[0]
    mode = (
        f"Quick mode: {', '.join(str(p['nodes']) for p in points)} nodes with {big['policies']} policies "
        "(the full run uses 100 policies at 100/250/500/1000 nodes)."
        if quick
        else (
            "Full run."
            if [p["nodes"] for p in points] == FULL["nodes"] and big["policies"] == FULL["policies"]
            else f"Partial run: {', '.join(str(p['nodes']) for p in points)} nodes with {big['policies']} policies."
        )
    )
    parts = [
        "Node objects in 20 hardware classes (4 GPU products x 5 driver versions, GPU Feature Discovery labels) "
        "and AdaptationPolicies (vendors [nvidia], a nodeSelector, a configmap:// model) on a real etcd + "
        "kube-apiserver (hack/controlplane, fresh per node count, audit log at Metadata level); the real operator "
        "process (`metainfer operator -n scale`, kopf peering on, resync 60 s).",
        f"{mode} Machine load while measuring: {load}.",
        "Definitions: *spawn* is the operator process being started with every Node and policy already present (an "
        "operator restart on a full cluster; Python and kopf start-up included). *All runs* is when the benchmark's "
        "watch has seen every expected AdaptationRun (policies x 20 classes), *all Jobs* the same for their Jobs. "
        "*Operator requests* are kube-apiserver audit-log entries (one per request) from every client other than "
        "the control plane and the benchmark, from spawn until the operator made no write for 3 s. A *label change* "
        "patches one node's `nvidia.com/cuda.driver-version.full` to a driver no class has, so the node forms a "
        "new class: every policy then creates a run (and Job) for it, and from the second repetition on also "
        "deletes the unfinished runs of the previous repetition's class, which vanished. No kubelet runs, so runs "
        "stay Pending; METAINFER_MAX_CONCURRENT_RUNS is raised above policies x classes so the limiter of runs in "
        "flight does not hold creation back, and METAINFER_CLASS_SETTLE_SECONDS is 0 so that no class waits for its "
        "labels to hold still (30 s by default: a chosen wait, not the operator's work). The workload namespace "
        "has the agent's ServiceAccount, as the chart leaves it.",
    ]
    if workaround:
        parts.append(
            "**Known bug, worked around here:** core.control.manifests writes a GPU class's extended resource as the "
            "int "
            "`nvidia.com/gpu: 1`; the kubernetes client (v37) validates request bodies and rejects it (quantities "
            "are strings), so no Job (and no serving Deployment) of a GPU class can be created: the policy "
            "reconcile stops at the first Job with a ValidationError and the policy reports Ready=False "
            "InvalidSpec. This run classifies the nodes through a LabelMapping equal to the default but without "
            "the NVIDIA extended resource (same classes, same fingerprints, same API calls); the benchmark "
            "detects the fix and drops the workaround by itself."
        )
    parts += [
        benchlib.markdown_table(header, rows),
        f"Operator requests to converge at {big['nodes']} nodes x {big['policies']} policies, by verb and resource:",
        _fmt_breakdown(big["converge_breakdown"]),
        f"Operator requests for one label change at {big['nodes']} nodes (last repetition):",
        _fmt_breakdown(big["reactions"][-1]["breakdown"]),
    ]
    if "cpu_to_all_runs_s" in big:  # results saved before the benchmark measured CPU have none
        parts += [
            f"CPU seconds used while converging at {big['nodes']} nodes x {big['policies']} policies (user + system "
            "from /proc/<pid>/stat, threads included):",
            _fmt_cpu(big),
        ]
    if profile is not None:
        parts.append(_fmt_profile(profile))
    parts.append("Targets:\n\n" + "\n".join(f"- {line}" for line in verdicts(small, big, profile)))
    return "\n\n".join(parts)


def where_the_loop_goes(profile: Profile) -> str:
    """The converge verdict's sentence on the profile: what the event loop's busy time is spent on."""
    busy = profile["busy_s"]
    total = sum(busy.values())

    def share(*prefixes: str) -> float:
        return sum(v for k, v in busy.items() if k.startswith(prefixes)) / total

    return (
        f"Where the event loop's time goes (the profile below): kopf's processing of the watch events and "
        f"asyncio's tasks and locks under it {share('kopf', 'asyncio'):.0%}, reading and decoding the watch streams "
        f"(TLS, JSON) {share('TLS', 'JSON'):.0%}, pydantic {share('pydantic'):.0%}, and metainfer's own planning "
        f"and handlers {share('metainfer'):.0%}. Every run, Job and status write comes back as watch events that "
        "kopf processes one by one on the same loop, so most of the operator's CPU is the price of watching what "
        "it wrote, not of deciding what to write; fewer writes per run (the run status write that records its Job) "
        "and fewer reconciles per burst are what would move this number"
    )


def memory_by_phase(big: dict[str, Any]) -> str:
    phases = big["rss_by_phase_mb"]
    return (
        f"By phase, its resident memory was {phases['first_run']:.0f} MB when the first run was created (started, "
        f"every one of the {big['nodes']} Nodes and {big['policies']} policies listed and indexed), "
        f"{phases['all_runs']:.0f} MB once all {big['expected_runs']} runs existed and {phases['all_jobs']:.0f} MB "
        f"once their Jobs did too (peak so far {big['rss_at_convergence_mb']:.0f} MB, {big['rss_peak_mb']:.0f} MB "
        "after the label changes)"
    )


def verdicts(small: dict[str, Any], big: dict[str, Any], profile: Profile | None = None) -> list[str]:
    scale = f"{big['nodes']} nodes x {big['policies']} policies"
    out = []
    conv = big["spawn_to_all_runs_s"]
    line = f"Converge on {scale} in under {TARGET_CONVERGE_S:g} s: {conv:.1f} s from spawn to all runs"
    if conv < TARGET_CONVERGE_S:
        started = (
            f" (the first run created after {big['spawn_to_first_run_s']:.1f} s, {small['spawn_to_first_run_s']:.1f} s "
            f"at {small['nodes']} nodes: until then kopf lists every watched kind and indexes each object before any "
            "daemon may run)"
            if "spawn_to_first_run_s" in big and "spawn_to_first_run_s" in small
            else ""
        )
        out.append(f"**met**. {line}{started}.")
    else:
        started = (
            f", first run created after {big['spawn_to_first_run_s']:.1f} s: until then kopf lists every watched "
            "kind and indexes each object before any daemon may run"
            if "spawn_to_first_run_s" in big
            else ""
        )
        per_run = big["converge_requests"] / big["expected_runs"]
        rate = big["converge_requests"] / big["spawn_to_all_jobs_s"]
        conv_counts = big["converge_breakdown"]
        per_policy = (
            sum(
                conv_counts.get(k, 0)
                for k in ("get adaptationpolicies", "patch adaptationpolicies/status", "create events")
            )
            / big["policies"]
        )
        out.append(
            f"**missed**. {line} (first request after {big['spawn_to_first_request_s']:.1f} s{started}). Why: each run "
            "needs three writes that cannot be batched (create the run, create its Job, record the Job in the run's "
            f"status), and each policy reconcile adds a read, a status patch and at times an Event "
            f"({per_policy:.0f} per policy here): {per_run:.1f} requests per run in all, {big['converge_requests']} "
            f"for {big['expected_runs']} runs, at about {rate:.0f} requests/s from one Python process that shares "
            "the machine's cores with etcd and kube-apiserver"
            + (f"; {cpu_bound(big)}" if "cpu_to_all_runs_s" in big else " (see the load above)")
            + ". "
            + (
                where_the_loop_goes(profile)
                if profile is not None
                else "`--profile` says where the operator's event loop spends its CPU."
            )
        )
    rss = big["rss_peak_mb"]
    rss_line = (
        f"Peak RSS under {TARGET_RSS_MB:g} MB: {rss:.0f} MB (VmHWM of the operator process at {scale}, after the "
        f"reactions; {small['rss_peak_mb']:.0f} MB at {small['nodes']} nodes)"
    )
    if rss < TARGET_RSS_MB:
        out.append(f"**met**. {rss_line}.")
    else:
        out.append(
            f"**missed**. {rss_line}. Why: part of it is the process before it sees any object: the interpreter "
            "with kopf, the kubernetes client and pydantic, 71.9 MB measured alone at commit f31cd67 (VmRSS of "
            "`metainfer operator --standalone --liveness ''` against an unreachable API server, 5 s after start); "
            "before that commit the CLI also loaded onnxruntime and numpy for every subcommand (102.5 MB). The rest "
            "grows "
            f"with the {2 * big['expected_runs']} runs and Jobs and the {big['nodes']} nodes it watches, not with "
            "requests. The indexes hold slimmed copies (core.control.slim: no managedFields, no pod templates, no "
            "trial "
            "tables); what remains is kopf's per-object bookkeeping for every watched object and the Python heap's "
            "high-water mark from the converge burst"
            + (f". {memory_by_phase(big)}." if "rss_by_phase_mb" in big else ".")
        )
    reps_small = [r["requests"] for r in small["reactions"]]
    reps_big = [r["requests"] for r in big["reactions"]]
    a, b = small["reaction_requests_median"], big["reaction_requests_median"]
    gets = big["reactions"][-1]["breakdown"].get("get adaptationpolicies", 0)
    node_requests = sum(
        count
        for r in big["reactions"]
        for key, count in r["breakdown"].items()
        if key.split()[-1] == "nodes" and not key.startswith("watch ")  # kopf re-opening its watch: not per change
    )
    # Flat in nodes: no request touches nodes, and the median at the big count is within the spread of the small.
    flat = small["policies"] == big["policies"] and node_requests == 0 and b <= max(reps_small) * 1.1 + 5
    out.append(
        f"**{'met' if flat else 'missed'}** with respect to nodes. O(1) API requests per node label change: "
        f"median {a:.0f} requests at {small['nodes']} nodes ({min(reps_small)}-{max(reps_small)} over "
        f"{len(reps_small)} repetitions) and {b:.0f} at {big['nodes']} nodes ({min(reps_big)}-{max(reps_big)}); "
        f"{node_requests} of them read or write a Node (nodes arrive through kopf's watch). The count is proportional "
        f"to the number of policies instead, about {b / big['policies']:.0f} per policy: every policy adapts to the "
        "new class (create the run and its Job, record the Job, delete the vanished class's unfinished run), and each "
        f"reconcile of it reads the policy once and patches its status: {gets / big['policies']:.0f} reconciles per "
        "policy in the last repetition, because a change wakes each daemon for the node, then for its own new run, "
        "then for its new Job."
    )
    lat_small, lat_big = small["reaction_first_run_median_s"], big["reaction_first_run_median_s"]
    out.append(
        f"No target: reaction time. The first new run appeared {lat_small:.2f} s (median) after the label change "
        f"at {small['nodes']} nodes and {lat_big:.2f} s at {big['nodes']} nodes; the last of {big['policies']} after "
        f"{small['reaction_all_runs_median_s']:.2f} s and {big['reaction_all_runs_median_s']:.2f} s. All daemons "
        "wake at once and reconcile one after another on one event loop, so this is CPU time of the reconciles "
        "(not profiled here), and it moves with the machine's load as much as with nodes."
    )
    return out


def machine_load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) / {five:.2f} (5 min) on {os.cpu_count()} logical cores at the end"


def profiled(nodes: int, policies: int, found: Any, documents: list[dict[str, Any]], workaround: bool) -> Profile:
    """One more converge (and one label change) with the operator under cProfile: its event loop's busy time by
    group (bench/scale_profile.py)."""
    with tempfile.TemporaryDirectory(prefix="metainfer-scale-profile-") as tmp:
        path = Path(tmp) / "operator.prof"
        point = measure(nodes, policies, 1, found, documents, workaround, profile=path)
        busy = scale_profile.summarize(path)
    return {
        "nodes": nodes,
        "policies": policies,
        "spawn_to_all_runs_s": point["spawn_to_all_runs_s"],
        "cpu_to_all_runs_s": point["cpu_to_all_runs_s"],
        "busy_s": busy,
    }


def _fmt_profile(profile: Profile) -> str:
    busy = sorted(profile["busy_s"].items(), key=lambda kv: (-kv[1], kv[0]))  # JSON round-trips sort by key
    total = sum(seconds for _, seconds in busy)
    rows = [[group, f"{seconds:.1f}", f"{seconds / total:.0%}"] for group, seconds in busy]
    rows.append(["all of it", f"{total:.1f}", "100%"])
    return (
        f"Where the operator's event-loop thread spends its CPU, from a cProfile of one more converge (and one label "
        f"change) at {profile['nodes']} nodes x {profile['policies']} policies (`--profile`; the profiler slows the "
        f"operator, to {profile['spawn_to_all_runs_s']:.1f} s from spawn to all runs, so these are shares, not "
        "times for the table above). Each function's own time is put in one group (bench/scale_profile.py); the "
        "time the loop sleeps in epoll waiting on the network is left out:\n\n"
        + benchlib.markdown_table(["group", "busy s (profiled)", "share"], rows)
    )


def rerender(path: Path) -> int:
    """Rewrite the section from saved raw results: same numbers, same command, a note saying when they ran."""
    saved = json.loads(path.read_text())
    keep = {k: v for k, v in saved.items() if k not in ("benchmark", "command", "machine")}
    keep["rerendered"] = True  # bench/render.py then says when the numbers were measured
    benchlib.write_result("operator_scale", TITLE, keep, command=saved["command"], facts=saved["machine"])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 and 1000 nodes, 20 policies, 3 reactions")
    parser.add_argument("--nodes", help="comma-separated node counts (default 100,250,500,1000)")
    parser.add_argument("--policies", type=int)
    parser.add_argument("--reactions", type=int)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also converge once more at the largest node count under cProfile, and say where the event loop's CPU"
        " goes (its times are not in the table: the profiler slows the operator)",
    )
    parser.add_argument(
        "--render-from", type=Path, help="only rewrite the section from this raw result (after a change of wording)"
    )
    args = parser.parse_args()
    if args.render_from:
        return rerender(args.render_from)
    plan = dict(QUICK if args.quick else FULL)
    if args.nodes:
        plan["nodes"] = [int(n) for n in args.nodes.split(",")]
    if args.policies:
        plan["policies"] = args.policies
    if args.reactions:
        plan["reactions"] = args.reactions
    found = assets.provide(log)
    documents = crds.load_crds((benchlib.ROOT / "crds").glob("*.yaml"))
    workaround = not sl.gpu_job_quantities_are_strings()
    if workaround:
        log("GPU Job quantities are ints (the client rejects them): nodes classified without the GPU resource")
    started = time.monotonic()
    points = [measure(n, plan["policies"], plan["reactions"], found, documents, workaround) for n in plan["nodes"]]
    data = {
        "quick": args.quick,
        "plan": plan,
        "gpu_resource_workaround": workaround,
        "points": points,
        "duration_s": time.monotonic() - started,
    }
    if args.profile:
        data["profile"] = profiled(max(plan["nodes"]), plan["policies"], found, documents, workaround)
    data["load"] = machine_load()
    body = render(points, args.quick, data["load"], workaround, data.get("profile"))
    path = benchlib.write_result("operator_scale", TITLE, data)
    log(f"wrote {path} in {data['duration_s']:.0f}s")
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
