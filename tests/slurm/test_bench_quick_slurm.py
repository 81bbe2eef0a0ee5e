"""The bench scripts that need the dev Slurm cluster, in their ``--quick`` mode (see tests/bench/test_bench_quick.py:
a bench script nothing runs rots unseen). Here because this folder's conftest brings the cluster up."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurmkit import run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dormant_jobs() -> Iterator[None]:
    """Jobs that cannot take the node while the bench runs: one not eligible for 7 days, one held. CI met such a
    job (a killed test run's --begin array) and both benches waited on it until this test's timeout."""
    ids = [run("sbatch", "--parsable", "-p", "spot", *how, "--wrap", "true").stdout.strip().split(";")[0]
           for how in (["--begin=now+7days"], ["--hold"])]
    try:
        yield
    finally:
        run("scancel", *ids)


@pytest.mark.parametrize("script", ["bench_preemption_slurm.py", "bench_sweep.py", "bench_agreement_slurm.py",
                                    "bench_failures_slurm.py"])
def test_slurm_bench_script_runs_quick_and_writes_nothing(script: str, dormant_jobs: None) -> None:
    before = hashlib.sha256((ROOT / "BENCHMARKS.md").read_bytes()).hexdigest()
    p = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--quick"], capture_output=True, text=True,
                       timeout=900, cwd=str(ROOT))
    assert p.returncode == 0, f"{script} --quick exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert "|" in p.stdout, f"{script} --quick printed no table:\n{p.stdout[-2000:]}"
    assert hashlib.sha256((ROOT / "BENCHMARKS.md").read_bytes()).hexdigest() == before
