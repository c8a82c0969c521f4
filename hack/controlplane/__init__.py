"""A real kube-apiserver + etcd on loopback, for development (`hack/cluster.py`) and tests.

This lives in hack/ rather than in the metainfer package because it is tooling:
no product code imports it. ``make venv`` installs hack/ as the development
package ``hack``, so the CLI, the integration tests and the operator-scale
benchmark import ``hack.controlplane``.
"""
