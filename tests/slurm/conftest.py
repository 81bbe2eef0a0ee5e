"""Real-Slurm tests: the dev cluster of deploy/slurm/cluster.sh (Slurm 22.05; three slurmd nodes on this machine).

Every test here is marked ``slurm``. The session fixture brings the cluster up (idempotent: about
2 s when it already runs, under a minute from scratch with the packages' install). With CI=true a
cluster that cannot be brought up FAILS the tests — never skips them. Without CI, a user who is not
root (and has no running cluster) gets a skip that says so; a root user whose cluster.sh fails gets
a failure, because that is a bug in cluster.sh.

Jobs a test starts are cancelled at its end, so one test's leftovers never preempt or block the next.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from slurmkit import IN_CI, SlurmKit, cluster_status, cluster_up


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session", autouse=True)
def cluster() -> None:
    """The dev cluster, usable: sinfo shows the node idle/mixed and sacct answers."""
    if os.geteuid() != 0 and cluster_status().returncode != 0:
        msg = "the dev Slurm cluster is not running and only root can start it (deploy/slurm/cluster.sh up)"
        if IN_CI:
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg + "; not root and CI is not set")
    if os.geteuid() == 0:
        p = cluster_up()
        if p.returncode != 0:
            pytest.fail(f"deploy/slurm/cluster.sh up failed ({p.returncode}):\n{p.stdout}\n{p.stderr}",
                        pytrace=False)


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmKit]:
    kit = SlurmKit(tmp=tmp_path)
    try:
        yield kit
    finally:
        kit.cleanup()


@pytest.fixture
def script(tmp_path: Path) -> Callable[[str, str], list[str]]:
    """Write a small Python program to a file; return the argv that runs it with this interpreter."""

    def make(name: str, source: str) -> list[str]:
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        return [sys.executable, str(path)]

    return make


