"""The suite's own bounds and tiers: every test has a timeout (pytest-timeout, pyproject.toml), a test that
waits for ever fails within its bound with a stack dump instead of holding the run, and the markers that
select the quick tier say what each test needs (tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FOREVER = '''
import threading

import pytest


@pytest.mark.timeout(2)
def test_waits_for_ever():
    threading.Event().wait()
'''


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest with the project's configuration (pyproject.toml), on a test folder of its own."""
    return subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                           str(tmp_path), "-p", "no:cacheprovider", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)


def test_pytest_prints_the_per_test_timeout_the_project_sets(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    p = _pytest(tmp_path, "test_nothing.py")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "timeout: 1200.0s" in p.stdout and "timeout method: signal" in p.stdout, p.stdout


def test_a_test_that_waits_for_ever_fails_at_its_bound_with_a_stack_dump(tmp_path):
    (tmp_path / "test_forever.py").write_text(FOREVER)
    p = _pytest(tmp_path, "test_forever.py")  # without the plugin: subprocess's TimeoutExpired fails this
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Failed: Timeout (>2.0s) from pytest-timeout" in p.stdout, p.stdout
    assert "threading.Event().wait()" in p.stdout  # where it hung: the test's own line, in the traceback
    assert "1 failed" in p.stdout


def test_a_unit_test_gets_the_unit_folders_bound(request):
    mark = request.node.get_closest_marker("timeout")
    assert mark is not None and mark.args == (120,)


def test_a_unit_test_is_in_the_quick_tier_and_needs_nothing(request):
    names = {m.name for m in request.node.iter_markers()}
    assert "quick" in names and not names & {"slurm", "postgres", "e2e"}


@pytest.mark.each_db
def test_a_postgres_variant_is_marked_postgres_and_left_out_of_the_quick_tier(request, db_kind):
    names = {m.name for m in request.node.iter_markers()}
    if db_kind == "postgres":
        assert "postgres" in names and "quick" not in names
    else:
        assert "quick" in names and "postgres" not in names
