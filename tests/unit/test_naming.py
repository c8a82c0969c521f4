"""The names the operator gives what it creates (core.control.naming): deterministic, so a retried or restarted
reconcile finds what it made instead of making a second one; valid DNS labels within Kubernetes' limits however
long the policy's name; and distinct for distinct inputs, even under a long shared prefix."""

from __future__ import annotations

import re

from manifest_inputs import GPU

from metainfer.core.control.hardware import classify_node
from metainfer.core.control.naming import JOB_MAX, canary_name, job_name, label_value, run_name, workload_name

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_names_are_deterministic_valid_and_bounded() -> None:
    cls = classify_node(GPU).hardware_class.name()
    assert run_name("digits", cls, "0123456789abcdef") == run_name("digits", cls, "0123456789abcdef")
    assert run_name("digits", cls, "0123456789abcdef") != run_name("digits", cls, "fedcba9876543210")
    long_policy = "p" * 253
    for name in (
        run_name(long_policy, cls, "k" * 16),
        job_name("j" * 100),
        workload_name(long_policy, cls),
        canary_name(long_policy, cls),
        label_value("v" * 200),
    ):
        assert DNS_LABEL.match(name) and len(name) <= 63, name
    assert len(run_name(long_policy, cls, "k" * 16)) <= JOB_MAX and len(job_name("j" * 100)) <= JOB_MAX
    assert canary_name("digits", cls).endswith("-canary")
    assert workload_name("9lives", cls)[0].isalpha()  # Service names are DNS-1035 labels


def test_long_names_sharing_a_prefix_do_not_collide() -> None:
    prefix = "a-very-long-policy-name-" * 5
    names = {workload_name(prefix + str(i), "cpu-generic-0123abcd") for i in range(200)}
    assert len(names) == 200
    assert workload_name("a-b", "c") != workload_name("a", "b-c")
    runs = {run_name(prefix, "cpu-generic-0123abcd", f"{i:016x}") for i in range(200)}
    assert len(runs) == 200
