"""Errors of the development control plane: each says what failed and what to do."""

from __future__ import annotations


class ControlPlaneError(RuntimeError):
    """Base class: the message is meant for a person, with the next step in it."""


class AssetError(ControlPlaneError):
    """kube-apiserver/etcd/kubectl could not be found or built."""


class StartError(ControlPlaneError):
    """A component did not start or did not become ready; the message names its log."""
