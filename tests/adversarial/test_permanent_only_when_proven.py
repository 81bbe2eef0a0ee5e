"""Permanent only when proven: no single observation of a condition that can be transient makes
a job ``failed``. Each test runs the real CLI and a real program (the bundled trainer where the reported
failure was the trainer's), injects the transient fault between attempts, and asserts the invariant: the job
ends ``done_marker_verified`` (or, for a fault that never goes away, ``failed`` only after N observations,
each with its evidence in ``orch show``)."""

from __future__ import annotations

import json
from pathlib import Path

from advkit import PY, assert_no_stuck, flip_byte, live_job_procs, orch_popen, show
from orchkit import wait_for

from orchestrator import protocol

FINAL = {"done_marker_verified", "failed", "cancelled"}
TRAINER = [PY, "-m", "orch_trainer", "--preset", "tiny"]


def _reported(run: Path, n: int, cls: str) -> bool:
    """Attempt ``n`` wrote failure.json with class ``cls`` and no process of the job is left."""
    try:
        got = json.loads((protocol.attempt_dir(run, n) / "failure.json").read_text()).get("class")
    except (OSError, ValueError):
        return False
    return got == cls and not live_job_procs(run)


def _summary(d: dict) -> list:
    return [(a["n"], a["state"], a["failure_class"], a["counted"], (a["action"] or {}).get("action"),
             (a["detail"] or "")[:160]) for a in d["attempts"]]


# A program preempted (failure.json class preempted, at step 3, exit 143) on its first 3 attempts, then done.
PREEMPTED_3_TIMES = (
    "import os, sys\n"
    "from orchestrator.kit.run import Run\n"
    "run = Run.from_env()\n"
    "run.begin()\n"
    "if run.attempt <= 3:\n"
    "    raise run.preempted(3, 'SIGTERM', None)\n"
    "open(os.path.join(os.environ['ORCH_RUN_DIR'], 'out.txt'), 'w').write('ok')\n")


def test_preempted_again_and_again_at_one_step_never_uses_up_max_attempts(orch):
    """A job preempted 3 times at the same step ... with --max-attempts 2 ended failed, "2 of 2 attempts
    used". The README's policy table says preemptions never count."""
    orch.write_config("[policy]\ncrash_backoff_s = 0.2\nbackoff_cap_s = 0.5\n")
    p = orch("submit", "--name", "pre3", "--max-attempts", "2", "--outputs", "out.txt", "--",
             PY, "-c", PREEMPTED_3_TIMES)
    assert p.returncode == 0, p.stderr
    assert orch.wait("pre3", FINAL, timeout=120) == "done_marker_verified", _summary(orch.show("pre3"))
    d = orch.show("pre3")
    att = d["attempts"]
    assert [(a["failure_class"], a["counted"]) for a in att[:3]] == [("preempted", False)] * 3, _summary(d)
    # The second and third preemption made no progress since the one before: backed off, growing, capped.
    backoffs = [((a["action"] or {}).get("details") or {}).get("backoff_s") for a in att[:3]]
    assert backoffs == [None, 0.2, 0.4], backoffs
    assert protocol.verify_done_marker(orch.runs / "pre3").verified
    assert_no_stuck(orch)


def _corpus(path: Path) -> Path:
    from orch_trainer.data import generated_corpus

    path.write_bytes(generated_corpus())
    return path


def test_a_data_file_missing_while_the_job_is_preempted_is_retried_and_the_job_ends_verified(orch, tmp_path):
    """A data file briefly missing (an NFS hiccup) when a preempted trainer resumed: invalid, then
    failed."""
    orch.write_config("[policy]\ncrash_backoff_s = 2\n")
    data = _corpus(tmp_path / "corpus.txt")
    run = orch.runs / "nfs"
    p = orch("submit", "--name", "nfs", "--", *TRAINER, "--data", data, "--max-steps", "20", "--save-interval", "5",
             "--inject-fault", "sigterm@step=8")
    assert p.returncode == 0, p.stderr
    wait_for(lambda: _reported(run, 1, "preempted"), 120, "attempt 1 to be preempted and exit", interval=0.1)
    hidden = data.rename(tmp_path / "corpus.hidden")  # the NFS hiccup: gone while the job is requeued

    def attempt2_ended() -> dict | None:
        orch("reconcile", check=True)
        d = show(orch, "nfs")
        return d if len(d["attempts"]) >= 2 and d["attempts"][1]["state"] not in ("pending", "submitted",
                                                                                  "running", "launching") else None
    d = wait_for(attempt2_ended, 120, "attempt 2 to end", interval=0.3)
    a2 = d["attempts"][1]
    assert (a2["failure_class"], a2["counted"], d["state"]) == ("input_missing", False, "retryable_failed"), _summary(d)
    assert str(data) in a2["detail"], a2["detail"]  # the evidence: which input was missing
    assert a2["action"]["auto"] and a2["action"]["details"]["backoff_s"] == 2.0, a2["action"]
    hidden.rename(data)  # back during the back-off

    assert orch.wait("nfs", FINAL, timeout=150) == "done_marker_verified", _summary(orch.show("nfs"))
    assert protocol.verify_done_marker(run).verified
    assert_no_stuck(orch)


