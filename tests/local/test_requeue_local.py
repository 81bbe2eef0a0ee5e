"""Requeue clears only what is unverified; a verified run dir is never touched by anything."""

from __future__ import annotations

import json
import os
import signal

from localkit import (
    DONE,
    FLAKY,
    GATED,
    PREEMPTIBLE,
    RETRYABLE,
    db_snapshot,
    trash_files,
    tree_hash,
    wrapper_record,
    write_corrupt_marker,
)
from orchkit import make_checkpoint

from orchestrator import protocol

WRITE_RESULT = "mkdir -p result; echo ok > result/out.txt"


def _finished_job(orch, name: str):
    orch("submit", "--name", name, "--outputs", "result/*", "--", "bash", "-c", WRITE_RESULT, check=True)
    assert orch.wait(name, DONE, timeout=60) == "done_marker_verified"
    return orch.runs / name


def _failed_job(orch, name: str, cmd: str = FLAKY):
    orch("submit", "--name", name, "--outputs", "result/*", "--", "bash", "-c", cmd, check=True)
    assert orch.wait(name, RETRYABLE | DONE, timeout=60) == "retryable_failed"
    return orch.runs / name


def test_requeue_reconcile_and_gc_never_touch_a_verified_run_dir(orch):
    run = _finished_job(orch, "v")
    _failed_job(orch, "other")  # so that --failed and gc have something else to do
    before = tree_hash(run)

    p = orch("requeue", "v")
    assert p.returncode == 3
    assert "v: verified" in p.stderr and "never" in p.stderr
    p = orch("requeue", "v", "--dry-run")
    assert p.returncode == 3 and "verified" in p.stderr
    p = orch("requeue", "--failed")
    assert p.returncode == 0 and "other: requeued as attempt 2" in p.stdout and "v:" not in p.stdout
    orch.wait("other", DONE, timeout=60)
    assert orch("reconcile").returncode == 0
    p = orch("gc")
    assert p.returncode == 0 and p.stdout.startswith("removed ")

    assert tree_hash(run) == before
    assert orch.state("v") == "done_marker_verified" and len(orch.show("v")["attempts"]) == 1


def test_requeue_of_a_failed_job_whose_marker_now_verifies_marks_it_done_and_clears_nothing(orch):
    # A late writer completed the run after orch classified it: the marker decides, never the state.
    run = _failed_job(orch, "late", "mkdir -p result; echo ok > result/out.txt; exit 1")
    protocol.write_done_marker(run, "late", 1, ["result/out.txt"])
    before = tree_hash(run)
    p = orch("requeue", "--failed")
    assert p.returncode == 0
    assert p.stdout.startswith("late: refused (verified")
    assert tree_hash(run) == before
    show = orch.show("late")
    assert show["state"] == "done_marker_verified" and len(show["attempts"]) == 1
    assert not (orch.home / "trash" / "late").exists()


def test_requeue_dry_run_changes_nothing_and_says_what_it_would_clear(orch):
    run = _failed_job(orch, "dry")
    write_corrupt_marker(run, "result/model.bin")
    (run / "checkpoints" / "step-00000007.tmp-1234abcd").mkdir(parents=True)
    before_tree, before_db = tree_hash(run), db_snapshot(orch.home)

    p = orch("requeue", "--failed", "--dry-run")
    assert p.returncode == 0
    assert p.stdout.startswith("dry: would requeue as attempt 2")
    for item in ("done.json", "result", "checkpoints/step-00000007.tmp-1234abcd"):
        assert item in p.stdout
    (entry,) = orch.json("requeue", "dry", "--dry-run")
    assert entry["outcome"] == "would_requeue" and entry["attempt"] == 2
    assert {"checkpoints/step-00000007.tmp-1234abcd", "done.json", "result"} <= set(entry["clears"])
    assert not [c for c in entry["clears"] if c.split("/")[0] in ("attempts", "ran.log")]

    assert tree_hash(run) == before_tree
    assert db_snapshot(orch.home) == before_db
    assert not (orch.home / "trash").exists()


