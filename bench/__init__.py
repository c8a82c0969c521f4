"""The benchmarks behind BENCHMARKS.md and their shared helpers (``bench.benchlib``).

Not part of the product: the metainfer wheel does not contain it. ``make venv``
installs it in editable mode (bench/pyproject.toml), so the scripts run as
``python bench/<name>.py`` and tests import ``bench.roofline``,
``bench.search_replay`` and the others as modules of this package.
What the benchmarks and the tests both drive (serving clients, conv nets, exports,
peer environments) is the development package ``testkit`` instead.
"""
