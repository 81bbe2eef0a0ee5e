"""submitit code under orch (orchestrator/integrations/submitit.py): OrchExecutor on the local backend, real
submitit pickling (cloudpickle DelayedSubmission), real processes and signals, ``orch reconcile`` through the CLI.

The preemption SIGTERM goes where a scheduler's notice goes: to the job's batch process, orch's wrapper (the
parent of the program), which passes it on once.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from intkit import DONE, EXAMPLES, failure, progress_step, repeats, state_dicts_equal, step_log
from orchkit import wait_for
from submitit.core.utils import FailedJobError

from orchestrator import protocol
from orchestrator.errors import Refused
from orchestrator.integrations.submitit import OrchExecutor

sys.path.insert(0, str(EXAMPLES))
from submitit_train import TrainLoop  # examples/ is no package

RUNNER = b"orchestrator.integrations.submitit_runner"


@pytest.fixture
def executor(orch, monkeypatch):
    """An OrchExecutor in this process, with the test's ORCH_HOME; the jobs inherit this environment."""
    for k in list(os.environ):
        if k.startswith(("ORCH_", "SLURM_", "WANDB_", "SUBMITIT_")):
            monkeypatch.delenv(k)
    for k, v in orch.env.items():
        monkeypatch.setenv(k, v)
    return OrchExecutor(backend="local", poll_s=0.3)


def runner_pid(run_dir: Path) -> int | None:
    """The attempt's program: a process running orch's submitit runner with ORCH_RUN_DIR=<run_dir>."""
    needle = f"{protocol.ENV_RUN_DIR}={run_dir}".encode()
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and RUNNER in (d / "cmdline").read_bytes() and \
                    needle in (d / "environ").read_bytes().split(b"\0"):
                return int(d.name)
        except OSError:
            continue
    return None


def sigterm_wrapper(orch, name: str, attempt: int, past_step: int, timeout: float = 180) -> None:
    """Once attempt ``attempt`` posted progress past ``past_step``, SIGTERM its wrapper (the program's parent).

    Runs ``orch reconcile`` meanwhile: that is what requeues the previous attempt."""
    run_dir = orch.runs / name

    def ready() -> int | None:
        orch.reconcile_paced()
        return runner_pid(run_dir) if progress_step(run_dir, attempt) > past_step else None

    pid = wait_for(ready, timeout, f"{name} attempt {attempt} past step {past_step}", interval=0.2)
    os.kill(parent_of(pid), signal.SIGTERM)


def parent_of(pid: int) -> int:
    ppid = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
    assert b"orchestrator.jobside.wrapper" in Path(f"/proc/{ppid}/cmdline").read_bytes()
    return ppid


def test_checkpointable_preempted_twice_resumes_at_its_safe_points_and_ends_bit_exact(orch, executor, tmp_path):
    steps_log, max_steps = tmp_path / "updates.log", 120
    executor.update_parameters(orch_name="sit", timeout_min=30, mem_gb=1, cpus_per_task=1)
    job = executor.submit(TrainLoop(max_steps, step_log=str(steps_log), sleep_per_step=0.03))
    assert job.job_id == "sit"
    run_dir = orch.runs / "sit"
    sigterm_wrapper(orch, "sit", 1, past_step=15)
    wait_for(lambda: (protocol.attempt_dir(run_dir, 1) / protocol.FAILURE_FILE).exists(), 60, "attempt 1's report")
    sigterm_wrapper(orch, "sit", 2, past_step=failure(run_dir, 1)["step"] + 15)
    out = job.result()  # reconcile passes until it settles

    assert job.state == DONE and job.done()
    shown = orch.show("sit")["attempts"]
    assert [(a["failure_class"], (a["action"] or {}).get("auto")) for a in shown] == \
        [("preempted", True), ("preempted", True), (None, None)], shown
    assert shown[2]["state"] == "succeeded"
    v = orch("verify", "sit")
    assert (v.returncode, v.stdout) == (0, "VERIFIED\n"), v.stdout + v.stderr

    log = step_log(steps_log)
    assert repeats(log) == 0, log  # 0 optimizer updates applied twice: <= 1 per preemption is the bar
    assert sorted(s for _, s in log) == list(range(1, max_steps + 1))
    for n in (1, 2):
        report = failure(run_dir, n)
        assert report["class"] == "preempted" and "called at safe_point()" in report["detail"], report
        assert report["checkpoint"] == f"checkpoints/{protocol.checkpoint_name(report['step'])}", report
        assert max(s for a, s in log if a == n) == report["step"], (n, report)
        assert min(s for a, s in log if a == n + 1) == report["step"] + 1, (n, report)
    # Bit for bit against the same callable run once, uninterrupted, in this process (safe_point: a no-op).
    reference = TrainLoop(max_steps)()
    assert out["steps"] == max_steps and out["loss"] == reference["loss"]
    assert state_dicts_equal(out["state_dict"], reference["state_dict"])
    # Both preemptions measured (the submitit runner's heartbeats carried no resumed_from).
    metrics = orch("metrics", check=True).stdout
    assert "orch_preemption_steps_redone_count 2" in metrics and "orch_preemptions_unmeasured 0" in metrics, metrics


def test_exception_in_the_callable_is_a_crash_with_its_traceback_and_result_raises(orch, executor):
    executor.update_parameters(orch_name="sitcrash")
    job = executor.submit(TrainLoop(20, fail_at=5))
    with pytest.raises(FailedJobError, match="boom at step 5") as raised:
        job.result()
    assert "Traceback" in str(raised.value) and "submitit_train.py" in str(raised.value)
    assert job.state == "retryable_failed"
    (attempt,) = orch.show("sitcrash")["attempts"]
    assert attempt["failure_class"] == "crash" and attempt["action"]["auto"] is False, attempt
    assert attempt["detail"].startswith("ValueError: boom at step 5\n"), attempt["detail"]
    assert 'submitit_train.py", line' in attempt["detail"], attempt["detail"]
    assert not protocol.verify_done_marker(orch.runs / "sitcrash").verified


