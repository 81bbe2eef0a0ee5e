"""Seed 000: a "refuse a non-empty output dir" guard plus a retry launcher deadlocked the runner.

The failure leaves a run dir that is non-empty (command.json, a partial result) and unfinished.
orch must treat exactly that state as retryable, and refuse only a run dir whose marker verifies.
"""

from __future__ import annotations

import json
from pathlib import Path

from localkit import DONE, FLAKY, RETRYABLE, db_rows, trash_files, tree_hash

from orchestrator import protocol


def test_seed000_attempt_that_died_after_writing_is_requeued_and_finishes_in_the_same_run_dir(orch):
    orch("submit", "--name", "seed", "--outputs", "result/*", "--", "bash", "-c", FLAKY, check=True)
    assert orch.wait("seed", RETRYABLE | DONE, timeout=60) == "retryable_failed"
    run = orch.runs / "seed"
    a1 = orch.show("seed")["attempts"][0]
    assert (a1["failure_class"], a1["exit_code"]) == ("crash", 1)
    # The state the seed's guard misread as "finished": a non-empty dir with command.json and a result.
    cmd1 = json.loads((protocol.attempt_dir(run, 1) / "command.json").read_text())
    assert cmd1["argv"] == ["bash", "-c", FLAKY]
    assert (run / "result" / "model.bin").read_text() == "partial 1\n"
    assert protocol.verify_done_marker(run).status.value == "ABSENT"

    p = orch("requeue", "--failed")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("seed: requeued as attempt 2") and "clears result" in p.stdout
    assert orch.wait("seed", DONE, timeout=60) == "done_marker_verified"

    show = orch.show("seed")
    assert show["run_dir"] == str(run) and [a["n"] for a in show["attempts"]] == [1, 2]
    assert show["attempts"][1]["state"] == "succeeded"
    assert json.loads((run / "done.json").read_text())["attempt"] == 2
    assert (run / "result" / "model.bin").read_text() == "complete 2\n"
    assert (protocol.attempt_dir(run, 1) / "command.json").exists()  # history kept, per attempt
    assert (protocol.attempt_dir(run, 2) / "command.json").exists()
    assert (run / "ran.log").read_text().count("attempt=") == 2
    # The partial result of attempt 1 went to the trash, not into the verified result.
    assert trash_files(orch.home, "seed") == {"result/model.bin": b"partial 1\n"}


def _leave_earlier_run(run: Path) -> dict[str, bytes]:
    """What an earlier run of the same name (another ORCH_HOME's DB, same runs root) left behind."""
    (run / "result").mkdir(parents=True)
    (run / "result" / "model.bin").write_bytes(b"half a model")
    (run / "result" / "partial.bin").write_bytes(b"partial")
    protocol.atomic_write_json(run / "done.json", {  # unverified: the hash is wrong
        "schema": 1, "job": run.name, "attempt": 3, "finished_at": protocol.now_iso(),
        "artifacts": {"result/model.bin": {"size": 12, "sha256": "f" * 64}}})
    (run / "checkpoints" / "step-00000005.tmp-0badf00d").mkdir(parents=True)
    (run / "checkpoints" / "step-00000005.tmp-0badf00d" / "model.pt").write_bytes(b"torn")
    (run / "notes.txt").write_text("user's own file\n")
    return {"done.json": (run / "done.json").read_bytes(), "result/model.bin": b"half a model",
            "result/partial.bin": b"partial", "checkpoints/step-00000005.tmp-0badf00d/model.pt": b"torn"}


def test_submit_into_a_dir_left_by_an_earlier_run_trashes_unverified_leftovers_and_runs(orch):
    run = orch.runs / "again"
    leftovers = _leave_earlier_run(run)
    assert protocol.verify_done_marker(run).status.value == "CORRUPT"

    p = orch("submit", "--name", "again", "--outputs", "result/*", "--", "bash", "-c",
             "mkdir -p result; echo fresh > result/model.bin")
    assert p.returncode == 0, p.stderr
    assert orch.wait("again", DONE, timeout=60) == "done_marker_verified"

    assert trash_files(orch.home, "again") == leftovers
    marker = json.loads((run / "done.json").read_text())
    assert list(marker["artifacts"]) == ["result/model.bin"]  # nothing from the earlier run is vouched for
    assert (run / "result" / "model.bin").read_text() == "fresh\n"
    assert not (run / "result" / "partial.bin").exists()
    assert (run / "notes.txt").read_text() == "user's own file\n"  # not an output: left alone
    assert not list((run / "checkpoints").iterdir())


def test_submit_refuses_a_run_dir_whose_marker_verifies_and_changes_nothing(orch):
    run = orch.runs / "finished"
    (run / "result").mkdir(parents=True)
    (run / "result" / "model.bin").write_bytes(b"the real result")
    protocol.write_done_marker(run, "finished", 1, ["result/model.bin"])
    before = tree_hash(run)

    p = orch("submit", "--name", "finished", "--outputs", "result/*", "--", "bash", "-c", "echo x > result/model.bin")
    assert p.returncode == 3
    assert "verified" in p.stderr and str(run) in p.stderr
    assert p.stderr.startswith("orch: refused")
    assert tree_hash(run) == before
    assert db_rows(orch.home, "SELECT count(*) FROM jobs") == [(0,)]
    assert not (orch.home / "trash").exists()


def test_records_of_an_earlier_runs_attempt_do_not_classify_the_new_attempt(orch):
    # The earlier run's attempt 1 reported itself invalid. The new attempt 1 (fresh DB, same run dir)
    # crashes without a report: it is a crash (retryable), not the old run's permanent "invalid".
    old = protocol.attempt_dir(orch.runs / "reborn", 1)
    old.mkdir(parents=True)
    protocol.atomic_write_json(old / "failure.json", {"class": "invalid", "step": None, "detail": "old run"})
    protocol.atomic_write_json(old / "command.json", {"argv": ["old"], "token": "0ldt0ken0ldt0ken"})
    orch("submit", "--name", "reborn", "--", "bash", "-c", "exit 1", check=True)
    assert orch.wait("reborn", RETRYABLE | DONE | {"failed"}, timeout=60) == "retryable_failed"
    a = orch.show("reborn")["attempts"][0]
    assert (a["failure_class"], a["detail"]) == ("crash", "exit 1")
    # The earlier run's records are kept in the trash, not mixed into the new attempt's dir.
    trashed = trash_files(orch.home, "reborn")
    assert json.loads(trashed["attempts/1/failure.json"])["detail"] == "old run"
    assert json.loads((old / "command.json").read_text())["argv"] == ["bash", "-c", "exit 1"]
