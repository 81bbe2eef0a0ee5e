"""A sweep's ``--throttle K`` reaches sbatch as ``--array=<indices>%K``, on both of orch sweep's paths (the quick
one, on a home whose DB exists, and SQLAlchemy's, a home's first command). sbatch is a PATH shim that keeps its
argv: the claim is the composed command line; tests/slurm/test_array_throttle.py shows Slurm honouring it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _sweep(tmp_path: Path, *args: str, db_first: bool) -> list[str]:
    """Run ``orch sweep`` of 3 tasks on slurm as a user does; the argv sbatch got."""
    shim, log = tmp_path / "bin", tmp_path / "sbatch.argv"
    shim.mkdir()
    (shim / "sbatch").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {log}\necho 4242\n")
    (shim / "sbatch").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "SLURM_"))}
    env.update(ORCH_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT), PATH=f"{shim}:{env['PATH']}")
    if db_first:  # the DB exists: orch sweep takes its quick path (orchestrator/ops/quicksweep.py)
        subprocess.run([sys.executable, "-m", "orchestrator.cli", "status"], env=env, check=True, capture_output=True)
    p = subprocess.run([sys.executable, "-m", "orchestrator.cli", "sweep", "--name", "s", "--grid", "i=1,2,3",
                        "--backend", "slurm", *args, "--", "echo", "{i}"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return log.read_text().splitlines()


@pytest.mark.parametrize("db_first", [True, False], ids=["quick-path", "sqlalchemy-path"])
def test_the_throttle_reaches_sbatch_as_the_arrays_percent_limit(tmp_path, db_first):
    argv = _sweep(tmp_path, "--throttle", "2", db_first=db_first)
    assert [a for a in argv if a.startswith("--array=")] == ["--array=0,1,2%2"], argv


def test_no_throttle_leaves_the_array_unlimited(tmp_path):
    argv = _sweep(tmp_path, db_first=True)
    assert [a for a in argv if a.startswith("--array=")] == ["--array=0,1,2"], argv
