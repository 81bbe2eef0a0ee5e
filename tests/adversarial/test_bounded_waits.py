"""A process that cleared its environment and left the session is still seen in its run dir
(requeue refuses, the sweep throttle counts it); every lock wait is bounded and names its holder (a
Ctrl-Z'd `orch sweep` holding the launch lock stalls no reconcile pass); a FIFO at orch.toml hangs
nothing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from advkit import (
    job_argv,
    one_line_error,
    orch_popen,
    reconcile_ok,
    settle,
    show,
    status_map,
    wait_no_procs,
)
from orchkit import wait_for

ROOT = Path(__file__).resolve().parents[2]
# The job leaves behind a process with an empty environment in its own session, its cwd the run dir.
ESCAPE = ('env -i setsid sh -c \'echo $$ > escapee.pid; exec sleep 300\' </dev/null >/dev/null 2>&1 & '
          'while [ ! -s escapee.pid ]; do sleep 0.05; done')


def _escapee(run: Path) -> int:
    wait_for(lambda: (run / "escapee.pid").exists() and (run / "escapee.pid").read_text().strip(), 30,
             "the escaped process to start")
    return int((run / "escapee.pid").read_text())


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_requeue_refuses_while_a_process_that_cleared_its_env_and_left_the_session_runs_in_the_run_dir(orch):
    p = orch("submit", "--name", "x", "--", "sh", "-c", f"{ESCAPE}; exit 1")
    assert p.returncode == 0, p.stderr
    run = orch.runs / "x"
    pid = _escapee(run)
    try:
        wait_no_procs(run, 30, "the job's own processes to end")
        settle(orch, ["x"])
        assert show(orch, "x")["state"] in ("failed", "retryable_failed"), show(orch, "x")
        p = orch("requeue", "x")
        assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
        assert f"pid {pid} " in p.stdout + p.stderr, (p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
        assert len(show(orch, "x")["attempts"]) == 1, "attempt 2 was started beside the escaped process"
    finally:
        _kill(pid)
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 30, "the escaped process to end")
    # The user's own shell sitting in the run dir (orch's ancestor) holds nothing.
    q = subprocess.run(["sh", "-c", f'cd "{run}" && "{sys.executable}" -m orchestrator.cli requeue x; echo rc=$?'],
                       env=orch.env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert "rc=0" in q.stdout, (q.stdout, q.stderr)


def _zombie(pid: int) -> bool:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return data.rsplit(b")", 1)[-1].split()[0] == b"Z"


def test_a_sweep_tasks_escaped_process_holds_its_throttle_slot(orch):
    prog = f'if [ "{{i}}" = 0 ]; then {ESCAPE}; fi; exit 0'
    p = orch("sweep", "--name", "s", "--grid", "i=0,1", "--throttle", "1", "--", "sh", "-c", prog)
    assert p.returncode == 0, (p.stdout, p.stderr)
    run0 = orch.runs / "s.0000"
    pid = _escapee(run0)
    try:
        wait_no_procs(run0, 30, "task 0's own processes to end")
        for _ in range(3):
            reconcile_ok(orch)
        rows = status_map(orch)
        assert rows["s.0000"]["state"] not in ("submitted", "running"), rows["s.0000"]
        assert show(orch, "s.0001")["attempts"][-1]["state"] == "pending", (
            "task 1 was launched while task 0's escaped process still held the only slot")
    finally:
        _kill(pid)
    wait_for(lambda: _zombie(pid), 30, "the escaped process to end")
    wait_for(lambda: reconcile_ok(orch) and show(orch, "s.0001")["attempts"][-1]["state"] != "pending", 60,
             "task 1 to launch once the slot is free", interval=0.2)


def test_a_stopped_sweep_holding_the_launch_lock_stalls_no_reconcile_pass(orch, spawned, tmp_path):
    """`orch sweep` stopped with Ctrl-Z while it holds $ORCH_HOME/sweep-launch.lock: a reconcile pass
    finishes within its bound, names the holder once (however many sweeps it blocks), and still requeues
    a preempted plain job; a preempted task of another sweep is requeued, its launch left for later."""
    preempted = ("--", *job_argv("--no-gate", "--failure", "preempted", "--exit-code", "143"))
    p = orch("submit", "--name", "p", *preempted)
    assert p.returncode == 0, p.stderr
    p = orch("sweep", "--name", "t", "--grid", "i=0,1", "--throttle", "1", *preempted)
    assert p.returncode == 0, p.stderr
    for run in (orch.runs / "p", orch.runs / "t.0000"):
        wait_no_procs(run, 30, f"{run.name} to be preempted")
    gate = tmp_path / "gate"
    sw = orch_popen(orch, "sweep", "--name", "s", "--grid", "i=0,1", "--throttle", "1", "--", "sleep", "0",
                    env={"ORCH_PAUSE_AT": "sweep_room_counted", "ORCH_PAUSE_UNTIL": str(gate), "ORCH_PAUSE_S": "300"})
    spawned.append(sw)
    wait_for(Path(str(gate) + ".reached").exists, 60, "orch sweep to hold the launch lock")
    os.kill(sw.pid, signal.SIGSTOP)
    try:
        # Bound 600 s: only the rules (a stopped holder is not waited for; a pass waits <= 2 s) keep this in 60 s.
        r = reconcile_ok(orch, env={"ORCH_LOCK_TIMEOUT_S": "600"}, timeout=60)
        out = r.stdout + r.stderr
        assert len(re.findall(r"sweep-launch\.lock is held by", out)) == 1, out
        assert re.search(rf"held by pid {sw.pid} \([^\n]*orchestrator\.cli sweep --name s [^\n]*, stopped\)", out), out
        d = show(orch, "p")
        assert len(d["attempts"]) == 2, ("the preempted job was not requeued while the lock was held", d)
        d = show(orch, "t.0000")
        assert len(d["attempts"]) == 2 and d["attempts"][-1]["state"] == "pending", d["attempts"]
        # A new sweep meanwhile is created, its launch left to reconcile, with the holder named.
        u = orch("sweep", "--name", "u", "--grid", "i=0", "--", "true", env={"ORCH_LOCK_TIMEOUT_S": "600"},
                 timeout=60)
        assert u.returncode == 0, (u.returncode, u.stdout, u.stderr)
        assert f"held by pid {sw.pid} (" in u.stderr and "`orch reconcile` launches the tasks" in u.stderr, u.stderr
        assert show(orch, "u.0000")["attempts"][-1]["state"] == "pending"
    finally:
        os.kill(sw.pid, signal.SIGCONT)
        gate.touch()
    sw.communicate(timeout=60)


def test_a_live_launch_lock_holder_costs_a_reconcile_pass_at_most_its_short_wait(orch, spawned, tmp_path):
    """A pass never spends more than a few seconds on locks. An `orch sweep` that holds the launch lock
    and runs (here paused at a test site, as a slow launch would be) costs a pass 2 s, not the lock's bound."""
    preempted = ("--", *job_argv("--no-gate", "--failure", "preempted", "--exit-code", "143"))
    p = orch("sweep", "--name", "t", "--grid", "i=0,1", "--throttle", "1", *preempted)
    assert p.returncode == 0, p.stderr
    wait_no_procs(orch.runs / "t.0000", 30, "t.0000 to be preempted")
    gate = tmp_path / "gate"
    sw = orch_popen(orch, "sweep", "--name", "s", "--grid", "i=0,1", "--throttle", "1", "--", "sleep", "0",
                    env={"ORCH_PAUSE_AT": "sweep_room_counted", "ORCH_PAUSE_UNTIL": str(gate), "ORCH_PAUSE_S": "300"})
    spawned.append(sw)
    wait_for(Path(str(gate) + ".reached").exists, 60, "orch sweep to hold the launch lock")
    try:
        # Bound 600 s: only the pass's own short wait keeps this within reconcile_ok's 60 s.
        r = reconcile_ok(orch, env={"ORCH_LOCK_TIMEOUT_S": "600"}, timeout=60)
        out = r.stdout + r.stderr
        assert re.search(rf"sweep-launch\.lock is held by pid {sw.pid} \([^\n]*\)[^\n]*; gave up after 2 s", out), out
        assert show(orch, "t.0000")["attempts"][-1]["state"] == "pending"  # requeued; launched by a later pass
    finally:
        gate.touch()
    sw.communicate(timeout=60)


