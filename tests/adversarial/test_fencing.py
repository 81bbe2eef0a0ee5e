"""Fencing: a launch that outlives the launch grace (a stopped launcher, a slow preparation)
never runs a second copy of the job; a wrapper started under a stale fence runs nothing.

The invariant is counted in process TREES: every session holding a process of the program (found by
its kernel-held ORCH_RUN_DIR). Two copies of one attempt share attempt number and token, so counting
distinct attempts or tokens would not see them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from advkit import (
    job_argv,
    live_job_procs,
    orch_popen,
    reconcile_ok,
    settle,
    show,
    wait_no_procs,
)
from orchkit import wait_for

GRACE = {"ORCH_LAUNCH_GRACE_S": "1"}
GATED = ("--outputs", "result/out.txt", "--", *job_argv("--result"))
ROOT = Path(__file__).resolve().parents[2]


def _session(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2:].split()[3])


def program_trees(run: Path) -> set[int]:
    """Sessions in which the job's program (not a wrapper) lives: one per live copy."""
    return {s for p in live_job_procs(run) if not p.wrapper and (s := _session(p.pid)) is not None}


class TreeSampler:
    """Every ~50 ms, the live program trees of one run dir."""

    def __init__(self, run: Path) -> None:
        self.run, self.samples = run, []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), program_trees(self.run)))
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=10)

    def assert_at_most_one(self) -> None:
        assert self.samples
        for t, trees in self.samples:
            assert len(trees) <= 1, f"two live copies of the job at t={t:.2f}: sessions {sorted(trees)}"


def _ran_count(run: Path) -> int:
    p = run / "ran.log"
    return p.read_text().count("attempt=") if p.exists() else 0


def _attempt(orch, name: str) -> dict:
    return show(orch, name)["attempts"][-1]


def _finish_and_check(orch, run: Path, sampler: TreeSampler) -> None:
    (run / "go").touch()
    wait_no_procs(run, 60, "after go")
    d = settle(orch, ["x"], env=GRACE)
    sampler.stop()
    sampler.assert_at_most_one()
    assert _ran_count(run) == 1, (run / "ran.log").read_text()
    assert d["x"]["state"] == "done_marker_verified", d["x"]
    assert (run / "result" / "out.txt").read_text() == "ok x\n"


@pytest.mark.parametrize("site", ["before_backend_submit", "fence_checked"])
def test_a_stopped_launcher_that_outlives_the_grace_never_runs_a_second_copy(orch, spawned, tmp_path, site):
    """A Ctrl-Z'd `orch submit` (SIGSTOP) between its claim and its backend call, past the grace: the
    reconciler re-claims and launches; after SIGCONT the old launcher's re-check (before_backend_submit)
    or its wrapper's fence check (fence_checked: it passed its re-check, then stopped) stops the copy."""
    run, gate = orch.runs / "x", tmp_path / "gate"
    sub = orch_popen(orch, "submit", "--name", "x", *GATED,
                     env={**GRACE, "ORCH_PAUSE_AT": site, "ORCH_PAUSE_UNTIL": str(gate), "ORCH_PAUSE_S": "300"})
    spawned.append(sub)
    sampler = TreeSampler(run)
    try:
        wait_for(Path(str(gate) + ".reached").exists, 60, f"the launcher to reach {site}")
        os.kill(sub.pid, signal.SIGSTOP)

        def relaunched() -> bool:
            reconcile_ok(orch, env=GRACE)
            return _attempt(orch, "x")["state"] in ("submitted", "running")

        wait_for(relaunched, 60, "the reconciler to re-claim the stopped launch", interval=0.2)
        wait_for((run / "started").exists, 60, "the re-claimer's copy to start")
        gate.touch()
        os.kill(sub.pid, signal.SIGCONT)
        out, err = sub.communicate(timeout=60)
        _finish_and_check(orch, run, sampler)
        assert "Traceback" not in err, err
        if site == "before_backend_submit":  # its re-check in the DB: no backend call at all
            assert "lost its claim before its backend call" in err and "submitted nothing" in err, err
            # ... and stdout does not say it submitted (it printed both)
            assert out.startswith("x: launched by the process that re-claimed it (local "), out
        else:  # it passed its re-check, then stopped: it submitted, and its wrapper's fence is stale
            assert "lost its launch claim (generation 1, now 2) during the backend call" in err, err
    finally:
        sampler.stop()
        if sub.poll() is None:
            os.kill(sub.pid, signal.SIGCONT)


