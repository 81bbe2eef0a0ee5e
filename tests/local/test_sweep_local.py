"""Sweeps on the local backend: one job per argument set, at most --throttle running at once, each
task recovered on its own; a sweep's name works for status, show, cancel and requeue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from localkit import db_rows
from orchkit import wait_for

# Each run appends "task attempt" to the sweep-wide log (a second run of a task shows as two lines),
# holds for a moment (so the throttle has something to hold back), then writes its result.
TASK = ('echo "$ORCH_TASK_INDEX $ORCH_ATTEMPT" >> "$LOG"; sleep 0.6; mkdir -p result; '
        'echo "{lr} $ORCH_SWEEP_PARAMS" > result/out.txt')


def _tasks_alive(sweep: str) -> set[str]:
    """The task indexes whose program (or a child of it) runs now. orch's own wrapper is left out: it exits just
    after writing the exit record that ends the attempt and frees its slot, and under load (CI, 3 suites on 2 cores)
    two finishing wrappers beside the next two programs counted as 4 tasks at once."""
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if b"orchestrator.jobside.wrapper" in f.read():
                        continue
            except OSError:
                continue
            if f"ORCH_SWEEP={sweep}".encode() in env:
                out |= {e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"ORCH_TASK_INDEX=")}
    return out


def _settle(orch, names, timeout=90):
    def settled() -> dict | None:
        orch("reconcile", check=True)
        rows = {r["name"]: r for r in orch.json("status")}
        ended = {"done_marker_verified", "retryable_failed", "failed", "cancelled"}
        return rows if all(rows[n]["state"] in ended for n in names) else None

    return wait_for(settled, timeout, f"{names} to settle", interval=0.3, detail=lambda: orch.json("status"))


def test_a_throttled_sweep_never_runs_more_than_its_throttle_and_runs_each_task_once(orch, tmp_path):
    log = tmp_path / "runs.log"
    env = {"LOG": str(log)}
    seen: list[set[str]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.append(_tasks_alive("sw"))
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        p = orch("sweep", "--name", "sw", "--grid", "lr=0.1,0.2,0.3", "--grid", "seed=1,2", "--throttle", "2",
                 "--outputs", "result/out.txt", "--", "sh", "-c", TASK, env=env)
        assert p.returncode == 0, p.stderr
        assert "6 tasks on local, at most 2 at once" in p.stdout
        names = [f"sw.{i:04d}" for i in range(6)]
        rows = _settle(orch, names)
    finally:
        stop.set()
        t.join()
    assert all(rows[n]["state"] == "done_marker_verified" for n in names), rows
    assert max(len(s) for s in seen) == 2, "the throttle held back nothing, or let more through"
    lines = sorted(log.read_text().splitlines())
    assert lines == [f"{i} 1" for i in range(6)], lines  # each task ran once, as attempt 1
    out = (orch.runs / "sw.0003" / "result" / "out.txt").read_text()
    assert out.startswith("0.2 ") and json.loads(out.split(" ", 1)[1]) == {"lr": "0.2", "seed": "2"}
    table = orch("status", check=True).stdout
    assert "sw  " in table and "sweep of 6: 6 done_marker_verified" in table and "sw.0003" not in table
    assert "sw.0003" in orch("status", "--tasks", check=True).stdout
    shown = orch.json("show", "sw")
    assert shown["states"] == {"done_marker_verified": 6} and len(shown["task_list"]) == 6


def test_a_crashed_task_is_requeued_alone_through_the_sweeps_name(orch, tmp_path):
    log = tmp_path / "runs.log"
    crash_once = ('echo "$ORCH_TASK_INDEX $ORCH_ATTEMPT" >> "$LOG"; '
                  '[ "$ORCH_TASK_INDEX" = 1 ] && [ "$ORCH_ATTEMPT" = 1 ] && exit 1; echo ok > out.txt')
    p = orch("sweep", "--name", "cr", "--grid", "i=a,b,c", "--outputs", "out.txt", "--", "sh", "-c", crash_once,
             env={"LOG": str(log)})
    assert p.returncode == 0, p.stderr
    rows = _settle(orch, ["cr.0000", "cr.0001", "cr.0002"])
    assert [rows[f"cr.000{i}"]["state"] for i in range(3)] == ["done_marker_verified", "retryable_failed",
                                                              "done_marker_verified"]
    r = orch("requeue", "cr", "--json", check=True)  # the sweep's name: its tasks that need it
    assert [(x["name"], x["outcome"]) for x in json.loads(r.stdout)] == [("cr.0001", "requeued")]
    rows = _settle(orch, ["cr.0001"])
    assert rows["cr.0001"]["state"] == "done_marker_verified"
    assert sorted(log.read_text().splitlines()) == ["0 1", "1 1", "1 2", "2 1"]


def test_cancel_by_sweep_name_stops_every_task(orch):
    p = orch("sweep", "--name", "cx", "--grid", "i=1,2,3", "--throttle", "2", "--", "sh", "-c", "sleep 60")
    assert p.returncode == 0, p.stderr
    wait_for(lambda: len(_tasks_alive("cx")) >= 2, 30, "two of the sweep's tasks to start", interval=0.1)
    c = orch("cancel", "cx")
    assert c.returncode == 0 and c.stdout.count(": cancelled") == 3, c.stdout + c.stderr
    open_attempts = "SELECT count(*) FROM attempts WHERE state NOT IN ('cancelled', 'failed', 'succeeded')"

    def all_stopped() -> bool:
        if not _tasks_alive("cx") and db_rows(orch.home, open_attempts) == [(0,)]:
            return True
        orch("reconcile", check=True)
        return False

    wait_for(all_stopped, 60, "every task to end and every attempt to close after the cancel", interval=0.3)
    rows = {r["name"]: r for r in orch.json("status")}
    assert {rows[f"cx.000{i}"]["state"] for i in range(3)} == {"cancelled"}
    assert db_rows(orch.home, "SELECT count(*) FROM attempts WHERE state NOT IN ('cancelled')") == [(0,)]


def test_a_resubmitted_sweep_never_reruns_a_verified_task(orch, tmp_path):
    log = tmp_path / "runs.log"
    args = ("sweep", "--name", "re", "--grid", "i=1,2", "--outputs", "out.txt", "--", "sh", "-c",
            'echo "$ORCH_TASK_INDEX" >> "$LOG"; [ -e "$ORCH_RUN_DIR/fail" ] && exit 1; echo ok > out.txt')
    (orch.runs / "re.0001").mkdir(parents=True)
    (orch.runs / "re.0001" / "fail").touch()
    assert orch(*args, env={"LOG": str(log)}).returncode == 0
    _settle(orch, ["re.0000", "re.0001"])
    (orch.runs / "re.0001" / "fail").unlink()
    for f in orch.home.glob("orch.db*"):  # the DB is lost; the runs root is not
        f.unlink()
    p = orch(*args, env={"LOG": str(log)})
    assert p.returncode == 0, p.stderr
    rows = _settle(orch, ["re.0000", "re.0001"])
    assert rows["re.0000"]["state"] == rows["re.0001"]["state"] == "done_marker_verified"
    assert rows["re.0000"]["attempts"] == 0  # recorded done from its verified marker, not rerun
    assert sorted(log.read_text().splitlines()) == ["0", "1", "1"]


def test_a_sweep_resubmitted_with_other_parameters_never_takes_old_results_as_its_own(orch):
    # Hostile tester: after a lost DB, `r` with x=7,8,9 recorded r.0000 done from x=1's result.
    cmd = ("--outputs", "o", "--", "/bin/sh", "-c", "echo {x} > o")
    assert orch("sweep", "--name", "r", "--grid", "x=1,2", *cmd).returncode == 0
    _settle(orch, ["r.0000", "r.0001"])
    for f in orch.home.glob("orch.db*"):  # the DB is lost; the runs root is not
        f.unlink()
    before = sorted(p.relative_to(orch.runs) for p in orch.runs.rglob("*"))
    p = orch("sweep", "--name", "r", "--grid", "x=7,8,9", *cmd)
    assert (p.returncode, p.stdout) == (3, ""), p.stderr
    assert p.stderr == (f"orch: refused: r.0000: {orch.runs / 'r.0000'} holds a verified result of another command "
                        '(attempt 1 ran ["/bin/sh", "-c", "echo 1 > o"], this task runs ["/bin/sh", "-c", '
                        '"echo 7 > o"]); use another sweep name, or move that run dir away\n')
    assert sorted(p.relative_to(orch.runs) for p in orch.runs.rglob("*")) == before  # nothing written
    assert orch.json("status") == []
    # The same parameters again: the verified results are its own, recorded done, not rerun.
    assert orch("sweep", "--name", "r", "--grid", "x=1,2", *cmd).returncode == 3  # every task verified
    assert orch("sweep", "--name", "r", "--grid", "x=1,2,3", *cmd).returncode == 0
    rows = _settle(orch, ["r.0000", "r.0001", "r.0002"])
    assert [rows[f"r.000{i}"]["attempts"] for i in range(3)] == [0, 0, 1]
    assert (orch.runs / "r.0002" / "o").read_text() == "3\n"


def test_bad_sweep_arguments_are_refused_before_anything_is_written(orch):
    p = orch("sweep", "--name", "b", "--grid", "lr=1,2", "--", "train", "{seed}")
    assert p.returncode == 2 and "no 'seed'" in p.stderr, p.stderr
    p = orch("sweep", "--name", "b", "--", "train")
    assert p.returncode == 2 and "--grid" in p.stderr
    assert not Path(orch.home / "runs").exists() or not any((orch.home / "runs").iterdir())
    # a task named like a job that still runs: refused for its name, not as a live attempt the DB "does not know"
    assert orch("submit", "--name", "taken.0000", "--", "sleep", "60").returncode == 0
    p = orch("sweep", "--name", "taken", "--grid", "i=1", "--", "true")
    assert p.returncode == 3 and "already exist" in p.stderr, p.stderr
    assert orch("cancel", "taken.0000").returncode == 0


def test_a_job_cannot_take_a_sweeps_name(orch):
    # Sweep and job names share one namespace: `orch submit` used to check only the jobs table.
    assert orch("sweep", "--name", "grid", "--grid", "x=1", "--", "true", "{x}").returncode == 0
    p = orch("submit", "--name", "grid", "--", "true")
    assert (p.returncode, p.stdout) == (3, "")
    assert p.stderr == "orch: refused: 'grid' already exists (a job or a sweep); use `orch requeue grid`\n"
    assert not (orch.runs / "grid").exists()
    assert [j["name"] for j in orch.json("status", "--tasks")] == ["grid.0000"]


def _waiting_on_lock(pid: int, lock_file: Path) -> bool:
    """``pid`` has ``lock_file`` open: orch's bounded lock wait opens the file, then polls a non-blocking flock,
    so while another process holds it, an open descriptor is the observable sign of the wait (a
    blocking flock's ``->`` line in /proc/locks never appears: the earlier check waited out the 30 s bound)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(lock_file):
                return True
        except OSError:
            continue
    return False


def test_two_launchers_at_once_never_run_more_tasks_than_the_throttle(orch, tmp_path):
    # `orch requeue` of two failed tasks at once (or a requeue beside a reconcile pass) each counted
    # the one free slot before the other launched: two tasks ran under --throttle 1.
    for i in (0, 1):
        (orch.runs / f"th.000{i}").mkdir(parents=True)
        (orch.runs / f"th.000{i}" / "fail").touch()
    p = orch("sweep", "--name", "th", "--grid", "i=1,2", "--throttle", "1", "--", "sh", "-c",
             '[ -e "$ORCH_RUN_DIR/fail" ] && exit 1; exec sleep 120')
    assert p.returncode == 0, p.stderr
    rows = _settle(orch, ["th.0000", "th.0001"])
    assert rows["th.0000"]["state"] == rows["th.0001"]["state"] == "retryable_failed", rows
    for i in (0, 1):
        (orch.runs / f"th.000{i}" / "fail").unlink()
    go = tmp_path / "go"
    paused = {**orch.env, "ORCH_PAUSE_AT": "sweep_room_counted", "ORCH_PAUSE_UNTIL": str(go), "ORCH_PAUSE_S": "120"}
    cli = [sys.executable, "-m", "orchestrator.cli", "requeue"]
    first = subprocess.Popen([*cli, "th.0000"], env=paused, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    second = None
    try:
        wait_for(lambda: Path(f"{go}.reached").exists() or first.poll() is not None,
                 what="the first requeue counting its slot")
        assert first.poll() is None, first.communicate()
        second = subprocess.Popen([*cli, "th.0001"], env=orch.env, text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        # The second requeue reaches the launch lock and waits there (before the fix it launched at once).
        wait_for(lambda: second.poll() is not None or _waiting_on_lock(second.pid, orch.home / "sweep-launch.lock"),
                 what="the second requeue waiting for the launch lock or done")
        assert second.poll() is None, second.communicate()
        go.touch()
        assert first.wait(60) == 0, first.communicate()
        assert second.wait(60) == 0, second.communicate()
        out2 = second.communicate()[0]
        assert "gave up" not in out2, out2  # it got the lock once the first had launched, and found no room
        assert _tasks_alive("th") == {"0"}, "the throttle let a second task run"
        assert orch.state("th.0001") == "pending"  # queued: the reconciler starts it when th.0000 ends
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
        orch("cancel", "th")


def test_a_sweep_resubmitted_after_its_db_was_lost_is_refused_while_a_task_still_runs(orch, tmp_path):
    # The one process-table scan for all tasks must still find the one task that runs.
    gate = tmp_path / "go"
    args = ("sweep", "--name", "lv", "--grid", "i=1,2,3", "--outputs", "out.txt", "--", "sh", "-c",
            f'[ {{i}} = 2 ] && while [ ! -e {gate} ]; do sleep 0.1; done; echo ok > out.txt')
    try:
        assert orch(*args).returncode == 0
        wait_for(lambda: _tasks_alive("lv") == {"1"}, what="tasks 0 and 2 done, task 1 alone running")
        for f in orch.home.glob("orch.db*"):  # the DB is lost; the runs root and the live task are not
            f.unlink()
        p = orch(*args)
        assert p.returncode == 3, (p.stdout, p.stderr)
        assert p.stderr.startswith(f"orch: refused: a live attempt runs in {orch.runs / 'lv.0001'} (pid "), p.stderr
        assert p.stderr.count("\n") == 1 and _tasks_alive("lv") == {"1"}
        assert orch.json("status") == []  # nothing recorded
    finally:
        gate.touch()


# Each task reports step 7 in its heartbeat; task 1's first attempt is then killed (SIGKILL: class killed,
# requeued by reconcile after the back-off).
STEP_TASK = ("import os, signal, pathlib; from orchestrator import protocol; "
             "protocol.write_progress(os.environ['ORCH_RUN_DIR'], int(os.environ['ORCH_ATTEMPT']), step=7); "
             "os.environ['ORCH_TASK_INDEX'] == '1' and os.environ['ORCH_ATTEMPT'] == '1' and "
             "os.kill(os.getpid(), signal.SIGKILL); pathlib.Path('out.txt').write_text('{i}')")


def test_the_status_table_shows_a_sweeps_attempts_and_each_finished_jobs_last_step(orch):
    # The sweep row's ATT was the sum of its tasks' attempts (the task count when none failed),
    # and STEP was "-" for every finished job.
    orch.write_config("[policy]\ncrash_backoff_s = 0.2\n")
    orch("sweep", "--name", "st", "--grid", "i=0,1,2", "--outputs", "out.txt", "--", sys.executable, "-c", STEP_TASK,
         check=True)
    names = [f"st.000{i}" for i in range(3)]

    def verified() -> bool:
        if all(orch.state(n) == "done_marker_verified" for n in names):
            return True
        orch("reconcile", check=True)
        return False

    wait_for(verified, 90, "every task verified", interval=0.3, detail=lambda: orch.json("status"))
    table = orch("status", check=True).stdout.splitlines()
    assert table[1].startswith("st ") and "sweep of 3: 3 done_marker_verified" in table[1], table
    cells = [c.strip() for c in table[1].split("  ") if c.strip()]
    assert cells[2] == "2", cells  # NAME STATE ATT: task 1 needed two attempts; the sum (4) was shown before
    tasks = {line.split()[0]: line.split() for line in orch("status", "--tasks", check=True).stdout.splitlines()[1:]}
    assert all(tasks[n][5] == "7" for n in names), tasks  # NAME STATE ATT BACKEND JOBID STEP
    rows = {r["name"]: r for r in orch.json("status")}
    assert [rows[n]["step"] for n in names] == [7, 7, 7] and rows["st.0001"]["attempts"] == 2
