"""Backends: where attempts run. ``get_backend`` imports only the one asked for (the Slurm backend
never loads on a login node that only reads the job table)."""

from __future__ import annotations

from orchestrator.backends.base import Backend

BACKENDS = ("local", "slurm")


def get_backend(name: str) -> Backend:
    """Backend by name; imports only the one asked for."""
    if name == "local":
        from orchestrator.backends.local import LocalBackend

        return LocalBackend()
    if name == "slurm":
        from orchestrator.backends.slurm import SlurmBackend

        return SlurmBackend()
    raise ValueError(f"unknown backend {name!r} (choose local or slurm)")
