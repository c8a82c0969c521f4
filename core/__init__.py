"""metainfer.core: pure, typed logic (no Kubernetes, no I/O beyond files)."""