def test_requeue_keeps_verified_checkpoints_and_trashes_tmp_and_corrupt_ones(orch):
    cmd = FLAKY + '; ls checkpoints > "$ORCH_RUN_DIR/seen.txt"'
    run = _failed_job(orch, "ck", cmd)
    good = make_checkpoint(run, 10)
    good_hash = tree_hash(good)
    make_checkpoint(run, 20, final_name="step-00000020.tmp-5eed5eed")  # never renamed into place
    make_checkpoint(run, 30, manifest=False)  # committed name, no manifest
    bad = make_checkpoint(run, 40)
    os.truncate(bad / "model.pt", 3)  # manifest lists another size

    p = orch("requeue", "ck")
    assert p.returncode == 0, p.stderr
    assert orch.wait("ck", DONE, timeout=60) == "done_marker_verified"

    assert sorted(q.name for q in (run / "checkpoints").iterdir()) == ["step-00000010"]
    assert tree_hash(good) == good_hash
    assert (run / "seen.txt").read_text() == "step-00000010\n"  # what attempt 2 saw
    trashed = trash_files(orch.home, "ck")
    for name in ("step-00000020.tmp-5eed5eed", "step-00000030", "step-00000040"):
        assert f"checkpoints/{name}/model.pt" in trashed, (name, sorted(trashed))
    assert trashed["result/model.bin"] == b"partial 1\n"


def test_requeue_of_a_live_job_is_refused_with_exit_3(orch):
    orch("submit", "--name", "busy", "--", "bash", "-c", GATED, check=True)
    wrapper_record(orch.runs / "busy")
    p = orch("requeue", "busy")
    assert p.returncode == 3
    assert "busy: job is submitted" in p.stderr or "busy: job is running" in p.stderr
    (orch.runs / "busy" / "go").touch()


def _outside_tree(tmp_path):
    outside = tmp_path / "outside"
    (outside / "result").mkdir(parents=True)
    (outside / "result" / "model.bin").write_bytes(b"someone else's data")
    (outside / "done.json").write_text('{"not": "verified"}')
    (outside / "checkpoints" / "step-00000001.tmp-x").mkdir(parents=True)
    return outside


def test_submit_with_a_symlinked_run_dir_is_refused_and_nothing_outside_changes(orch, tmp_path):
    outside = _outside_tree(tmp_path)
    before = tree_hash(outside)
    orch.runs.mkdir(parents=True)
    os.symlink(outside, orch.runs / "evil")
    p = orch("submit", "--name", "evil", "--outputs", "result/*", "--", "bash", "-c", WRITE_RESULT)
    assert p.returncode == 3
    assert "symlink" in p.stderr and p.stderr.startswith("orch: ")
    assert tree_hash(outside) == before
    assert orch.json("status") == []


def test_requeue_refuses_a_run_dir_replaced_by_a_symlink_and_still_serves_the_other_jobs(orch, tmp_path):
    outside = _outside_tree(tmp_path)
    before = tree_hash(outside)
    run = _failed_job(orch, "evil")  # created first: requeue --failed meets it first
    _failed_job(orch, "fine")
    os.rename(run, tmp_path / "evil-moved")
    os.symlink(outside, run)

    p = orch("requeue", "evil")
    assert p.returncode == 3 and "symlink" in p.stderr
    p = orch("requeue", "--failed")
    assert p.returncode == 3, p.stderr  # a refusal is exit 3 with --failed too (it was 0)
    assert "evil: refused" in p.stdout and "symlink" in p.stdout
    assert p.stderr.startswith("orch: refused: evil: ") and p.stderr.count("\n") == 1, p.stderr
    assert "fine: requeued as attempt 2" in p.stdout
    assert orch("reconcile").returncode == 0
    assert orch.wait("fine", DONE, timeout=60) == "done_marker_verified"

    assert tree_hash(outside) == before
    assert orch.state("evil") == "retryable_failed" and len(orch.show("evil")["attempts"]) == 1
    assert not (orch.home / "trash" / "evil").exists()


def test_reconcile_auto_requeue_is_not_blocked_by_one_symlinked_run_dir(orch, tmp_path):
    # One broken run dir (a crash job waiting for the user) must not stop the reconciler from
    # requeueing a preempted job by itself.
    outside = _outside_tree(tmp_path)
    before = tree_hash(outside)
    run = _failed_job(orch, "broken")
    os.rename(run, tmp_path / "broken-moved")
    os.symlink(outside, run)
    cmd = PREEMPTIBLE
    orch("submit", "--name", "pre", "--outputs", "result/*", "--", "bash", "-c", cmd, check=True)
    os.kill(wrapper_record(orch.runs / "pre")["child_pid"], signal.SIGTERM)
    assert orch.wait("pre", DONE, timeout=60) == "done_marker_verified"
    assert [a["failure_class"] for a in orch.show("pre")["attempts"]] == ["preempted", None]
    p = orch("reconcile")
    assert p.returncode == 0 and "Traceback" not in p.stderr
    assert tree_hash(outside) == before
    assert json.loads((outside / "done.json").read_text()) == {"not": "verified"}
