"""Stay inside ORCH_HOME: a symlinked `trash/` or `trash/<job>` never makes requeue write
outside ORCH_HOME, and a pre-existing 0755 ORCH_HOME never leaves run dirs or logs readable by
other users."""

from __future__ import annotations

import os
import re
import stat

import pytest
from advkit import (
    assert_no_stuck,
    assert_user_error,
    db_job_names,
    job_argv,
    outside_sentinel,
    settle,
    show,
)
from orchkit import wait_for

from orchestrator import protocol


def _files_below(root, name: str) -> list[str]:
    """Paths named ``name`` below root, walking real directories only (never through a symlink)."""
    out = []
    for d, _dirs, files in os.walk(root, followlinks=False):
        out += [os.path.join(d, f) for f in files if f == name]
    return out


@pytest.mark.parametrize("link", ["trash", "trash-job"])
def test_a_symlinked_trash_never_makes_requeue_write_outside_orch_home(orch, tmp_path, link):
    """A symlinked trash/ or trash/<job> made requeue write outside ORCH_HOME."""
    outside = outside_sentinel(tmp_path)
    # Attempt 1 leaves a partial result/ (what requeue moves to trash) and fails.
    p = orch("submit", "--name", "tj", "--", *job_argv("--no-gate", "--result", "--exit-code", "1"))
    assert p.returncode == 0, p.stderr
    rows = settle(orch, ["tj"])
    assert rows["tj"]["state"] == "retryable_failed", rows["tj"]
    run = orch.runs / "tj"
    assert (run / "result" / "out.txt").exists()

    trash = orch.home / "trash"
    if link == "trash":
        assert not trash.exists() or not any(trash.iterdir())
        if trash.exists():
            trash.rmdir()
        trash.symlink_to(outside.path)
    else:
        trash.mkdir(mode=0o700, exist_ok=True)
        (trash / "tj").symlink_to(outside.path)

    r = orch("requeue", "tj")
    outside.assert_untouched()
    if r.returncode == 3:
        err = assert_user_error(r, (3,))
        assert re.search(r"trash", err, re.I) and re.search(r"symlink", err, re.I), err
        assert (run / "result" / "out.txt").exists(), "refused, yet the leftovers were moved somewhere"
    else:
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        assert not (run / "result").exists()
        inside = [f for f in _files_below(orch.home, "out.txt") if "trash" in f and str(run) not in f]
        assert inside, "requeue moved result/ away but not into a real directory inside ORCH_HOME"
    settle(orch, ["tj"])
    outside.assert_untouched()
    assert_no_stuck(orch)


def _mode(p) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_a_0755_orch_home_is_tightened_and_run_dirs_and_logs_are_private(orch):
    """A pre-existing 0755 ORCH_HOME left run dirs and logs readable by other users."""
    orch.home.mkdir(parents=True)
    os.chmod(orch.home, 0o755)
    p = orch("submit", "--name", "perm", "--outputs", "result/out.txt", "--", *job_argv("--result"))
    if p.returncode == 3:  # the other documented answer: refuse, naming the mode
        assert_user_error(p, (3,), r"0?755|mode|permission")
        assert db_job_names(orch.home) == []
        return
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    run = orch.runs / "perm"
    adir = protocol.attempt_dir(run, 1)
    wait_for((run / "started").exists, 30, "the job to start")
    assert _mode(orch.home) == 0o700, oct(_mode(orch.home))
    assert _mode(run) == 0o700, oct(_mode(run))
    for f in (adir / "stdout.log", adir / "stderr.log"):
        assert _mode(f) & 0o077 == 0, f"{f.name} is {oct(_mode(f))}"
    (run / "go").touch()
    rows = settle(orch, ["perm"])
    assert rows["perm"]["state"] == "done_marker_verified", show(orch, "perm")["attempts"]
    assert _mode(orch.home / "orch.db") & 0o077 == 0, oct(_mode(orch.home / "orch.db"))
    assert_no_stuck(orch)
