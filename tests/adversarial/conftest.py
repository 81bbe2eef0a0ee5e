"""Fixtures of the adversarial suite: nothing a test started outlives it (helpers live in advkit.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from advkit import kill_pids, procs_under


@pytest.fixture(autouse=True)
def _no_leftover_jobs(tmp_path: Path) -> Iterator[None]:
    """Kill, by pid, every process of a job whose run dir lies in this test's tmp_path (a failed test
    must not leave a gated job or its wrapper running into the next test)."""
    yield
    kill_pids(p.pid for p in procs_under(tmp_path))


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen]]:
    """Background processes a test starts itself (orch in the background, an unrelated sleep)."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
