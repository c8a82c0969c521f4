"""The operator-scale benchmark's pure parts: its nodes form exactly 20 classes, its audit counting is right."""

from __future__ import annotations

import json

from bench import scale_lib as sl
from metainfer.core.api.policy import AdaptationPolicySpec
from metainfer.core.control.hardware import LabelMapping, classify_node, group_nodes, select_groups


def _labels(count: int) -> dict[str, dict[str, str]]:
    return {sl.node_name(i): sl.node_labels(i) for i in range(count)}


def test_nodes_form_exactly_twenty_equal_classes_at_every_count() -> None:
    for count in (100, 1000):
        groups = group_nodes(sorted(_labels(count).items()))
        assert len(groups) == sl.CLASSES == 20
        assert {len(g.node_names) for g in groups.values()} == {count // 20}


def test_every_policy_selects_every_class() -> None:
    labels = _labels(100)
    spec = AdaptationPolicySpec.model_validate(sl.policy_manifest("ns", 0, 64)["spec"])
    assert len(select_groups(group_nodes(sorted(labels.items())), spec.hardware, labels)) == 20


def test_driver_change_moves_a_node_to_a_new_class() -> None:
    known = set(group_nodes(sorted(_labels(100).items())))
    moved = classify_node({**sl.node_labels(0), sl.DRIVER_LABEL: "999.0.0"})
    assert moved.fingerprint not in known
    assert moved.hardware_class.driver_version == "999.0.0"


def test_workaround_mapping_keeps_classes_and_drops_only_the_resource() -> None:
    mapping = LabelMapping.model_validate(sl.mapping_without_gpu_resource())
    default = group_nodes(sorted(_labels(40).items()))
    mapped = group_nodes(sorted(_labels(40).items()), mapping)
    assert list(default) == list(mapped)
    assert all(g.resource is None for g in mapped.values())
    assert all(g.resource == "nvidia.com/gpu" for g in default.values())


def _event(audit_id: str, stage: str, agent: str, verb: str, resource: str, sub: str = "") -> str:
    ref = {"resource": resource, **({"subresource": sub} if sub else {})} if resource else None
    event = {
        "auditID": audit_id,
        "stage": stage,
        "userAgent": agent,
        "verb": verb,
        "responseStatus": {"code": 200},
        "requestReceivedTimestamp": "2026-01-01T00:00:00.000000Z",
    }
    if ref:
        event["objectRef"] = ref
    return json.dumps(event)


def test_audit_counts_each_request_once_and_only_the_operators() -> None:
    lines = [
        _event("a", "ResponseStarted", "kopf/1.45.2", "watch", "nodes"),
        _event("b", "ResponseComplete", "OpenAPI-Generator/37.0.2/python", "create", "adaptationruns"),
        _event("a", "ResponseComplete", "kopf/1.45.2", "watch", "nodes"),  # same watch, second stage
        _event("c", "ResponseComplete", sl.BENCH_USER_AGENT, "patch", "nodes"),
        _event("d", "ResponseComplete", "kube-apiserver/v1.37.2 (linux/amd64)", "list", "services"),
        _event("e", "ResponseComplete", "OpenAPI-Generator/37.0.2/python", "patch", "adaptationpolicies", "status"),
        _event("f", "ResponseComplete", "kopf/1.45.2", "get", ""),
        '{"auditID": "g", "stage": "ResponseCompl',  # torn last line: the server is still writing it
    ]
    requests = [r for r in sl.parse_audit(lines) if sl.is_operator(r)]
    assert [r.audit_id for r in requests] == ["a", "b", "e", "f"]
    assert sl.breakdown(requests) == {
        "watch nodes": 1,
        "create adaptationruns": 1,
        "patch adaptationpolicies/status": 1,
        "get (non-resource)": 1,
    }
    assert [r.audit_id for r in sl.mutating(requests)] == ["b", "e"]


def test_median() -> None:
    assert sl.median([3.0, 1.0, 2.0]) == 2.0
    assert sl.median([4.0, 1.0, 2.0, 3.0]) == 2.5


def test_profile_groups_each_functions_own_time_once_and_leaves_out_the_idle_wait(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import cProfile
    import json as stdlib_json

    from bench import scale_profile

    assert scale_profile.group_of("/x/site-packages/kopf/_core/reactor/processing.py", "f").startswith("kopf")
    assert scale_profile.group_of("/work/main/core/control/reconcile.py", "plan").startswith("metainfer planning")
    assert scale_profile.group_of("~", "<method 'read' of '_ssl._SSLSocket' objects>").startswith("TLS")
    assert scale_profile.group_of("/usr/lib/python3.11/copy.py", "deepcopy") == scale_profile.OTHER

    def work() -> None:
        for _ in range(200):
            stdlib_json.loads(stdlib_json.dumps({"k": list(range(100))}))

    profiler = cProfile.Profile()
    profiler.runcall(work)
    path = tmp_path / "p.prof"
    profiler.dump_stats(str(path))
    busy = scale_profile.summarize(path)
    assert busy["JSON decode and encode"] > 0
    assert list(busy.values()) == sorted(busy.values(), reverse=True)
    assert not any("epoll" in group for group in busy)
