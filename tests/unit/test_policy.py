"""policy.decide: class -> next action, attempt counting, per-class caps; command_for leaves argv alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from orchkit import make_checkpoint

from orchestrator import protocol
from orchestrator.core.lifecycle import JobState
from orchestrator.core.models import Attempt, Job
from orchestrator.core.retryplan import RetryPlan
from orchestrator.decide.policy import command_for, decide
from orchestrator.protocol import FailureClass, FailureReport


def job_with(run_dir: Path, history: list[tuple[str, bool]], *, max_attempts: int = 3,
             resources: dict | None = None, overrides: dict | None = None,
             command: list[str] | None = None) -> tuple[Job, Attempt]:
    """A job whose attempts ended with ``history`` [(class, counted)]; the last one is the current one.

    Attempt i ended at step 10*i: every attempt made progress.
    """
    attempts = [Attempt(id=i + 1, n=i + 1, token=f"t{i}", state="failed", backend="local", failure_class=cls,
                        failure_step=10 * i, counted=counted) for i, (cls, counted) in enumerate(history)]
    job = Job(id=1, name="j", state="running", backend="local", run_dir=str(run_dir),
              command=command or ["bash", "-c", "true"], resources=resources or {}, overrides=overrides or {},
              outputs=[], max_attempts=max_attempts, attempts=attempts)
    return job, attempts[-1]


def job_stepped(run_dir: Path, history: list[tuple[str, int | None]], **kw: object) -> tuple[Job, Attempt]:
    """A job whose attempts ended with ``history`` [(class, newest checkpoint step the policy recorded)]."""
    job, last = job_with(run_dir, [(cls, False) for cls, _ in history], **kw)  # type: ignore[arg-type]
    for a, (_cls, step) in zip(job.attempts[:-1], history, strict=False):
        a.action = RetryPlan.make("resume", details={"checkpoint_step": step})
    return job, last


def current(cls: str) -> tuple[str, bool]:
    return (cls, True)  # counted is decided by decide(); the current attempt's flag is not read


# ------------------------------------------------------------------------------------------
# counting and caps
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", ["preempted", "timeout", "node_fail"])
def test_uncounted_classes_that_made_progress_never_consume_max_attempts(cfg, tmp_path, cls):
    job, a = job_with(tmp_path, [(cls, False)] * 10 + [current(cls)], max_attempts=1)
    d = decide(cfg, job, a, cls, 10 * 10, None)
    assert d.state is JobState.RETRYABLE_FAILED
    assert d.counted is False
    assert d.plan.auto is True  # requeued by reconcile itself


@pytest.mark.parametrize("cls", ["preempted", "node_fail"])
def test_preemptions_never_count_even_without_progress_they_back_off_instead(cfg, tmp_path, cls):
    # Preempted 3 times at the same step with --max-attempts 2 ended failed, "2 of 2 attempts
    # used", though the README's policy table says preemptions never count.
    cfg.crash_backoff_s, cfg.backoff_cap_s = 10.0, 35.0
    _ckpts(tmp_path, [5])
    backoffs = []
    for n in range(1, 6):
        job, a = job_stepped(tmp_path, [(cls, 5)] * (n - 1) + [(cls, None)], max_attempts=1)
        d = decide(cfg, job, a, cls, 7, None)
        assert (d.state, d.counted, d.plan.auto) == (JobState.RETRYABLE_FAILED, False, True), n
        assert d.plan.details_dict["checkpoint_step"] == 5
        backoffs.append(d.plan.details_dict.get("backoff_s"))
        assert (d.plan.not_before is None) == (backoffs[-1] is None)
    # 1: no earlier attempt to compare with; 2: none since attempt 1 ... growing, capped at backoff_cap_s
    assert backoffs == [None, 10.0, 20.0, 35.0, 35.0]


def test_a_preemption_after_progress_resumes_at_once(cfg, tmp_path):
    cfg.crash_backoff_s = 10.0
    _ckpts(tmp_path, [10])
    job, a = job_stepped(tmp_path, [("preempted", 5), ("preempted", 5), ("preempted", None)], max_attempts=1)
    d = decide(cfg, job, a, "preempted", 12, None)
    assert (d.counted, d.plan.not_before, d.plan.details_dict.get("backoff_s")) == (False, None, None)


def test_preemptions_are_uncounted_whatever_policy_uncounted_says(cfg, tmp_path):
    cfg.uncounted = frozenset()
    for cls in ("preempted", "node_fail"):
        job, a = job_with(tmp_path, [current(cls)], max_attempts=1)
        assert decide(cfg, job, a, cls, None, None).counted is False, cls


@pytest.mark.parametrize("cls", ["timeout", "crash", "hang", "oom", "killed"])
def test_own_failures_without_a_newer_checkpoint_over_n_attempts_end_no_progress(cfg, tmp_path, cls):
    # A 1 s time limit at step 0 used to loop for free (then counted); now the no-progress guard ends it.
    cfg.no_progress_attempts = 3
    res = {"mem_mb": 1024}
    _ckpts(tmp_path, [5])
    job, a = job_stepped(tmp_path, [(cls, 5), (cls, None)], max_attempts=100, resources=res)
    assert decide(cfg, job, a, cls, 5, None).state is JobState.RETRYABLE_FAILED  # 1 attempt without progress
    # attempt 1 ended at 5 (progress from nothing); attempts 2, 3 and 4 ended at 5 again
    job, a = job_stepped(tmp_path, [(cls, 5), (cls, 5), (cls, 5), (cls, None)], max_attempts=100, resources=res)
    d = decide(cfg, job, a, cls, 5, None)
    assert (d.state, d.cls, d.plan.action) == (JobState.FAILED, FailureClass.NO_PROGRESS, "give_up")
    assert d.plan.why == "no_progress: the newest checkpoint stayed at step 5 over the last 3 attempts " \
                         "(policy.no_progress_attempts = 3)"


def test_no_progress_counts_from_nothing_on_the_first_attempts(cfg, tmp_path):
    cfg.no_progress_attempts = 3
    job, a = job_stepped(tmp_path, [("timeout", None), ("timeout", None), ("timeout", None)], max_attempts=2)
    d = decide(cfg, job, a, "timeout", 0, None)
    assert (d.state, d.cls, d.counted) == (JobState.FAILED, FailureClass.NO_PROGRESS, False)
    assert "the newest checkpoint stayed none over the last 3 attempts" in d.plan.why


def test_a_newer_checkpoint_or_another_class_resets_the_no_progress_count(cfg, tmp_path):
    cfg.no_progress_attempts = 3
    _ckpts(tmp_path, [10])
    job, a = job_stepped(tmp_path, [("timeout", 5), ("timeout", 5), ("timeout", None)], max_attempts=9)
    assert decide(cfg, job, a, "timeout", 10, None).state is JobState.RETRYABLE_FAILED  # 5 -> 10
    job, a = job_stepped(tmp_path, [("timeout", 10), ("nan", 10), ("timeout", 10), ("timeout", None)], max_attempts=9)
    assert decide(cfg, job, a, "timeout", 10, None).state is JobState.RETRYABLE_FAILED  # the nan rollback breaks it
    # preemptions in between neither count nor break it
    job, a = job_stepped(tmp_path, [("timeout", 10), ("timeout", 10), ("preempted", 10), ("timeout", 10),
                                    ("timeout", None)], max_attempts=9)
    assert decide(cfg, job, a, "timeout", 10, None).cls is FailureClass.NO_PROGRESS
    cfg.no_progress_attempts = 0  # off
    assert decide(cfg, job, a, "timeout", 10, None).state is JobState.RETRYABLE_FAILED


def test_attempts_recorded_before_the_checkpoint_step_was_kept_never_prove_no_progress(cfg, tmp_path):
    job, a = job_with(tmp_path, [("timeout", False)] * 5 + [current("timeout")], max_attempts=1)
    assert decide(cfg, job, a, "timeout", 0, None).state is JobState.RETRYABLE_FAILED


def test_a_storage_fault_is_retried_uncounted_after_a_growing_back_off_and_capped(cfg, tmp_path):
    # One EIO while a checkpoint was written, the previous one intact, was a counted crash that waited
    # for a person (`failed` under --max-attempts 1). The storage is not the job: never counted, even in orch.toml.
    cfg.crash_backoff_s, cfg.backoff_cap_s = 10.0, 35.0
    _ckpts(tmp_path, [5])
    for n, want in ((1, 10.0), (2, 20.0), (3, 35.0)):
        job, a = job_stepped(tmp_path, [("storage", 5)] * (n - 1) + [("storage", None)], max_attempts=1)
        d = decide(cfg, job, a, "storage", 7, None)
        assert (d.state, d.counted, d.plan.auto, d.cls) == (JobState.RETRYABLE_FAILED, False, True, None), n
        assert d.plan.details_dict["backoff_s"] == want and d.plan.not_before is not None, n
    cfg.uncounted = frozenset(cfg.uncounted) - {FailureClass.STORAGE}
    job, a = job_stepped(tmp_path, [("storage", None)], max_attempts=1)
    assert decide(cfg, job, a, "storage", 7, None).counted is False  # a platform fault whatever orch.toml says
    job, a = job_stepped(tmp_path, [("storage", 5)] * 10 + [("storage", None)], max_attempts=1)
    d = decide(cfg, job, a, "storage", 7, None)
    assert d.state is JobState.FAILED and "storage 11 times (cap 10)" in d.plan.why, d.plan.why


def test_input_missing_backs_off_uncounted_and_is_invalid_only_after_n_in_a_row(cfg, tmp_path):
    # A data file missing for a moment (NFS) at the start of a resume made the job failed for good.
    cfg.crash_backoff_s, cfg.input_missing_attempts = 10.0, 3
    for n, want in ((1, 10.0), (2, 20.0)):
        job, a = job_stepped(tmp_path, [("input_missing", None)] * (n - 1) + [("input_missing", None)], max_attempts=1)
        d = decide(cfg, job, a, "input_missing", None, None)
        assert (d.state, d.counted, d.plan.auto, d.cls) == (JobState.RETRYABLE_FAILED, False, True, None), n
        assert d.plan.details_dict["backoff_s"] == want and d.plan.not_before is not None
    job, a = job_stepped(tmp_path, [("input_missing", None)] * 3, max_attempts=1)
    d = decide(cfg, job, a, "input_missing", None, None)
    assert (d.state, d.cls, d.plan.action) == (JobState.FAILED, FailureClass.INVALID, "give_up")
    assert d.plan.why == "invalid: an input was missing at start on 3 consecutive attempts " \
                         "(policy.input_missing_attempts = 3)"
    # an attempt that ran in between starts the count again
    job, a = job_stepped(tmp_path, [("input_missing", None), ("input_missing", None), ("preempted", None),
                                    ("input_missing", None)], max_attempts=1)
    assert decide(cfg, job, a, "input_missing", None, None).state is JobState.RETRYABLE_FAILED


@pytest.mark.parametrize("cls", ["crash", "unknown", "marker_missing", "marker_corrupt"])
def test_counted_classes_consume_attempts_and_end_failed_at_max_attempts(cfg, tmp_path, cls):
    job, a = job_with(tmp_path, [("crash", True), current(cls)], max_attempts=3)
    d = decide(cfg, job, a, cls, None, None)
    assert (d.state, d.counted, d.plan.auto) == (JobState.RETRYABLE_FAILED, True, False)  # waits for `orch requeue`

    job, a = job_with(tmp_path, [("crash", True), ("unknown", True), current(cls)], max_attempts=3)
    d = decide(cfg, job, a, cls, None, None)
    assert d.state is JobState.FAILED
    assert d.plan.action == "give_up" and "3 of 3 attempts used" in d.plan.why


def test_uncounted_attempts_in_the_history_do_not_count_towards_the_limit(cfg, tmp_path):
    job, a = job_with(tmp_path, [("preempted", False), ("timeout", False), ("crash", True), current("crash")],
                      max_attempts=3)
    assert decide(cfg, job, a, "crash", None, None).state is JobState.RETRYABLE_FAILED


def test_invalid_is_permanent_on_the_first_attempt(cfg, tmp_path):
    job, a = job_with(tmp_path, [current("invalid")], max_attempts=100)
    d = decide(cfg, job, a, "invalid", None, None)
    assert d.state is JobState.FAILED and d.plan.action == "give_up" and "invalid" in d.plan.why


def test_cancelled_is_cancelled_and_uncounted(cfg, tmp_path):
    job, a = job_with(tmp_path, [current("cancelled")])
    d = decide(cfg, job, a, "cancelled", None, None)
    assert (d.state, d.counted) == (JobState.CANCELLED, False)


@pytest.mark.parametrize("cls", ["oom", "nan", "hang", "enospc"])
def test_per_class_cap_gives_up_after_that_many_of_the_same_class(cfg, tmp_path, cls):
    cap = cfg.caps[cls]
    resources = {"mem_mb": 1024}
    cfg.oom_mem_cap_mb = 10**9
    job, a = job_with(tmp_path, [(cls, True)] * (cap - 1) + [current(cls)], max_attempts=1000, resources=resources)
    assert decide(cfg, job, a, cls, 10, None).state is JobState.RETRYABLE_FAILED
    job, a = job_with(tmp_path, [(cls, True)] * cap + [current(cls)], max_attempts=1000, resources=resources)
    d = decide(cfg, job, a, cls, 10, None)
    assert d.state is JobState.FAILED
    assert f"(cap {cap})" in d.plan.why


def test_default_auto_requeue_classes_match_the_contract(cfg, tmp_path):
    # Contract: reconcile requeues preempted, timeout, node_fail, oom, hang, nan, killed by itself;
    # crash, unknown, marker_missing, marker_corrupt wait for `orch requeue`.
    for cls in ("preempted", "timeout", "node_fail", "oom", "hang", "nan", "killed"):
        job, a = job_with(tmp_path, [current(cls)], resources={"mem_mb": 1024})
        assert decide(cfg, job, a, cls, 5, None).plan.auto is True, cls
    for cls in ("crash", "unknown", "marker_missing", "marker_corrupt"):
        job, a = job_with(tmp_path, [current(cls)])
        d = decide(cfg, job, a, cls, None, None)
        assert (d.state, d.plan.auto) == (JobState.RETRYABLE_FAILED, False), cls


# ------------------------------------------------------------------------------------------
# nan: rollback
# ------------------------------------------------------------------------------------------
def _ckpts(run_dir: Path, steps: list[int]) -> None:
    for s in steps:
        make_checkpoint(run_dir, s)


def test_nan_rolls_back_to_newest_verified_checkpoint_at_least_k_before_the_bad_step(cfg, tmp_path):
    cfg.nan_rollback_steps = 5
    _ckpts(tmp_path, [10, 20, 30, 40])
    corrupt = make_checkpoint(tmp_path, 25)
    (corrupt / "model.pt").write_bytes(b"garbage of another size")
    protocol.atomic_write_json(tmp_path / protocol.RUN_CONFIG, {"lr": 0.001, "skip_batches": 0})
    job, a = job_with(tmp_path, [current("nan")], command=[sys.executable, "-m", "orch_trainer"])
    d = decide(cfg, job, a, "nan", 34, FailureReport.parse({"class": "nan", "step": 34}))
    # 34 - 5 = 29: step 30 is too close, 25 is corrupt, so 20; later verified ones are quarantined.
    assert d.state is JobState.RETRYABLE_FAILED and d.plan.auto
    details = d.plan.details_dict
    assert d.plan.action == "rollback" and details["resume_step"] == 20 and details["bad_step"] == 34
    assert d.plan.resume == "checkpoints/step-00000020"  # relative to the run dir; the trainer resolves it
    # The corrupt step 25 is quarantined too: it never stays under its committed name.
    assert sorted(d.plan.quarantine) == ["checkpoints/step-00000025", "checkpoints/step-00000030",
                                         "checkpoints/step-00000040"]
    assert d.plan.overrides_dict["lr"] == pytest.approx(0.0005) and details["lr_before"] == pytest.approx(0.001)
    assert d.plan.overrides_dict["skip_batches"] == 34 - 20


def test_nan_exactly_k_before_is_allowed(cfg, tmp_path):
    cfg.nan_rollback_steps = 5
    _ckpts(tmp_path, [10, 30])
    job, a = job_with(tmp_path, [current("nan")])
    d = decide(cfg, job, a, "nan", 35, None)
    assert d.plan.details_dict["resume_step"] == 30 and d.plan.quarantine == ()


def test_nan_lr_halves_again_from_the_previous_override(cfg, tmp_path):
    _ckpts(tmp_path, [10])
    protocol.atomic_write_json(tmp_path / protocol.RUN_CONFIG, {"lr": 0.001})
    job, a = job_with(tmp_path, [("nan", True), current("nan")], overrides={"lr": 0.0005, "skip_batches": 5})
    d = decide(cfg, job, a, "nan", 20, None)
    assert d.plan.overrides_dict["lr"] == pytest.approx(0.00025)
    assert d.plan.overrides_dict["skip_batches"] == 5 + (20 - 10)


def test_nan_without_a_good_checkpoint_starts_over_and_quarantines_all(cfg, tmp_path):
    cfg.nan_rollback_steps = 10
    _ckpts(tmp_path, [10, 20])
    job, a = job_with(tmp_path, [current("nan")])
    d = decide(cfg, job, a, "nan", 15, None)
    assert d.plan.resume == "none" and d.plan.details_dict["resume_step"] == 0
    assert sorted(d.plan.quarantine) == ["checkpoints/step-00000010", "checkpoints/step-00000020"]


# ------------------------------------------------------------------------------------------
# oom, enospc
# ------------------------------------------------------------------------------------------
def test_oom_doubles_memory(cfg, tmp_path):
    job, a = job_with(tmp_path, [current("oom")], resources={"mem_mb": 4096})
    d = decide(cfg, job, a, "oom", None, None)
    assert d.state is JobState.RETRYABLE_FAILED and d.plan.auto
    assert d.plan.resources_dict == {"mem_mb": 8192}
    assert (d.plan.action, d.plan.details_dict) == ("more_memory", {"mem_mb_before": 4096, "checkpoint_step": None})


def test_oom_memory_is_capped_then_gives_up_at_the_cap(cfg, tmp_path):
    cfg.oom_mem_cap_mb = 6000
    job, a = job_with(tmp_path, [current("oom")], resources={"mem_mb": 4096})
    assert decide(cfg, job, a, "oom", None, None).plan.resources_dict == {"mem_mb": 6000}
    job, a = job_with(tmp_path, [current("oom")], resources={"mem_mb": 6000})
    d = decide(cfg, job, a, "oom", None, None)
    assert d.state is JobState.FAILED and d.plan.auto is False and "memory cap" in d.plan.why


def test_oom_without_mem_gives_up(cfg, tmp_path):
    job, a = job_with(tmp_path, [current("oom")])
    d = decide(cfg, job, a, "oom", None, None)
    assert d.state is JobState.FAILED and d.plan.auto is False and "no --mem" in d.plan.why


def test_enospc_prunes_verified_checkpoints_beyond_keep_last_k_and_empties_the_trash(cfg, tmp_path):
    cfg.keep_last_k = 2
    _ckpts(tmp_path, [10, 20, 30, 40, 50])
    job, a = job_with(tmp_path, [current("enospc")])
    d = decide(cfg, job, a, "enospc", None, None)
    assert d.state is JobState.RETRYABLE_FAILED
    assert sorted(d.plan.prune) == ["checkpoints/step-00000010", "checkpoints/step-00000020",
                                    "checkpoints/step-00000030"]
    assert d.plan.action == "prune_and_resume" and d.plan.empty_trash is True


def test_enospc_with_few_checkpoints_prunes_nothing(cfg, tmp_path):
    _ckpts(tmp_path, [10, 20])
    job, a = job_with(tmp_path, [current("enospc")])
    assert decide(cfg, job, a, "enospc", None, None).plan.prune == ()


def test_a_launch_onto_a_full_disk_never_uses_up_the_job_and_backs_off(cfg, tmp_path):
    # Hostile test: three passes of launch failures on a full disk made the job `failed` within seconds.
    cfg.crash_backoff_s = 30.0
    history = [("enospc", False)] * 6 + [current("enospc")]
    job, a = job_with(tmp_path, history, max_attempts=3)
    d = decide(cfg, job, a, "enospc", None, None, never_launched=True)
    assert (d.state, d.counted, d.plan.auto) == (JobState.RETRYABLE_FAILED, False, True)
    assert d.plan.details_dict["backoff_s"] == 1920.0  # 30 s x 2**6
    assert d.plan.action == "prune_and_resume" and d.plan.not_before is not None
    # The same class from a program that ran still counts and is capped (enospc cap 2).
    assert decide(cfg, *job_with(tmp_path, [("enospc", True)] * 2 + [current("enospc")]), "enospc", None,
                  None).state is JobState.FAILED


# ------------------------------------------------------------------------------------------
# command_for
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [[sys.executable, "-m", "orch_trainer", "--preset", "tiny", "--lr", "0.01"],
                                  [sys.executable, "-m", "trainer", "--lr", "0.01"],
                                  ["bash", "-c", "python -m trainer"], ["python", "train.py", "-m", "x"],
                                  ["./trainer"]])
def test_command_for_never_changes_argv_the_policy_travels_in_orch_overrides(tmp_path, argv):
    # A user's own module named `trainer` used to get --lr/--resume appended: no program is
    # recognised from its argv; the bundled trainer reads ORCH_OVERRIDES like any other program.
    job, _ = job_with(tmp_path, [current("nan")], command=argv, overrides={"lr": 0.005, "skip_batches": 7})
    out, overrides = command_for(job, RetryPlan.make("rollback", resume="/r/checkpoints/step-00000010"))
    assert out == argv
    assert overrides == {"lr": 0.005, "skip_batches": 7, "resume": "/r/checkpoints/step-00000010"}


def test_repeated_preemptions_without_a_step_are_never_counted(db, cfg):
    # Programs without failure.json (and Slurm PREEMPTED read from sacct) have no step: "no progress
    # since the last attempt" cannot be judged, so a preemption stays free however often it comes.
    from orchestrator.core.models import Attempt, Job
    from orchestrator.decide.policy import decide

    with db.write() as s:
        job = Job(name="p", state="running", backend="slurm", run_dir=str(cfg.runs_root / "p"),
                  command=["true"], max_attempts=1)
        s.add(job)
        s.flush()
        for n in (1, 2, 3):
            s.add(Attempt(job_id=job.id, n=n, token=f"t{n}", state="failed", backend="slurm",
                          failure_class="preempted", counted=False))
        s.add(Attempt(job_id=job.id, n=4, token="t4", state="failed", backend="slurm"))
        s.flush()
        d = decide(cfg, job, job.attempts[-1], "preempted", None, None)
    assert d.counted is False and d.state.value == "retryable_failed" and d.plan.auto


def test_killed_is_auto_requeued_backed_off_counted_and_capped(cfg, tmp_path):
    # A kill -9 with no record was `crash`, waiting for a manual `orch requeue`.
    cfg.crash_backoff_s = 30.0
    job, a = job_with(tmp_path, [("killed", True), current("killed")], max_attempts=5)
    d = decide(cfg, job, a, "killed", None, None)
    assert (d.state, d.plan.auto, d.counted) == (JobState.RETRYABLE_FAILED, True, True)
    assert d.plan.details_dict["backoff_s"] == 60.0 and d.plan.not_before is not None
    job, a = job_with(tmp_path, [("killed", True)] * 3 + [current("killed")], max_attempts=10)
    assert decide(cfg, job, a, "killed", None, None).state is JobState.FAILED  # cap 3


def test_a_full_disk_before_any_progress_backs_off_uncounted_however_often_it_comes(cfg, tmp_path):
    """Hostile pass: a disk filled by another process; the trainer's own free-space check at start-up
    ended attempts 2 and 3 within 2 s each, requeued at once and counted: `failed` 8 s after the disk filled.
    An enospc attempt that made no progress is a launch onto a full disk in substance."""
    cfg.crash_backoff_s = 30.0
    _ckpts(tmp_path, [40])
    job, a = job_stepped(tmp_path, [("enospc", 40), ("enospc", 40), ("enospc", 40), ("enospc", None)],
                         max_attempts=3)
    d = decide(cfg, job, a, "enospc", None, None)
    assert (d.state, d.counted, d.plan.auto) == (JobState.RETRYABLE_FAILED, False, True), d
    assert d.plan.details_dict["backoff_s"] == 240.0 and d.plan.not_before is not None  # 30 s x 2**3
    # An attempt that advanced the checkpoint before the disk filled still counts, without a back-off.
    job, a = job_stepped(tmp_path, [("enospc", 20), ("enospc", None)], max_attempts=3)
    d = decide(cfg, job, a, "enospc", None, None)
    assert (d.state, d.counted, d.plan.not_before) == (JobState.RETRYABLE_FAILED, True, None), d
