"""A class new to a policy waits until its labels hold still; known classes and the startup state never wait."""

from __future__ import annotations

from metainfer.core.api.hardwareclass import HardwareClass
from metainfer.core.control.hardware import ClassGroup
from metainfer.core.control.settling import ClassSightings, settled_groups


def group(driver: str) -> ClassGroup:
    return ClassGroup(hardware_class=HardwareClass(vendor="nvidia", product="A100", driver_version=driver), selector={})


def test_classes_present_at_startup_are_settled_at_once() -> None:
    sightings = ClassSightings()
    a = group("535")
    sightings.observe([a.fingerprint], now=100.0)
    result = settled_groups([a], sightings, known=set(), now=100.0, settle_s=30)
    assert result.groups == [a] and result.held_back == [] and result.wait_s is None


def test_a_new_class_waits_for_the_settle_time_and_says_how_long() -> None:
    sightings = ClassSightings()
    sightings.observe([], now=0.0)
    b = group("550")
    sightings.observe([b.fingerprint], now=10.0)
    early = settled_groups([b], sightings, known=set(), now=25.0, settle_s=30)
    assert early.groups == [] and early.held_back == [b.fingerprint] and early.wait_s == 15.0
    assert settled_groups([b], sightings, known=set(), now=40.0, settle_s=30).groups == [b]
    assert settled_groups([b], sightings, known=set(), now=10.0, settle_s=0).groups == [b]


def test_flapping_labels_restart_the_clock_so_no_passing_class_gets_a_run() -> None:
    sightings = ClassSightings()
    sightings.observe([], now=0.0)
    drivers = [group(f"5{i:02d}") for i in range(20)]
    for step, g in enumerate(drivers):  # 20 versions in 10 s: each is present for half a second
        sightings.observe([g.fingerprint], now=1.0 + step * 0.5)
        assert settled_groups([g], sightings, known=set(), now=1.0 + step * 0.5, settle_s=5).groups == []
    last = drivers[-1]
    again = group("500")  # an earlier version coming back starts its clock anew
    sightings.observe([last.fingerprint, again.fingerprint], now=11.0)
    result = settled_groups([last, again], sightings, known=set(), now=15.6, settle_s=5)  # last seen since 10.5
    assert result.groups == [last] and result.held_back == [again.fingerprint]


def test_a_class_the_policy_knows_is_never_held_back() -> None:
    """Holding back a class with runs or status would read as 'class gone' and remove its serving."""
    sightings = ClassSightings()
    sightings.observe([], now=0.0)
    a = group("535")
    sightings.observe([a.fingerprint], now=1.0)
    assert settled_groups([a], sightings, known={a.fingerprint}, now=1.0, settle_s=30).groups == [a]
