"""A quick ``orch sweep`` on the real dev Slurm cluster, killed right after each statement of its transactions, as a
kill -9 would (``ORCH_FAULT=quick:<statement>``: ``os._exit`` inside the statement's transaction, before its
commit). Killed before the sweep's rows were committed, none of them exists and the same sweep, made again, runs
each task once; killed after, ``orch reconcile`` launches or finds each task and every task runs exactly once, under
its one attempt, with sacct holding no second copy. The sweep's other kill sites (between its transactions):
test_sweep_slurm.py.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from orchkit import wait_for
from slurmkit import cancel_all_of, node_idle, submitted_since

# Killed before any row: any_names_taken first runs in the sweep's preflight (a read: a name this DB holds is refused
# before the run dirs' processes are judged), so its kill is one before the births transaction; new_sweep and
# sweep_tasks are that transaction's second and last statement (a kill at either rolls it back whole)
BEFORE_ROWS = ["any_names_taken", "new_sweep", "sweep_tasks"]
# One statement of each transaction after it: the claims, the fence check, the batch mark (each before sbatch),
# and the record of the array's ids (after sbatch: found again by the batch token in its job name)
AFTER_ROWS = ["claim", "check_claim", "mark_batch", "record", "job_submitted"]
AFTER_SBATCH = {"record", "job_submitted"}
TASKS = 3
NAMES = [f"kq.{i:04d}" for i in range(TASKS)]
PROGRAM = ("import os; open(os.environ['RAN_LOG'], 'a').write(os.environ['ORCH_TASK_INDEX'] + '\\n'); "
           "open('result.txt', 'w').write('{i}')")


@pytest.fixture
def cleanup(orch):
    yield
    cancel_all_of(orch)


def _sweep(orch, log: Path, fault: str | None = None):
    env = {"RAN_LOG": str(log), **({"ORCH_FAULT": f"quick:{fault}"} if fault else {})}
    return orch("sweep", "--name", "kq", "--backend", "slurm", "--partition", "spot", "--cpus-per-task", "1",
                "--mem", "100M", "--grid", "i=" + ",".join(map(str, range(TASKS))), "--outputs", "result.txt", "--",
                sys.executable, "-c", PROGRAM, env=env)


def _rows(orch, sql: str) -> list[tuple]:
    with sqlite3.connect(orch.home / "orch.db") as c:
        return c.execute(sql).fetchall()


def _states(orch) -> dict[str, str]:
    return {r["name"]: r["state"] for r in orch.json("status") if r.get("sweep") == "kq"}


@pytest.mark.parametrize("statement", BEFORE_ROWS + AFTER_ROWS)
def test_a_quick_sweep_killed_after_any_statement_runs_each_task_exactly_once(orch, cleanup, tmp_path, statement):
    node_idle()
    assert orch("status").returncode == 0  # the DB exists at the schema head: the sweep takes the quick path
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    log = tmp_path / "ran.log"
    p = _sweep(orch, log, statement)
    assert p.returncode == 99, (statement, p.stdout, p.stderr)  # the quick path ran the statement, and died there
    if statement in BEFORE_ROWS:
        assert _rows(orch, "SELECT name FROM sweeps") == [] and _rows(orch, "SELECT name FROM jobs") == []
        p = _sweep(orch, log)  # the same sweep again: nothing of the killed one is in its way
        assert p.returncode == 0, p.stdout + p.stderr
    else:
        assert sorted(_rows(orch, "SELECT name FROM jobs")) == [(n,) for n in NAMES]
        assert not any(a["external_id"] for n in NAMES for a in orch.show(n)["attempts"])  # never recorded

    def verified() -> bool:
        if set(_states(orch).values()) == {"done_marker_verified"}:
            return True
        # The dead submitter's claims expire after the launch grace (120 s: longer than sbatch's timeout).
        orch("reconcile", check=True, env={"ORCH_LAUNCH_GRACE_S": "5"})
        return False

    wait_for(verified, 200, "every kq task verified", interval=1, detail=lambda: _states(orch))
    attempts = {n: orch.show(n)["attempts"] for n in NAMES}
    assert all(len(a) == 1 for a in attempts.values()), attempts  # one attempt each
    assert Counter(log.read_text().split()) == {str(i): 1 for i in range(TASKS)}, log.read_text()  # each ran once
    for n in NAMES:
        assert (orch.runs / n / "result.txt").read_text() == n[-1]
    exts = {a[0]["external_id"] for a in attempts.values()}
    submitted = submitted_since(since)
    if statement in AFTER_SBATCH:  # the one array sbatch accepted, found by its token: no second sbatch
        (array,) = {e.split("_")[0] for e in exts}
        assert exts == {f"{array}_{i}" for i in range(TASKS)} and submitted == {array}, (submitted, attempts)
    else:  # nothing reached sbatch before the kill: sacct holds exactly the jobs the DB names
        assert submitted == {e.split("_")[0] for e in exts}, (submitted, attempts)