def test_a_fifo_at_orch_toml_is_a_usage_error_not_a_hang(orch):
    orch.home.mkdir(parents=True, exist_ok=True)
    os.mkfifo(orch.home / "orch.toml")
    try:
        p = orch("status", timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError("orch status hung on a FIFO at orch.toml") from None
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    one_line_error(p.stderr)
    assert "orch.toml" in p.stderr and "not a regular file" in p.stderr, p.stderr
    assert sorted(x.name for x in orch.home.iterdir()) == ["orch.toml"], "something was written"


@pytest.mark.timeout(120)
def test_a_lock_wait_gives_up_at_once_naming_a_stopped_holder_from_its_record_or_proc_locks(tmp_path):
    """filelock.exclusive against a real process holding the lock, stopped: an error at once that names the
    holder's pid and command, from the holder's record and from /proc/locks alone, and how to resume it."""
    from orchestrator import filelock
    from orchestrator.errors import OrchError

    lock = tmp_path / "x.lock"
    holder_src = ("import sys, time; from pathlib import Path; from orchestrator import filelock\n"
                  "from orchestrator.errors import OrchError\n"
                  "with filelock.exclusive(Path(sys.argv[1]), OrchError):\n"
                  "    Path(sys.argv[1] + '.held').touch(); time.sleep(300)\n")
    h = subprocess.Popen([sys.executable, "-c", holder_src, str(lock)], cwd=str(ROOT),
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_for(Path(str(lock) + ".held").exists, 30, "the holder to take the lock")
        os.kill(h.pid, signal.SIGSTOP)
        try:  # a stopped holder is not waited for: the 300 s bound would fail this test's own
            with filelock.exclusive(lock, OrchError, "the test lock ", timeout_s=300):
                raise AssertionError("got a lock a stopped process holds")
        except filelock.LockTimeout as e:
            msg = str(e)
        assert re.search(rf"held by pid {h.pid} \(.*-c import sys.*, stopped\) on \S+ since \S+; not waited for: "
                         rf"a stopped holder cannot let go \(resume it with kill -CONT {h.pid}, or end it\)", msg), msg
        # Without its record (a holder that died before writing it, a foreign tool): /proc/locks names it.
        assert filelock.holder(lock).startswith(f"pid {h.pid} ("), filelock.holder(lock)
    finally:
        h.kill()
        h.wait(timeout=30)


def test_database_is_locked_names_the_writer(orch):
    p = orch("status")
    assert p.returncode == 0, p.stderr
    (orch.home / "orch.toml").write_text("[reconcile]\nbusy_timeout_ms = 300\n")
    src = ("import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
           "c.execute('BEGIN IMMEDIATE'); open(sys.argv[1] + '.held', 'w').close(); time.sleep(300)\n")
    w = subprocess.Popen([sys.executable, "-c", src, str(orch.home / "orch.db")])
    try:
        wait_for(Path(str(orch.home / "orch.db") + ".held").exists, 30, "the writer to hold the DB")
        p = orch("cancel", "nosuchjob", timeout=60)
        q = orch("submit", "--name", "a", "--", "true", timeout=60)
        out = p.stderr + q.stderr
        assert f"is locked by pid {w.pid} (" in out, (p.returncode, p.stderr, q.returncode, q.stderr)
    finally:
        w.kill()
        w.wait(timeout=30)
        Path(str(orch.home / "orch.db") + ".held").unlink(missing_ok=True)


def _sweep_inside_its_write_transaction(orch) -> tuple[subprocess.Popen, Path]:
    """An ``orch sweep`` paused inside its first write transaction until the returned path exists (a busy
    timeout of 300 s for every command)."""
    assert orch("status").returncode == 0
    (orch.home / "orch.toml").write_text("[reconcile]\nbusy_timeout_ms = 300000\n")
    until = orch.home.parent / "sweep.go"
    sw = orch_popen(orch, "sweep", "--name", "sw", "--grid", "i=1,2", "--", *job_argv(),
                    env={"ORCH_PAUSE_AT": "names_checked", "ORCH_PAUSE_S": "100", "ORCH_PAUSE_UNTIL": str(until)},
                    preexec_fn=lambda: signal.signal(signal.SIGTSTP, signal.SIG_DFL))  # as a terminal's job has it
    wait_for(Path(str(until) + ".reached").exists, 60, "the sweep to hold its write transaction")
    return sw, until


def _resume_to_its_end(sw: subprocess.Popen) -> None:
    os.kill(sw.pid, signal.SIGCONT)
    _, err = sw.communicate(timeout=60)
    assert sw.returncode == 0, err


@pytest.mark.timeout(120)  # the busy timeout is 300 s: a wait for the stopped sweep fails the test here
def test_a_sweep_stopped_inside_its_write_transaction_stalls_no_other_command(orch):
    """Hostile pass: an ``orch sweep`` stopped (kill -STOP) while it held SQLite's write lock made
    every submit and reconcile pass wait the whole busy timeout, then fail. A stopped writer cannot let go:
    each writer is refused at once, naming it and how to resume it; readers go on; once it is resumed, the
    sweep completes and every command works again."""
    sw, until = _sweep_inside_its_write_transaction(orch)
    try:
        os.kill(sw.pid, signal.SIGSTOP)
        for args in (("submit", "--name", "a", "--", "true"), ("reconcile",)):
            p = orch(*args, timeout=60)
            assert p.returncode == 1, (args, p.returncode, p.stderr)
            one_line_error(p.stderr)
            assert re.search(rf"is locked by pid {sw.pid} \(.*orch.*sweep.*, stopped\); not waited for: a stopped "
                             rf"writer cannot let go \(resume it with kill -CONT {sw.pid}, or end it\)", p.stderr), \
                p.stderr
        assert orch("status", timeout=30).returncode == 0  # a reader: WAL
        until.touch()
        _resume_to_its_end(sw)
    finally:
        sw.kill()
        sw.wait(timeout=30)
    assert orch("submit", "--name", "a", "--", "true", timeout=60).returncode == 0
    assert set(status_map(orch)) >= {"a", "sw.0000", "sw.0001"}


@pytest.mark.timeout(120)
def test_ctrl_z_inside_a_write_transaction_stops_the_command_after_its_commit(orch):
    """A user's Ctrl-Z (SIGTSTP) reaches ``orch sweep`` inside its write transaction: the sweep stops once it has
    committed, holding no DB lock, so other commands write at once; resumed, it completes."""
    from orchestrator import filelock

    sw, until = _sweep_inside_its_write_transaction(orch)
    try:
        os.kill(sw.pid, signal.SIGTSTP)
        until.touch()  # its transaction may commit now; the Ctrl-Z stops it right after
        wait_for(lambda: filelock.is_stopped(sw.pid), 60, "the sweep to stop after its commit")
        assert filelock.sqlite_writer(orch.home / "orch.db") == ""
        p = orch("submit", "--name", "a", "--", "true", timeout=60)
        assert p.returncode == 0, p.stderr
        _resume_to_its_end(sw)
    finally:
        sw.kill()
        sw.wait(timeout=30)
    assert set(status_map(orch)) >= {"a", "sw.0000", "sw.0001"}


HOLD_LEASE = ("import os, socket, sys, time; from orchestrator.core.config import load_config; "
              "from orchestrator.core.db import Database; from orchestrator.ops.reconcile import acquire_lease\n"
              "assert acquire_lease(Database(load_config()), load_config(), f'{socket.gethostname()}:{os.getpid()}')\n"
              "open(sys.argv[1], 'w').close(); time.sleep(300)\n")


@pytest.mark.timeout(120)
def test_a_stopped_reconciler_holding_the_lease_stalls_no_other_pass(orch):
    """Hostile pass: a Ctrl-Z'd ``orch reconcile`` held the pass lease for its whole lease_ttl_s (120 s)
    and every other pass did nothing, quietly (a finished job's ``submit --wait`` took 120 s). A live holder is
    named; a stopped one on this host has its lease taken at once, with a warning that says how to resume it."""
    assert orch("status").returncode == 0
    held = orch.home.parent / "lease.held"
    h = subprocess.Popen([sys.executable, "-c", HOLD_LEASE, str(held)], env=orch.env, cwd=str(ROOT))
    try:
        wait_for(held.exists, 60, "the other reconciler to hold the lease")
        p = orch("reconcile", timeout=60)
        assert p.returncode == 0, p.stderr
        assert re.search(rf"^another reconciler holds the lease \(pid {h.pid} on \S+ until \S+\); nothing done$",
                         p.stderr, re.M), p.stderr
        os.kill(h.pid, signal.SIGSTOP)
        p = orch("reconcile", "--json", timeout=60)
        assert p.returncode == 0, p.stderr
        rep = json.loads(p.stdout)
        assert rep["ran"] is True, rep
        assert re.fullmatch(rf"took over the reconcile lease from pid {h.pid} \(.*orchestrator.*, stopped\): resume it "
                            rf"with kill -CONT {h.pid}, or end it", rep["warnings"][0]), rep
    finally:
        h.kill()
        h.wait(timeout=30)