def test_a_slow_but_healthy_launcher_keeps_its_claim(orch, spawned, tmp_path):
    """Preparing takes longer than the grace (hashing a big checkpoint): the launcher renews its claim,
    so reconcile passes meanwhile launch nothing, and the one launch runs once."""
    run, gate = orch.runs / "x", tmp_path / "gate"
    sub = orch_popen(orch, "submit", "--name", "x", *GATED,
                     env={**GRACE, "ORCH_PAUSE_AT": "after_attempt_row", "ORCH_PAUSE_UNTIL": str(gate),
                          "ORCH_PAUSE_S": "300"})
    spawned.append(sub)
    sampler = TreeSampler(run)
    try:
        wait_for(Path(str(gate) + ".reached").exists, 60, "the launcher to be preparing")
        t0 = time.monotonic()
        wait_for(lambda: time.monotonic() - t0 > 3 * float(GRACE["ORCH_LAUNCH_GRACE_S"]), 30,
                 "three launch graces to pass while the launcher prepares")
        for _ in range(2):
            reconcile_ok(orch, env=GRACE)
        assert _attempt(orch, "x")["state"] == "launching", _attempt(orch, "x")
        assert not live_job_procs(run), "a reconcile pass launched the attempt its healthy launcher holds"
        gate.touch()
        _out, err = sub.communicate(timeout=60)
        assert sub.returncode == 0, (sub.returncode, err)
        wait_for((run / "started").exists, 60, "the job to start")
        _finish_and_check(orch, run, sampler)
    finally:
        sampler.stop()


