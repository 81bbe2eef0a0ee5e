"""Requeue's guards found by a hostile tester: no next attempt beside a process that escaped its
attempt's session; a result corrupted after verification is requeued when named."""

from __future__ import annotations

import os
import signal
import time

from localkit import RETRYABLE

from orchestrator.backends.local import live_by_run_dir

ESCAPES = "setsid sleep 60 & sleep 0.5; exit 1"  # leaves a process of its own session behind


def _pids(run_dir) -> list[int]:  # noqa: ANN001
    return [int(e.split()[1]) for e in live_by_run_dir().get(str(run_dir), [])]


def _wait_pids(run_dir, want_any: bool, timeout: float = 20) -> list[int]:  # noqa: ANN001
    t0 = time.time()
    while True:
        pids = _pids(run_dir)
        if bool(pids) == want_any:
            return pids
        if time.time() - t0 > timeout:
            raise AssertionError(f"processes in {run_dir}: {pids}")
        time.sleep(0.05)


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
        assert all(f"pid {pid} (attempt 1)" in err for pid in pids), err
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