def test_without_safe_point_the_in_handler_checkpoint_can_tear_the_state(orch, executor, tmp_path):
    # submitit's semantics, kept as the fallback: checkpoint() inside the signal handler. The signal lands
    # between the optimizer update of step 10 and `self.step = 10` (a pause there stands in for an evaluation,
    # a log call, an all-reduce); the pickled state holds update 10 with step counter 9.
    steps_log, pause, max_steps = tmp_path / "updates.log", tmp_path / "paused", 40
    executor.update_parameters(orch_name="sitfb")
    job = executor.submit(TrainLoop(max_steps, step_log=str(steps_log), use_safe_point=False, pause_after_update=10,
                                    pause_file=str(pause)))
    run_dir = orch.runs / "sitfb"
    wait_for(pause.exists, 120, "the pause after update 10")
    os.kill(parent_of(runner_pid(run_dir)), signal.SIGTERM)
    out = job.result()

    report = failure(run_dir, 1)
    assert report["class"] == "preempted" and "in the signal handler" in report["detail"], report
    # No step from safe_point(): the checkpoint is numbered in sequence.
    assert report["checkpoint"] == "checkpoints/step-00000001" and report["step"] is None, report
    log = step_log(steps_log)
    # Update 10 was applied in attempt 1 and again in attempt 2, on weights that already had it.
    assert repeats(log) == 1 and [s for _, s in log].count(10) == 2 and min(s for a, s in log if a == 2) == 10, log
    reference = TrainLoop(max_steps)()
    assert out["steps"] == max_steps
    assert not state_dicts_equal(out["state_dict"], reference["state_dict"])  # silently not the same model


def test_plain_function_result_and_submitit_job_environment(executor):
    def probe(x: int, y: int = 1) -> tuple:
        import submitit

        env = submitit.JobEnvironment()
        return x + y, env.job_id, env.global_rank, os.environ["ORCH_ATTEMPT"]

    executor.update_parameters(name="probe", timeout_min=5)
    jobs = executor.map_array(probe, [1, 2])
    assert [j.result() for j in jobs] == [(2, f"{jobs[0].job_id}.1", 0, "1"), (3, f"{jobs[1].job_id}.1", 0, "1")]
    assert all(j.job_id.startswith("probe-") for j in jobs)


def test_refusals_come_before_anything_is_written(orch, executor):
    slurm = OrchExecutor(backend="slurm")
    for ex, params, message in [
        (executor, {"slurm_array_parallelism": 4}, "slurm_array_parallelism not supported by OrchExecutor"),
        (executor, {"nodes": 2}, "nodes=2: OrchExecutor runs one task on one node"),
        (executor, {"mem_gb": -1}, "mem_gb=-1: must be a number"),
        (executor, {"orch_name": "../x"}, "job name"),
        (slurm, {"slurm_partition": "spot\n#SBATCH --x"}, "refusing partition"),
        (slurm, {"slurm_additional_parameters": {"output": "/tmp/x"}}, "orch sets --output itself"),
    ]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            ex.update_parameters(**params)
    assert not orch.home.exists()  # not even ORCH_HOME: argument checks come first

    executor.update_parameters(orch_name="dup")
    assert executor.submit(sum, [1, 2]).result() == 3
    with pytest.raises(Refused) as refused:
        executor.submit(sum, [3, 4])
    assert refused.value.exit_code == 3 and "refused:" in str(refused.value) and "dup" in str(refused.value)
    assert len(list((orch.runs / "dup" / "submitit").iterdir())) == 1  # the refused pickle was never left there


def test_kill9_is_recovered_by_result_from_the_periodic_checkpoint(orch, executor, tmp_path):
    # The submitit path wrote no periodic checkpoint (a kill -9 redid everything), the kill was
    # `crash`, and job.result() raised FailedJobError although the job was recoverable.
    orch.write_config("[policy]\ncrash_backoff_s = 0.5\n")
    steps_log, max_steps = tmp_path / "updates.log", 150
    executor.update_parameters(orch_name="sk9", orch_checkpoint_every_s=0.5)
    job = executor.submit(TrainLoop(max_steps, step_log=str(steps_log), sleep_per_step=0.03))
    run_dir = orch.runs / "sk9"
    wait_for(lambda: [s for s, _ in protocol.verified_checkpoints(run_dir) if s >= 20], 120,
             "a periodic checkpoint past step 20")
    pid = wait_for(lambda: runner_pid(run_dir), 30, "the runner")
    os.kill(pid, signal.SIGKILL)
    out = job.result()  # no orch requeue: the reconcile passes of result() bring it back
    shown = orch.show("sk9")["attempts"]
    assert [a["failure_class"] for a in shown] == ["killed", None], shown
    log = step_log(steps_log)
    resumed = min(s for a, s in log if a == 2) - 1
    assert resumed >= 20 and sorted({s for _, s in log}) == list(range(1, max_steps + 1)), log
    assert out["steps"] == max_steps
    assert repeats(log) <= max(s for a, s in log if a == 1) - resumed  # only the steps since the last commit


def test_checkpoint_every_s_is_checked_like_every_parameter(executor):
    for bad in (-1, float("nan"), "600", True):
        with pytest.raises(ValueError, match="orch_checkpoint_every_s"):
            executor.update_parameters(orch_checkpoint_every_s=bad)
