"""Every bench script runs in its ``--quick`` mode (bench_trainer.py crashed for weeks unseen because
nothing ran it). Quick mode runs every code path once at tiny sizes and leaves BENCHMARKS.md alone; its
figures mean nothing, the measurements are the full runs that write BENCHMARKS.md. A new bench script is
picked up by the glob, so none can be added without this smoke test."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("bench_*.py"))
# Need the dev Slurm cluster (tests/slurm's conftest brings it up); they run with the Slurm tests' marker.
ON_SLURM = {"bench_preemption_slurm.py", "bench_sweep.py", "bench_agreement_slurm.py", "bench_failures_slurm.py"}
# Tallies a finished run's JUnit report: CI runs it on its own report after pytest (scripts/test.sh).
AFTER_PYTEST = {"bench_reliability.py"}


def _digest() -> str:
    return hashlib.sha256((ROOT / "BENCHMARKS.md").read_bytes()).hexdigest()


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s not in AFTER_PYTEST | ON_SLURM])
def test_bench_script_runs_quick_and_writes_nothing(script: str) -> None:
    before = _digest()
    p = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--quick"], capture_output=True, text=True,
                       timeout=900, cwd=str(ROOT))
    assert p.returncode == 0, f"{script} --quick exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert "|" in p.stdout, f"{script} --quick printed no table:\n{p.stdout[-2000:]}"
    assert _digest() == before, f"{script} --quick rewrote BENCHMARKS.md"


def test_every_bench_script_has_a_quick_mode() -> None:
    for script in SCRIPTS:
        assert "C.add_quick(ap)" in (ROOT / "bench" / script).read_text(), f"{script} has no --quick"


def test_reliability_table_is_tallied_from_a_runs_junit_report(tmp_path: Path) -> None:
    # scripts/test.sh tallies CI's own report; here a small real run stands in for it.
    xml = tmp_path / "junit.xml"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                          "-o", "junit_family=xunit1", str(ROOT / "tests/reliability/test_bad_input.py"),
                          "-k", "mem or time"], capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert run.returncode == 0, run.stdout[-2000:]
    before = _digest()
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_reliability.py"), "--from-junit", str(xml),
                        "--quick"], capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "R4" in p.stdout and "|" in p.stdout
    assert _digest() == before