def test_an_input_missing_on_n_attempts_in_a_row_is_invalid_with_the_evidence_in_show(orch, tmp_path):
    """The other half of the rule: a missing input that stays missing is permanent after
    policy.input_missing_attempts attempts in a row, and `orch show` names the path on each."""
    orch.write_config("[policy]\ncrash_backoff_s = 0.2\ninput_missing_attempts = 2\n")
    missing = tmp_path / "never-there.txt"
    p = orch("submit", "--name", "gone", "--", *TRAINER, "--data", missing, "--max-steps", "5")
    assert p.returncode == 0, p.stderr
    assert orch.wait("gone", FINAL, timeout=150) == "failed", _summary(orch.show("gone"))
    att = orch.show("gone")["attempts"]
    assert [(a["failure_class"], a["counted"]) for a in att] == [("input_missing", False), ("invalid", False)], att
    assert all(str(missing) in a["detail"] for a in att), [a["detail"] for a in att]
    assert att[-1]["action"]["action"] == "give_up" and "2 consecutive attempts" in att[-1]["action"]["why"]
    text = orch("show", "gone", check=True).stdout
    assert text.count(str(missing)) >= 2, text


def test_a_nan_rollback_target_corrupted_after_the_policy_chose_it_falls_back_to_an_older_one(orch, tmp_path):
    """A NaN rollback target corrupted after the policy chose it: the trainer refused --resume PATH,
    the attempt was invalid, the job failed. The byte is flipped while the launch of attempt 2 is held just
    before its backend call: the policy had verified the checkpoint, the trainer finds it corrupt."""
    run = orch.runs / "nanjob"
    p = orch("submit", "--name", "nanjob", "--", *TRAINER, "--max-steps", "40", "--save-interval", "5",
             "--keep-last-k", "4", "--inject-fault", "nan@step=22")
    assert p.returncode == 0, p.stderr
    wait_for(lambda: _reported(run, 1, "nan"), 120, "attempt 1 to report nan and exit", interval=0.1)
    go = tmp_path / "go"
    rec = orch_popen(orch, "reconcile", env={"ORCH_PAUSE_AT": "before_backend_submit", "ORCH_PAUSE_UNTIL": str(go),
                                            "ORCH_PAUSE_S": "120"})
    try:
        wait_for(lambda: Path(f"{go}.reached").exists() or rec.poll() is not None, 60,
                 "the relaunch to reach its backend call")
        assert rec.poll() is None, f"reconcile ended without relaunching: {rec.communicate()}"
        a1 = show(orch, "nanjob")["attempts"][0]
        chosen = a1["action"]["resume"]
        assert (a1["failure_class"], chosen) == ("nan", "checkpoints/step-00000020"), a1
        flip_byte(run / chosen / "model.pt")  # same size: only the sha256 can tell
    finally:
        go.touch()
        out, err = rec.communicate(timeout=60)
    assert rec.returncode == 0, (out, err)

    assert orch.wait("nanjob", FINAL, timeout=180) == "done_marker_verified", _summary(orch.show("nanjob"))
    d = orch.show("nanjob")
    assert d["attempts"][1]["failure_class"] is None, _summary(d)  # attempt 2 resumed and finished
    cfg = json.loads((run / protocol.RUN_CONFIG).read_text())
    assert cfg["resumed_from_step"] == 15, "resumed from the next OLDER verified checkpoint, never a newer one"
    assert protocol.verify_done_marker(run).verified
    for ck in protocol.iter_checkpoint_dirs(run):
        assert protocol.verify_checkpoint(ck) is None, ck
    assert_no_stuck(orch)