def test_a_submission_made_after_the_reclaimers_first_lookup_is_adopted_not_doubled(orch, spawned, tmp_path):
    """The race fencing alone leaves open: the re-claimer's look-up found nothing, then the old launcher
    submitted (and died) and its wrapper read the OLD fence before the new one was written, so its program
    runs. The re-claimer looks the token up again after writing its fence and adopts that submission."""
    run, gate1, gate2 = orch.runs / "x", tmp_path / "gate1", tmp_path / "gate2"
    sub = orch_popen(orch, "submit", "--name", "x", *GATED,
                     env={**GRACE, "ORCH_PAUSE_AT": "fence_checked", "ORCH_PAUSE_UNTIL": str(gate1),
                          "ORCH_PAUSE_S": "300", "ORCH_FAULT": "after_backend_submit"})
    spawned.append(sub)
    sampler = TreeSampler(run)
    try:
        wait_for(Path(str(gate1) + ".reached").exists, 60, "the launcher to pass its fence check")
        os.kill(sub.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        wait_for(lambda: time.monotonic() - t0 > 2 * float(GRACE["ORCH_LAUNCH_GRACE_S"]), 30,
                 "the stopped launcher's claim to expire")
        rec = orch_popen(orch, "reconcile", env={**GRACE, "ORCH_PAUSE_AT": "tokens_looked_up",
                                                 "ORCH_PAUSE_UNTIL": str(gate2), "ORCH_PAUSE_S": "300"})
        spawned.append(rec)
        wait_for(Path(str(gate2) + ".reached").exists, 60, "the reconciler's first look-up (nothing found)")
        gate1.touch()
        os.kill(sub.pid, signal.SIGCONT)
        assert sub.wait(timeout=60) == 99  # it submitted, then died before recording the id
        wait_for((run / "started").exists, 60, "the old launcher's copy to run (it read the old fence)")
        gate2.touch()
        out, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, (out, err)
        fence = json.loads((run / "attempts" / "1" / "fence.json").read_text())["fence"]
        _finish_and_check(orch, run, sampler)
        assert "found by token after its re-claim" in out, out
        assert fence == 1, "the fence file was not restored to the adopted launch's generation"
    finally:
        sampler.stop()
        if sub.poll() is None:
            os.kill(sub.pid, signal.SIGCONT)


def _fence_file(adir: Path, token: str, fence: int) -> None:
    adir.mkdir(parents=True, exist_ok=True)
    (adir / "fence.json").write_text(json.dumps({"token": token, "fence": fence, "at": "now"}))


def _wrapper(run: Path, token: str, fence: int) -> subprocess.CompletedProcess:
    prog = f"echo ran >> {run}/ran.txt"
    return subprocess.run([sys.executable, "-m", "orchestrator.jobside.wrapper", "--run-dir", str(run), "--job", "w",
                           "--attempt", "1", "--token", token, "--fence", str(fence), "--", "sh", "-c", prog],
                          cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=60)


def test_a_wrapper_started_with_a_stale_fence_runs_nothing_and_keeps_the_current_exit_record(tmp_path):
    run = tmp_path / "run"
    adir = run / "attempts" / "1"
    _fence_file(adir, "tok", 2)
    current_exit = b'{"token": "tok", "returncode": 0, "signal": null, "time": 1}'
    (adir / "exit.json").write_bytes(current_exit)

    p = _wrapper(run, "tok", 1)
    assert p.returncode == 0, (p.returncode, p.stderr)
    assert "superseded" in p.stderr and "not run" in p.stderr, p.stderr
    assert not (run / "ran.txt").exists(), "a wrapper with a stale fence ran the program"
    assert (adir / "exit.json").read_bytes() == current_exit, "the current launch's exit record was touched"
    rec = json.loads((adir / "superseded.json").read_text())
    assert rec["fence"] == 1 and rec["token"] == "tok", rec

    # The current generation runs, and runs again when Slurm requeues it in place (same argv).
    for n in (1, 2):
        p = _wrapper(run, "tok", 2)
        assert p.returncode == 0, (p.returncode, p.stderr)
        assert (run / "ran.txt").read_text().count("ran") == n


@pytest.mark.parametrize("path", ["quick", "sqlalchemy"])
def test_a_cancel_right_after_the_launchers_last_check_never_lets_the_program_run(orch, tmp_path, path):
    """Hostile test of the quick submit: `orch cancel` between the launcher's last fence check and its
    backend call was honoured only by the launcher's record, after the call; the wrapper started meanwhile, and a
    short program ran and ended VERIFIED although the job had been cancelled (every run on the quick path, whose
    record waited for SQLAlchemy's import). The cancel now revokes the attempt's fence file in its transaction, so
    the wrapper that launch starts runs nothing whatever the timing, and the launcher stops what it submitted at
    once (test_stop, test_quicksubmit: each mechanism alone)."""
    gate = tmp_path / "gate"
    ran = tmp_path / "ran"
    assert orch("status").returncode == 0  # the DB exists: the quick path, as for every command after the first
    json_flag = ["--json"] if path == "sqlalchemy" else []  # --json renders the job: the SQLAlchemy path whole
    p = orch_popen(orch, "submit", "--name", "c", *json_flag, "--outputs", "out/*", "--", "/bin/sh", "-c",
                   f"mkdir -p out && echo x > out/a && touch {ran}",
                   env={"ORCH_PAUSE_AT": "fence_checked", "ORCH_PAUSE_UNTIL": str(gate), "ORCH_PAUSE_S": "60"})
    wait_for(lambda: Path(f"{gate}.reached").exists(), 60, "the launch to pass its last fence check")
    c = orch("cancel", "c")
    assert c.returncode == 0 and "cancelled" in c.stdout, c.stderr
    gate.touch()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    # No reconcile pass before the launch's wrapper (the session leader its local id names) has ended by itself: a
    # pass's stop of the cancelled attempt would end it too, whatever the wrapper would have done.
    ext = json.loads(out)["attempts"][-1]["external_id"] if json_flag else out.split("(local ", 1)[1].split(")")[0]
    leader = int(ext.split("@", 1)[0])
    wait_for(lambda: _session(leader) != leader, 60, "the cancelled launch's wrapper to end")
    final = settle(orch, ["c"])
    assert final["c"]["state"] == "cancelled", final
    assert not ran.exists() and not (orch.runs / "c" / "out").exists()  # the program never started
    v = orch("verify", "c")
    assert v.returncode == 4, v.stdout
