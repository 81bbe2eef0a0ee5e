"""Which processes still run in a run dir, whatever the DB says: every backend asked, each as its
capabilities allow (after the DB file was deleted, the same name was submitted again beside the
running first attempt). ``orch submit`` and ``orch sweep`` refuse a run dir that shows one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator import protocol
from orchestrator.backends import BACKENDS, get_backend


def host_processes(run_dirs: Sequence[Path]) -> dict[Path, list[str]]:
    """Processes this host's process table shows running in each run dir, from every backend whose liveness
    is the host's (one scan for all dirs): what a requeue checks before it clears a run dir."""
    out: dict[Path, list[str]] = {d: [] for d in run_dirs}
    for name in BACKENDS:
        backend = get_backend(name)
        if backend.capabilities.host_liveness:
            for d, live in backend.live_in_run_dirs(run_dirs).items():
                out[d] += live
    return out


def live_processes(run_dirs: Sequence[Path]) -> dict[Path, list[str]]:
    """Processes any backend can see running in each run dir (kernel or scheduler data)."""
    out: dict[Path, list[str]] = {d: [] for d in run_dirs}
    for name in BACKENDS:
        asked: list[Path] = []
        try:
            backend = get_backend(name)
            # A scheduler only for dirs an attempt was ever submitted from: skip needless round trips. A group
            # launch's task has no attempts/ until it starts (its records wait in the batch): its run dir is asked.
            asked = [d for d in run_dirs
                     if backend.capabilities.host_liveness or (d / protocol.ATTEMPTS_DIR).is_dir()
                     or (backend.capabilities.group_queue and d.is_dir())]
            if not asked:
                continue
            for d, live in backend.live_in_run_dirs(asked).items():
                out[d] += live
        except Exception as e:  # unknown is not "none": refuse rather than guess
            for d in asked or run_dirs:  # no backend to ask: every dir is in doubt
                out[d].append(f"{name}: cannot tell ({str(e)[:100]})")
    return out
