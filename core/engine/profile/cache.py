"""Profile JSON cached by fingerprint, so a hardware class is measured once.

A cached profile is used only when it is intact, of this schema version, for
the same fingerprint, measured with the same ``BenchConfig`` and younger than
``max_age_s``. Anything else (truncated file, hand edits, an old format) is a
miss that is re-measured and overwritten: a cache must never be a reason to
fail. Writes go through a temporary file and ``os.replace``, so a reader never
sees half a file even when two jobs profile the same class at once.
"""

from __future__ import annotations

import logging
import os
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from metainfer.core.engine.profile.fingerprint import detect_machine, fingerprint
from metainfer.core.engine.profile.types import SCHEMA_VERSION, BenchConfig, HardwareProfile

if TYPE_CHECKING:
    from metainfer.core.engine.profile.measure import OnStep

log = logging.getLogger(__name__)
DEFAULT_CACHE_DIR = Path("~/.cache/metainfer/profiles")
DEFAULT_MAX_AGE_S = 7 * 24 * 3600.0  # drivers and kernels change; a week keeps numbers honest


def cache_path(cache_dir: Path | str, fp: str) -> Path:
    return Path(cache_dir).expanduser() / f"{fp}.json"


def load_cached(
    fp: str,
    cache_dir: Path | str = DEFAULT_CACHE_DIR,
    max_age_s: float | None = DEFAULT_MAX_AGE_S,
    config: BenchConfig | None = None,
    now: datetime | None = None,
) -> HardwareProfile | None:
    """The cached profile for ``fp`` if usable, else None (with the reason logged at debug)."""
    path = cache_path(cache_dir, fp)
    try:
        profile = HardwareProfile.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, ValidationError) as exc:  # corrupt or foreign: re-measure
        log.warning("ignoring unreadable profile cache %s: %s", path, str(exc).splitlines()[0])
        return None
    if profile.schema_version != SCHEMA_VERSION or profile.fingerprint != fp:
        log.debug("profile cache %s is for another schema or machine", path)
        return None
    if config is not None and profile.config != config:
        log.debug("profile cache %s was measured with another config", path)
        return None
    if max_age_s is not None:
        now = now or datetime.now(UTC)
        if now - profile.measured_at > timedelta(seconds=max_age_s):
            log.debug("profile cache %s is stale", path)
            return None
    return profile


def save(profile: HardwareProfile, cache_dir: Path | str = DEFAULT_CACHE_DIR) -> Path:
    """Write ``profile`` atomically to ``<cache_dir>/<fingerprint>.json``; returns the path."""
    path = cache_path(cache_dir, profile.fingerprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{profile.fingerprint}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(profile.model_dump_json(indent=2))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_or_measure(
    cache_dir: Path | str = DEFAULT_CACHE_DIR,
    max_age_s: float | None = DEFAULT_MAX_AGE_S,
    config: BenchConfig | None = None,
    on_step: OnStep | None = None,
    refresh: bool = False,
) -> HardwareProfile:
    """This machine's profile: from the cache when fresh, else measured and cached.

    ``refresh`` forces a new measurement. A cache directory that cannot be written
    only costs the caching (logged), never the profile.
    """
    config = config or BenchConfig()
    fp = fingerprint(detect_machine())
    if not refresh:
        cached = load_cached(fp, cache_dir, max_age_s, config)
        if cached is not None:
            return cached
    from metainfer.core.engine.profile.measure import measure_profile  # onnx + onnxruntime: only when measuring

    profile = measure_profile(config, on_step)
    try:
        save(profile, cache_dir)
    except OSError as exc:
        log.warning("could not cache profile in %s: %s", cache_dir, exc)
    return profile
