"""Honest counts: an attempt the scheduler requeued in place (Slurm reruns the same attempt) is a
preemption in ``orch metrics`` and ``orch show``, with the steps redone measured from the heartbeats.

The in-place requeue is reproduced without a cluster the way Slurm does it: the same attempt's wrapper runs
twice (the second time with SLURM_RESTART_COUNT=1), the first run ended by a real SIGTERM; the bundled
trainer checkpoints, and the rerun resumes. The job row records what the reconciler would after that
(attempt succeeded, restarts=1). Real processes, real signals, real trainer; tests/slurm covers the cluster.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from orchkit import wait_for, wait_for_file

from orchestrator import protocol
from orchestrator.core.config import load_config
from orchestrator.core.db import Database
from orchestrator.core.lifecycle import AttemptState, JobState
from orchestrator.core.models import Attempt, Job
from orchestrator.views.goodputview import report as goodput_report
from orchestrator.views.metrics import collect, render
from orchestrator.views.show import show_job

TOKEN = "a1b2c3d4e5f60718"
TRAINER = [sys.executable, "-m", "orch_trainer", "--preset", "tiny", "--max-steps", "150", "--save-interval",
           "1000", "--heartbeat-interval", "0.1"]


def _wrapper(orch, run_dir, restart: int) -> subprocess.Popen:
    env = {k: v for k, v in orch.env.items() if not k.startswith("SLURM_")}
    if restart:
        env["SLURM_RESTART_COUNT"] = str(restart)
    argv = [sys.executable, "-m", "orchestrator.jobside.wrapper", "--run-dir", str(run_dir), "--job", "ip", "--attempt",
            "1", "--token", TOKEN, "--", *TRAINER]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_an_in_place_requeue_is_a_preemption_in_metrics_and_show_with_steps_redone_measured(orch, monkeypatch):
    monkeypatch.setenv("ORCH_HOME", str(orch.home))
    cfg = load_config()
    db = Database(cfg)
    run_dir = cfg.runs_root / "ip"
    run_dir.mkdir(parents=True)
    first = _wrapper(orch, run_dir, 0)

    def reached_30() -> bool:
        assert first.poll() is None, f"the wrapper exited {first.returncode} before step 30"
        return (protocol.read_progress(run_dir, 1) or {}).get("step", 0) >= 30

    wait_for(reached_30, 120, "the trainer's step 30", interval=0.1)
    first.send_signal(signal.SIGTERM)  # the preemption notice; the wrapper passes it on (no SLURM_JOB_ID)
    assert first.wait(60) == 143
    reached = protocol.read_failure(run_dir, 1)["step"]
    second = _wrapper(orch, run_dir, 1)
    assert second.wait(180) == 0
    wait_for_file(run_dir / protocol.DONE_MARKER)
    assert protocol.verify_done_marker(run_dir).verified
    # Each run kept its own start record: the rerun set the first run's wrapper.json aside (issue 45: it was
    # overwritten, and where the first run began was lost to goodput and plot).
    adir = protocol.attempt_dir(run_dir, 1)
    first_rec = protocol.read_json_bounded(adir / "wrapper.prev-1.json", limit=1 << 16)
    assert (first_rec["restart_count"], first_rec["pid"]) == (0, first.pid), first_rec
    assert protocol.read_json_bounded(adir / protocol.WRAPPER_FILE, limit=1 << 16)["restart_count"] == 1
    runs = protocol.run_records(run_dir, 1, TOKEN)
    assert [r["run"] for r in runs] == [0, 1] and runs[0]["started_at"] < runs[1]["started_at"], runs
    with db.write() as s:  # what the reconciler records for it: one attempt, restarted once, succeeded
        job = Job(name="ip", state=JobState.DONE, backend="slurm", run_dir=str(run_dir), command=TRAINER,
                  resources={}, outputs=[], max_attempts=3)
        s.add(job)
        s.flush()
        s.add(Attempt(job_id=job.id, n=1, token=TOKEN, state=AttemptState.SUCCEEDED, backend="slurm",
                      external_id="7", restarts=1))

    snap = collect(db)
    assert snap.failures["preempted"] == 1, snap.failures
    resumed = next(r["resumed_from"] for r in protocol.read_progress_history(run_dir, 1)
                   if r.get("resumed_from"))
    assert (snap.redone_sum, snap.redone_count, snap.unmeasured) == (reached - resumed, 1, 0), (snap, reached, resumed)
    text = render(snap)
    assert 'orch_attempt_failures{class="preempted"} 1' in text and "orch_preemption_steps_redone_count 1" in text
    shown = show_job(db, "ip")
    assert shown["preemptions"] == {"total": 1, "in_place": 1}
    assert shown["attempts"][0]["restart_history"][0]["class"] == "preempted"
    out = orch("show", "ip").stdout
    assert "preemptions: 1 (1 requeued in place by the scheduler)" in out, out
    assert goodput_report(db, None)["fleet"]["preemptions"] == 1

    # The same run, had Slurm said NODE_FAIL (a node set down under it; the program saw the same TERM): the
    # scheduler's account, which reconcile records from sacct, wins in show, metrics and goodput.
    protocol.write_restart_causes(protocol.attempt_dir(run_dir, 1), TOKEN, ["node_fail"])
    snap = collect(db)
    assert (snap.failures["preempted"], snap.failures["node_fail"], snap.redone_count) == (0, 1, 0), snap.failures
    shown = show_job(db, "ip")
    assert shown["preemptions"] == {"total": 0, "in_place": 0}
    assert shown["attempts"][0]["restart_history"] == [{"restart": 1, "class": "node_fail", "step": reached}]
    assert goodput_report(db, None)["fleet"]["preemptions"] == 0
    db.engine.dispose()
