"""Requeue's guards found by a hostile tester: no next attempt beside a process that escaped its
attempt's session; a result corrupted after verification is requeued when named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from localkit import DONE, RETRYABLE, trash_files
from orchkit import wait_for

from orchestrator import protocol
from orchestrator.backends.local import live_by_run_dir

# Leaves a process behind that the wrapper cannot tidy at the program's end: out of its session (setsid) and
# without the attempt's token (env -i; a process that keeps the token is stopped with the
# attempt). Only its cwd, the run dir, still ties it to the job.
ESCAPES = "env -i setsid sleep 60 & sleep 0.5; exit 1"


def _pids(run_dir) -> list[int]:
    return [int(e.split()[1]) for e in live_by_run_dir([run_dir]).get(os.path.realpath(run_dir), [])]


def _wait_pids(run_dir, want_any: bool, timeout: float = 20) -> list[int]:
    seen: list[int] = []

    def settled() -> bool:
        seen[:] = _pids(run_dir)
        return bool(seen) == want_any

    wait_for(settled, timeout, f"{'a' if want_any else 'no'} process in {run_dir}", detail=lambda: seen)
    return seen


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_no_next_attempt_while_an_escaped_process_runs_in_the_run_dir(orch):
    orch.home.mkdir(parents=True, exist_ok=True)  # exit 1 ("crash") requeued by the reconciler itself
    (orch.home / "orch.toml").write_text('[policy]\nauto_requeue = ["crash"]\ncrash_backoff_s = 0\n')
    orch("submit", "--name", "d1", "--", "/bin/sh", "-c", ESCAPES, check=True)
    run = orch.runs / "d1"
    try:
        assert orch.wait("d1", RETRYABLE, timeout=60) == "retryable_failed"
        pids = _wait_pids(run, True)  # the attempt ended; its escaped 'sleep' did not
        p = orch("requeue", "d1")
        assert p.returncode == 3, p.stdout + p.stderr
        err = p.stderr.strip()
        assert "\n" not in err and err.startswith("orch: refused: d1: live process(es) still run in"), err
        assert all(f"pid {pid} (its cwd or an open file is in the run dir)" in err for pid in pids), err
        d = orch.show("d1")
        assert len(d["attempts"]) == 1 and d["state"] == "retryable_failed"
        assert d["held"].startswith("next attempt held: live process(es)") and f"pid {pids[0]}" in d["held"]
        # The reconciler's own requeue holds it too.
        assert d["auto_requeue"] is True
        assert orch("reconcile").returncode == 0
        assert orch.state("d1") == "retryable_failed" and len(orch.show("d1")["attempts"]) == 1
        assert orch("reconcile").returncode == 0  # a second pass does not repeat the note
        assert orch.show("d1")["held"] == d["held"]
    finally:
        _kill(_pids(run))
    _wait_pids(run, False)
    assert orch("reconcile").returncode == 0  # processes gone: a later pass launches attempt 2
    d = orch.show("d1")
    assert len(d["attempts"]) == 2 and d["held"] is None, d
    _kill(_wait_pids(run, True))  # attempt 2 escapes again; leave nothing behind


# Each run writes its attempt number into its result, so the rerun's result differs from the first.
RESULT = 'mkdir -p result; echo "attempt $ORCH_ATTEMPT" > result/out.txt'


def test_a_named_requeue_reruns_a_done_job_whose_result_was_corrupted_after_verification(orch):
    orch("submit", "--name", "c", "--outputs", "result/*", "--", "bash", "-c", RESULT, check=True)
    orch("submit", "--name", "m", "--outputs", "result/*", "--", "bash", "-c", RESULT, check=True)
    for name in ("c", "m"):
        assert orch.wait(name, DONE, timeout=60) == "done_marker_verified"
    (orch.runs / "c" / "result" / "out.txt").write_text("attempt X\n")  # same size, other bytes
    (orch.runs / "m" / protocol.DONE_MARKER).unlink()
    p = orch("verify", "c")
    assert p.returncode == 4 and p.stdout.startswith("CORRUPT"), p.stdout

    # Never implicitly: --failed and the reconciler leave done jobs alone.
    p = orch("requeue", "--failed")
    assert (p.returncode, p.stdout) == (0, "no retryable_failed jobs\n"), p.stdout + p.stderr
    assert orch("reconcile").returncode == 0
    assert orch.state("c") == orch.state("m") == "done_marker_verified"

    p = orch("requeue", "c", "m")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("c: requeued as attempt 2 (resume); clears done.json, result\n"), p.stdout
    assert "m: requeued as attempt 2 (resume); clears result\n" in p.stdout, p.stdout
    assert trash_files(orch.home, "c") == {"done.json": trash_files(orch.home, "c")["done.json"],
                                           "result/out.txt": b"attempt X\n"}
    for name, cls in (("c", "marker_corrupt"), ("m", "marker_missing")):
        assert orch.wait(name, DONE, timeout=60) == "done_marker_verified"
        shown = orch.json("show", name, "--events")
        first, second = shown["attempts"]
        # The attempt that verified did succeed: the class of the later damage is the job's event, not its.
        assert (first["state"], first["failure_class"], second["state"]) == ("succeeded", None, "succeeded")
        unverified = [e for e in shown["events"] if (e["attempt"], e["from"]) == (None, "done_marker_verified")]
        assert unverified[0]["reason"].startswith(f"{cls}: its marker no longer verifies"), shown["events"]
        assert (orch.runs / name / "result" / "out.txt").read_text() == "attempt 2\n"
        assert orch("verify", name).returncode == 0
    # Verified again: a named requeue refuses it exactly as before.
    p = orch("requeue", "c")
    assert (p.returncode, p.stderr) == (3, "orch: refused: c: verified: done_marker_verified jobs are never rerun\n")


def test_a_launch_refusal_is_reported_once_without_a_doubled_prefix(orch, tmp_path):
    orch("submit", "--name", "d", "--", "/bin/sh", "-c", "exit 1", check=True)
    assert orch.wait("d", RETRYABLE, timeout=60) == "retryable_failed"
    (tmp_path / "elsewhere").mkdir()
    (orch.runs / "d" / "attempts" / "2").symlink_to(tmp_path / "elsewhere")  # the next attempt's dir
    p = orch("requeue", "d")
    assert (p.returncode, p.stderr) == (3, "orch: refused: d: 'attempts/2' goes through a symlink (2)\n")
    assert p.stdout == "d: refused as attempt 2 ('attempts/2' goes through a symlink (2))\n"
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_requeue_failed_takes_a_job_found_verified_as_done_and_exits_0_a_named_one_exits_3(orch):
    """`requeue --failed` exits 3 when a job needs a person; a job whose marker verifies needs no one (it is
    now done), so it does not make --failed fail. Named, the same job is a refusal (exit 3), as the README says."""
    orch("submit", "--name", "v", "--", "/bin/sh", "-c", "exit 1", check=True)
    assert orch.wait("v", RETRYABLE, timeout=60) == "retryable_failed"
    (orch.runs / "v" / "out.txt").write_text("result\n")
    protocol.write_done_marker(orch.runs / "v", "v", 1, ["out.txt"])
    p = orch("requeue", "--failed")
    assert (p.returncode, p.stdout) == (0, "v: refused (verified: its done marker verifies; never cleared or rerun)\n")
    assert orch.state("v") in DONE
    p = orch("requeue", "v")
    assert (p.returncode, p.stderr) == (3, "orch: refused: v: verified: done_marker_verified jobs are never rerun\n")


def test_a_job_wrapper_in_the_run_dir_is_named_with_its_attempt_from_its_argv(tmp_path):
    """Hostile pass: with the DB deleted, a requeue refusal named a live job wrapper "pid N (attempt ?)":
    a wrapper's own environment has no ORCH_ATTEMPT, its argv has --attempt."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    w = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "orchestrator.jobside.wrapper",
                          "--run-dir", str(run_dir), "--job", "j", "--attempt", "3", "--", "true"], env=env)
    try:
        seen = wait_for(lambda: live_by_run_dir([run_dir]).get(os.path.realpath(run_dir)), 30, "the wrapper seen")
        assert seen == [f"pid {w.pid} (attempt 3)"], seen
    finally:
        w.kill()
        w.wait()
