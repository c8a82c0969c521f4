"""hack/cache_budget.py: which cached build outputs are evicted, and that eviction deletes them."""

from pathlib import Path

from hack import cache_budget
from hack.cache_budget import GIB, CacheEntry

NOW = 1_000_000.0
DAY = 86400.0


def _entry(name: str, gib: float, idle_s: float) -> CacheEntry:
    return CacheEntry((Path(f"/cache/{name}"), Path(f"/cache/{name}.tar")), int(gib * GIB), NOW - idle_s)


def _evicted(entries: list[CacheEntry], keep: set[Path], *, budget: float = 20, free: float = 100,
             floor: float = 24) -> list[str]:  # fmt: skip
    chosen = cache_budget.to_evict(entries, keep, int(budget * GIB), int(free * GIB), int(floor * GIB), 7 * DAY, NOW)
    return [victim.paths[0].name for victim in chosen]


def test_within_the_budget_and_the_floor_only_what_no_build_used_for_a_week_goes() -> None:
    entries = [_entry("old", 1, 8 * DAY), _entry("yesterday", 1, DAY), _entry("current", 3, 0)]
    assert _evicted(entries, {Path("/cache/current.tar")}) == ["old"]


def test_beyond_the_budget_the_least_recently_used_go_first_until_it_fits() -> None:
    entries = [_entry("a", 8, 3 * DAY), _entry("b", 8, 2 * DAY), _entry("c", 8, DAY), _entry("current", 8, 0)]
    assert _evicted(entries, {Path("/cache/current")}) == ["a", "b"]


def test_what_this_build_uses_is_never_evicted_even_over_the_budget_and_the_floor() -> None:
    entries = [_entry("current", 30, 2 * DAY)]
    assert _evicted(entries, {Path("/cache/current")}, free=1) == []


def test_short_of_free_space_idle_entries_go_but_the_other_flavours_this_run_built_stay() -> None:
    entries = [_entry("last-week", 2, 6 * DAY), _entry("cuda-now", 4, 600), _entry("cpu", 2, 0)]
    assert _evicted(entries, {Path("/cache/cpu")}, free=10) == ["last-week"]
    assert _evicted(entries, {Path("/cache/cpu")}, free=30) == []


def test_eviction_deletes_trees_and_tars_and_reports_the_bytes(tmp_path: Path) -> None:
    tree = tmp_path / "layer"
    (tree / "usr").mkdir(parents=True)
    (tree / "usr" / "lib.so").write_bytes(b"x" * 4096)
    tar = tmp_path / "layer.tar"
    tar.write_bytes(b"y" * 1024)
    kept = tmp_path / "kept.tar"
    kept.write_bytes(b"z")
    entries = [cache_budget.entry([tree, tar]), cache_budget.entry([kept])]
    assert entries[0].size_bytes == 4096 + 1024
    freed = cache_budget.evict(entries, {kept}, budget_bytes=0, min_free_bytes=0, max_age_s=7 * DAY, log=lambda _: None)
    assert freed == 5120 and not tree.exists() and not tar.exists() and kept.exists()
