"""Development tooling: the local control plane, a pinned helm, Prometheus for tests.

Not part of the product: the metainfer wheel does not contain it, and no code
under core/, agent/ or operator/ imports it. ``make venv`` installs it in
editable mode (hack/pyproject.toml), so tests and benchmarks import
``hack.controlplane``, ``hack.helm`` and ``hack.prometheus``; the scripts here
still run as ``python hack/<name>.py``.
"""
