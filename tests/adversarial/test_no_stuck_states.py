"""No stuck states: every state a job can enter has a way out the reconciler takes by
itself. A refusal or a launch error after the job row exists rolls the row back or fails the
attempt with the reason; `requeue` exits non-zero when a job errored; an attempt found verified is
closed. After settling, no job is `pending`/`submitted`/`running` without a live process."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from advkit import (
    SETTLED_STATES,
    assert_no_stuck,
    assert_user_error,
    db_job_names,
    fill_fs,
    job_argv,
    make_home,
    need_root,
    outside_sentinel,
    reconcile_ok,
    settle,
    show,
    tmpfs,
    wait_no_procs,
)
from orchkit import wait_for

from orchestrator import protocol

QUICK = ("--outputs", "result/out.txt", "--", *job_argv("--result", "--no-gate"))
FAST = {"ORCH_LAUNCH_GRACE_S": "0"}  # the reconciler may relaunch a pending attempt at once


def _runs_empty(orch) -> bool:
    return not orch.runs.exists() or not any(orch.runs.iterdir())


def _not_left_pending(orch, name: str, reason: str | None = None) -> dict | None:
    """Either no row at all, or a settled job whose `orch show` says why (no open attempt)."""
    if name not in db_job_names(orch.home):
        return None
    d = show(orch, name)
    assert d["state"] in SETTLED_STATES, f"{name} left {d['state']}: {d['attempts']}"
    open_ = [(a["n"], a["state"]) for a in d["attempts"] if a["state"] in ("pending", "submitted", "running")]
    assert not open_, f"{name} is {d['state']} with open attempts {open_}"
    if reason:
        assert re.search(reason, json.dumps(d), re.I), f"`orch show {name}` does not say why ({reason}): {d}"
    return d


@pytest.mark.parametrize("glob", [".", "./"])
def test_outputs_naming_the_run_dir_itself_is_a_usage_error_before_any_row(orch, glob):
    """A refusal after the DB row exists (`--outputs .` ...) left the job pending forever."""
    p = orch("submit", "--name", "dot", "--outputs", glob, "--", "true")
    assert_user_error(p, (2,), r"outputs")
    assert db_job_names(orch.home) == []
    assert _runs_empty(orch), sorted(p.name for p in orch.runs.iterdir())


def test_a_symlinked_attempts_dir_is_refused_and_leaves_no_pending_job(orch, tmp_path):
    """A refusal after the DB row exists (here: a symlinked attempts/) left the job pending forever."""
    elsewhere = outside_sentinel(tmp_path, "elsewhere")
    make_home(orch)
    run = orch.runs / "j"
    run.mkdir(parents=True, mode=0o700)
    (run / "attempts").symlink_to(elsewhere.path)
    p = orch("submit", "--name", "j", *QUICK)
    assert_user_error(p, (3,), r"symlink")
    _not_left_pending(orch, "j", r"symlink")
    settle(orch)
    assert_no_stuck(orch)
    elsewhere.assert_untouched()


def test_an_unusable_runs_root_is_refused_before_any_row(orch, tmp_path):
    """A refusal after the DB row exists (here: an unusable runs root) left the job pending forever."""
    blocker = tmp_path / "a-regular-file"
    blocker.write_text("not a directory\n")
    orch.write_config(f'[runs]\nroot = "{blocker}/runs"\n')
    p = orch("submit", "--name", "r", *QUICK)
    assert_user_error(p, (2, 3), r"runs|root|director")
    assert db_job_names(orch.home) == []
    assert blocker.read_text() == "not a directory\n"


def test_stray_files_in_orchs_own_attempt_slots_are_trashed_and_the_job_runs(orch):
    """Regular files where orch wants attempts/<n>/ are leftovers in orch's own namespace: moved to
    the trash (never deleted), and the launch goes on."""
    make_home(orch)
    run = orch.runs / "j"
    (run / "attempts").mkdir(parents=True)
    for n in (1, 2, 3):
        (run / "attempts" / str(n)).write_text("a regular file where orch wants a directory\n")
    p = orch("submit", "--name", "j", *QUICK)
    assert p.returncode == 0, (p.stdout, p.stderr)
    rows = settle(orch, ["j"])
    assert rows["j"]["state"] == "done_marker_verified", show(orch, "j")
    trashed = list((orch.home / "trash" / "j").glob("*/attempts/1"))
    assert len(trashed) == 1 and trashed[0].read_text().startswith("a regular file"), trashed
    assert_no_stuck(orch)


def test_a_launch_error_that_is_not_orchs_own_fails_the_attempt_instead_of_sticking(orch, tmp_path):
    """A launch error that is not orch's own (FileExistsError, ENOSPC) left the job pending, made requeue
    print "error" yet exit 0, and made reconcile exit 1 and skip other jobs. Here
    the run dir is on a read-only mount (EROFS when orch creates attempts/1/)."""
    need_root()
    make_home(orch)
    run = orch.runs / "j"
    run.mkdir(parents=True)
    ro = subprocess.run(f"mount --bind {run} {run} && mount -o remount,bind,ro {run}", shell=True,
                        capture_output=True, text=True)
    if ro.returncode:
        pytest.fail(f"running as root but a read-only bind mount failed: {ro.stderr.strip()}")
    try:
        p = orch("submit", "--name", "j", *QUICK)
        line = assert_user_error(p, (1,), r"read-only|launch failed")
        assert "j" in line
        assert show(orch, "j")["state"] == "retryable_failed"  # never left pending

        ok = orch("submit", "--name", "ok", "--outputs", "o.txt", "--", "sh", "-c", "echo x > o.txt")
        assert ok.returncode == 0, ok.stderr
        reconcile_ok(orch, env=FAST)
        rows = settle(orch, env=FAST)
        assert rows["ok"]["state"] == "done_marker_verified", rows["ok"]
        assert rows["j"]["state"] == "retryable_failed", rows["j"]
        r = orch("requeue", "j", env=FAST)  # the cause persists: an error, and a non-zero exit
        assert_user_error(r, (1,), r"read-only")
        settle(orch, env=FAST)
        _not_left_pending(orch, "j")
    finally:
        subprocess.run(["umount", str(run)], check=False)
    r = orch("requeue", "j", env=FAST)  # the cause is gone: the job finishes
    assert r.returncode == 0, (r.stdout, r.stderr)
    rows = settle(orch, ["j"], env=FAST)
    assert rows["j"]["state"] == "done_marker_verified", show(orch, "j")["attempts"]
    assert_no_stuck(orch, env=FAST)


def test_enospc_at_launch_fails_cleanly_and_requeue_finishes_after_space_is_freed(orch, tmp_path):
    """A launch error that is not orch's own (here: ENOSPC) left the job pending."""
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        (mnt / "runs").mkdir()
        orch.write_config(f'[runs]\nroot = "{mnt / "runs"}"\n')
        fill_fs(mnt / "filler")
        p = orch("submit", "--name", "full", *QUICK)
        assert_user_error(p, (1, 3), r"space|ENOSPC|full")
        had_row = _not_left_pending(orch, "full") is not None
        if had_row:  # hostile test: 3 passes on the full disk used up every attempt, `failed` for good
            for _ in range(3):
                reconcile_ok(orch)
            assert show(orch, "full")["state"] == "retryable_failed", show(orch, "full")

        (mnt / "filler").unlink()
        if had_row:
            r = orch("requeue", "full")
        else:
            r = orch("submit", "--name", "full", *QUICK)
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        rows = settle(orch, ["full"])
        assert rows["full"]["state"] == "done_marker_verified", show(orch, "full")["attempts"]
        assert_no_stuck(orch)


