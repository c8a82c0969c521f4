"""A real kube-apiserver + etcd on loopback, for development (`hack/cluster.py`) and tests.

This lives in hack/ rather than in the metainfer package because it is tooling:
no product code imports it. Callers put hack/ on sys.path (the CLI and the
integration conftest do) and import ``controlplane``.
"""
