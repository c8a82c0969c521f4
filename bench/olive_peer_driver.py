"""Run one Olive workflow config, as ``olive run --config CONFIG`` does, with one upstream bug worked around.

Runs inside Olive's own virtual environment (bench/olive_peer.py starts it):

    OLIVE_VENV/bin/python bench/olive_peer_driver.py CONFIG.json

Why not plain ``olive run``: olive-ai 0.12 and 0.13 cannot run a workflow
whose evaluator has a custom metric, for two reasons in its pydantic v2 code:

* ``Metric.validate_backend`` sets ``backend=None`` for custom metrics and a
  custom sub-metric has no ``metric_config``, but ``Metric.serialize_backend``
  and ``SubMetric.serialize_metric_config`` call ``.model_dump()`` on them
  unconditionally, so ``run_engine`` dies serialising the run config;
* ``Metric.user_config`` is declared as the empty ``ConfigBase``, and pydantic
  v2 serialises a field by its declared type, so when the engine round-trips
  the evaluator config (``Cache.prepare_resources_for_local``) the custom
  metric loses ``user_script`` and ``metric_func`` and fails with "evaluate_func
  or metric_func is not specified".

The peer comparison needs a custom metric (the same quality score metainfer
uses, under the same accuracy budget), so this driver gives the two
serializers the None case their fields allow and makes Olive's config
objects serialise their actual (sub)class, which is what the round trip
assumes. Olive's search, passes and evaluator code run unmodified.
"""

from __future__ import annotations

import sys
from typing import Any


def _serialize_backend(self: Any, backend: Any) -> Any:
    return backend if backend is None or isinstance(backend, str) else backend.model_dump()


def _serialize_metric_config(self: Any, metric_config: Any) -> Any:
    return None if metric_config is None else metric_config.model_dump()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: olive_peer_driver.py CONFIG.json", file=sys.stderr)
        return 2
    from olive.common.config_utils import ConfigBase
    from olive.evaluator.metric import Metric, SubMetric
    from olive.workflows import run

    # Swap the code in place: pydantic's compiled schemas hold this very function object.
    Metric.serialize_backend.__code__ = _serialize_backend.__code__
    SubMetric.serialize_metric_config.__code__ = _serialize_metric_config.__code__
    base_dump = ConfigBase.model_dump

    def model_dump(self: Any, **kwargs: Any) -> dict[str, Any]:
        kwargs.setdefault("serialize_as_any", True)
        return base_dump(self, **kwargs)

    ConfigBase.model_dump = model_dump  # type: ignore[method-assign]
    output = run(argv[0])
    best = output.get_best_candidate() if output is not None else None
    print(f"olive best candidate: {best.model_path if best is not None else None}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