def test_a_program_that_fills_the_disk_is_classed_enospc_and_auto_resumed_once_space_is_back(orch, tmp_path):
    """Hostile run: the program filled the disk, then the wrapper's exit.json failed too, and the attempt
    ended `unknown` ("process gone without an exit record"), waiting for a human. The wrapper's ballast
    makes room for its record: class enospc, resumed by the reconciler alone once space is back."""
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        (mnt / "runs").mkdir()
        orch.write_config(f'[runs]\nroot = "{mnt / "runs"}"\n')
        filler = mnt / "filler"
        prog = f'if [ "$ORCH_ATTEMPT" = 1 ]; then cat /dev/zero > {filler}; exit 1; fi; echo ok > out.txt'
        p = orch("submit", "--name", "fills", "--outputs", "out.txt", "--", "sh", "-c", prog)
        assert p.returncode == 0, p.stderr
        run = mnt / "runs" / "fills"
        adir = protocol.attempt_dir(run, 1)
        wait_for(lambda: (adir / protocol.EXIT_FILE).exists(), 60, "attempt 1's exit record")
        rec = protocol.read_exit(adir)
        assert rec is not None and rec.returncode == 1 and rec.disk_full, rec
        assert not (adir / protocol.EXIT_RESERVE).exists(), "the ballast was not given back"
        filler.unlink()  # space is back; the reconciler alone does the rest
        rows = settle(orch, ["fills"])
        attempts = show(orch, "fills")["attempts"]
        assert rows["fills"]["state"] == "done_marker_verified", attempts
        first = attempts[0]
        assert (first["failure_class"], (first["action"] or {}).get("auto")) == ("enospc", True), first
        assert "full" in first["detail"], first
        assert not (protocol.attempt_dir(run, 2) / protocol.EXIT_RESERVE).exists()
    assert_no_stuck(orch)


