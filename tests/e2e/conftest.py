"""Fixtures of the end-to-end suite; the cluster, image and install live in platform_harness.py."""

from platform_harness import platform  # noqa: F401  (the module fixture)
