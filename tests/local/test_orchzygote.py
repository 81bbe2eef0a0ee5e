"""The tests' ``orch`` runner (tests/orchzygote.py) forks the real entry point from a process that imported orch
already: each claim here is that a forked run answers as a new ``python -m orchestrator.cli`` process does, so the
tests that use it still test the command a user runs."""

from __future__ import annotations

import subprocess

import orchzygote
import pytest
from orchkit import PY, ROOT


def _fresh(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "orchestrator.cli", *argv], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), timeout=120)


@pytest.mark.parametrize("argv", [["--help"], ["submit", "--bogus"], ["show", "nope"], ["status", "--json"],
                                  ["verify", "nope"], ["submit", "--name", "a b", "--", "true"]],
                         ids=["help", "usage-error", "no-such-job", "status", "verify", "bad-name"])
def test_a_forked_run_answers_as_a_new_process_does(orch, argv):
    orch("status", check=True)  # the DB exists for both runs alike
    forked = orchzygote.run_orch(PY, argv, orch.env, str(ROOT), 120, orch.env)
    fresh = _fresh(argv, orch.env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_forked_run_gets_the_runs_own_environment_and_dies_where_a_fault_says(orch):
    # ORCH_FAULT is read at the site, in the child: exit 99 there, as a new process would, and nothing after it
    p = orch("submit", "--name", "f", "--", "true", env={"ORCH_FAULT": "after_attempt_row"})
    assert p.returncode == 99 and p.stdout == "", (p.returncode, p.stdout, p.stderr)


def test_a_run_past_its_timeout_is_killed_and_reported_as_subprocess_reports_it(orch):
    env = {"ORCH_PAUSE_AT": "before_backend_submit", "ORCH_PAUSE_S": "60"}
    with pytest.raises(subprocess.TimeoutExpired):
        orch("submit", "--name", "slow", "--", "true", env=env, timeout=3)


def test_the_server_never_imports_a_module_that_reads_the_environment_when_imported():
    code = ("import sys, importlib, orchzygote\n"
            "[importlib.import_module(m) for m in orchzygote.PRELOAD]\n"
            "print([m for m in orchzygote.PRELOAD_NEVER if m in sys.modules])")
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=str(ROOT / "tests"), timeout=120)
    assert (p.returncode, p.stdout) == (0, "[]\n"), p.stderr
