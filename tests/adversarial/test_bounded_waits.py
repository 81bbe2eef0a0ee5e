"""Issue 16: a process that cleared its environment and left the session is still seen in its run dir
(requeue refuses, the sweep throttle counts it); every lock wait is bounded and names its holder (a
Ctrl-Z'd `orch sweep` holding the launch lock stalls no reconcile pass); a FIFO at orch.toml hangs
nothing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from advkit import (
    job_argv,
    one_line_error,
    orch_popen,
    reconcile_ok,
    settle,
    show,
    status_map,
    wait_for,
    wait_no_procs,
)

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
    finishes within its bound, names the holder once, and still requeues a preempted plain job."""
    p = orch("submit", "--name", "p", "--", *job_argv("--no-gate", "--failure", "preempted", "--exit-code", "143"))
    assert p.returncode == 0, p.stderr
    wait_no_procs(orch.runs / "p", 30, "job p to be preempted")
    gate = tmp_path / "gate"
    sw = orch_popen(orch, "sweep", "--name", "s", "--grid", "i=0,1", "--throttle", "1", "--", "sleep", "0",
                    env={"ORCH_PAUSE_AT": "sweep_room_counted", "ORCH_PAUSE_UNTIL": str(gate), "ORCH_PAUSE_S": "300"})
    spawned.append(sw)
    wait_for(Path(str(gate) + ".reached").exists, 60, "orch sweep to hold the launch lock")
    os.kill(sw.pid, signal.SIGSTOP)
    try:
        r = reconcile_ok(orch, env={"ORCH_LOCK_TIMEOUT_S": "2"}, timeout=60)
        out = r.stdout + r.stderr
        assert len(re.findall(r"sweep-launch\.lock is held by", out)) == 1, out
        assert f"pid {sw.pid} (" in out and "stopped" in out, out
        d = show(orch, "p")
        assert len(d["attempts"]) == 2, ("the preempted job was not requeued while the lock was held", d)
    finally:
        os.kill(sw.pid, signal.SIGCONT)
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