def test_an_exit_0_after_the_disk_filled_is_never_verified_and_reruns_once_space_is_back(orch, tmp_path):
    """Hostile test: the program's output was truncated by the full disk, it exited 0 anyway, and the
    wrapper wrote the marker in its ballast's room: a 0-byte result verified, never to be rerun."""
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        (mnt / "runs").mkdir()
        orch.write_config(f'[runs]\nroot = "{mnt / "runs"}"\n')
        filler = mnt / "filler"
        prog = (f'[ "$ORCH_ATTEMPT" = 1 ] && cat /dev/zero > {filler}; '
                "head -c 100000 /dev/urandom > out.bin; exit 0")
        assert orch("submit", "--name", "trunc", "--outputs", "out.bin", "--", "sh", "-c", prog).returncode == 0
        run = mnt / "runs" / "trunc"
        wait_for(lambda: (protocol.attempt_dir(run, 1) / protocol.EXIT_FILE).exists(), 60, "attempt 1's exit record")
        rec = protocol.read_exit(protocol.attempt_dir(run, 1))
        assert rec is not None and rec.returncode == 0 and rec.disk_full and rec.marker_error, rec
        assert not protocol.verify_done_marker(run).verified
        filler.unlink()
        rows = settle(orch, ["trunc"])
        first = show(orch, "trunc")["attempts"][0]
        assert rows["trunc"]["state"] == "done_marker_verified" and first["failure_class"] == "enospc", first
        assert (run / "out.bin").stat().st_size == 100000
    assert_no_stuck(orch)


def test_a_disk_too_full_for_the_wrappers_ballast_still_ends_enospc(orch, tmp_path):
    """Hostile test: with a few pages free at launch, neither the ballast nor exit.json fit, and the attempt
    ended `unknown` ("process gone without an exit record"), waiting for a human."""
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        (mnt / "runs").mkdir()
        # A launch onto a full disk backs off by crash_backoff_s: kept short here, the claim is the class.
        orch.write_config(f'[runs]\nroot = "{mnt / "runs"}"\n[policy]\ncrash_backoff_s = 1\n')
        orch("status", check=True)
        fill_fs(mnt / "filler")
        # 5 pages back: command.json and fence.json (orch, at launch), exit.json, out.txt, done.json
        os.truncate(mnt / "filler", os.path.getsize(mnt / "filler") - 20480)
        orch("submit", "--name", "tight", "--outputs", "out.txt", "--", "sh", "-c", "echo ok > out.txt")
        run = mnt / "runs" / "tight"
        wait_no_procs(run, 30, "attempt 1 to end")
        (mnt / "filler").unlink()
        rows = settle(orch, ["tight"])
        attempts = show(orch, "tight")["attempts"]
        assert rows["tight"]["state"] == "done_marker_verified", attempts
        assert attempts[0]["failure_class"] == "enospc", attempts[0]
        assert not list(run.glob(f"attempts/*/{protocol.EXIT_RESERVE}"))
    assert_no_stuck(orch)


@pytest.mark.parametrize("when", ["after_failure", "while_running"])
def test_requeue_of_a_verified_job_is_refused_and_leaves_no_open_attempt(orch, when):
    """An attempt stayed `submitted` after requeue found the job verified."""
    run = orch.runs / "v"
    if when == "after_failure":
        p = orch("submit", "--name", "v", "--", *job_argv("--no-gate", "--exit-code", "1"))
        assert p.returncode == 0, p.stderr
        rows = settle(orch, ["v"])
        assert rows["v"]["state"] == "retryable_failed", rows["v"]
    else:
        p = orch("submit", "--name", "v", "--outputs", "result/out.txt", "--", *job_argv("--result"))
        assert p.returncode == 0, p.stderr
        wait_for((run / "started").exists, 30, "the job to start")
        reconcile_ok(orch)
    # The result, verified, by hand (the same bytes the job itself writes at the end).
    (run / "result").mkdir(exist_ok=True)
    protocol.atomic_write(run / "result" / "out.txt", "ok v\n")
    protocol.write_done_marker(run, "v", 1, ["result/out.txt"])

    r = orch("requeue", "v")
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert re.search(r"verif|live|running", r.stdout + r.stderr, re.I), r.stdout + r.stderr
    (run / "go").touch()
    wait_no_procs(run, 40, "after go")
    rows = settle(orch, ["v"])
    assert rows["v"]["state"] == "done_marker_verified", rows["v"]
    assert rows["v"]["attempts"] == 1, show(orch, "v")["attempts"]
    _not_left_pending(orch, "v")
    assert_no_stuck(orch)
    assert protocol.verify_done_marker(run).verified
