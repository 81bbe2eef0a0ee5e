"""End to end on the real dev Slurm cluster: the real CLI, the bundled trainer, real preemption.

`orch submit --backend slurm` starts the trainer as a Slurm batch job; `orch reconcile` (run by
the tests as cron would) polls Slurm, verifies markers, classifies and requeues. Claims:

* spot (PreemptMode=REQUEUE): a real `prio` job preempts the trainer; it checkpoints on SIGTERM,
  Slurm requeues it in place, it resumes from the checkpoint it just saved (no completed step
  redone), and the job ends done_marker_verified with exactly ONE orch attempt.
* spot-cancel (PreemptMode=CANCEL): the same preemption ends the Slurm job; orch classifies
  `preempted`, requeues by itself, attempt 2 resumes from attempt 1's checkpoint and is verified.
* time limit: the USR2 warning makes the trainer checkpoint before the limit; orch requeues; the
  next attempt resumes from that checkpoint.
* memory limit: Slurm kills the trainer (OverMemoryKill); orch says `oom` and retries with more memory.
* sacct failing for several passes changes no job; afterwards everything reconciles.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from orchkit import wait_for
from slurmkit import SIGNALLED, STATE, SlurmKit, cluster_up, events, node_idle, phases, run

from orchestrator import protocol
from orchestrator.backends.base import AttemptRef, Phase
from orchestrator.backends.slurm import SlurmBackend, warning_lead_s
from orchestrator.decide.classify import classify
from orchestrator.protocol import read_exit

ABSENT = protocol.Verification(protocol.MarkerStatus.ABSENT, "no done.json")

TRAINER = [sys.executable, "-m", "orch_trainer", "--preset", "tiny", "--threads", "1", "--log-interval", "100",
           "--heartbeat-interval", "0.5"]
DONE = "done_marker_verified"
BAD = {"failed", "cancelled"}


def settled(rows: dict[str, dict]) -> bool:
    return all(r["state"] in {DONE} | BAD for r in rows.values())


@pytest.fixture
def slurm_cleanup(orch):
    """Cancel every Slurm job this test's orch home started (and the prio jobs it added)."""
    extra: list[str] = []
    yield extra
    ids = list(extra)
    try:
        for row in orch.json("status"):
            for a in orch.show(row["name"])["attempts"]:
                if a.get("external_id"):
                    ids.append(a["external_id"])
    except Exception:  # cleanup must not hide the test's own failure
        pass
    if ids:
        run("scancel", *ids)


def submit(orch, name: str, *opts: str, steps: int, save: int = 50) -> None:
    """``opts`` before a "--" go to orch submit, after it to the trainer."""
    cut = opts.index("--") if "--" in opts else len(opts)
    p = orch("submit", "--backend", "slurm", "--name", name, "--cpus-per-task", "1", *opts[:cut], "--",
             *TRAINER, "--max-steps", str(steps), "--save-interval", str(save), *opts[cut + 1:])
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.match(rf"submitted {name} \(slurm \d+\)", p.stdout), p.stdout


def statuses(orch) -> dict[str, dict]:
    return {r["name"]: r for r in orch.json("status")}


def drive(orch, names: list[str], until, timeout: float, log: list, every: float = 1.0) -> dict[str, dict]:
    """Reconcile (as cron would) until ``until(status rows)``; keep every pass's states in ``log``."""
    t0 = time.monotonic()

    def passed() -> dict[str, dict] | None:
        orch("reconcile", check=True)
        rows = statuses(orch)
        log.append((round(time.monotonic() - t0, 1), {n: (rows[n]["state"], rows[n]["attempts"],
                                                          rows[n]["external_id"], rows[n]["restarts"])
                                                      for n in names}))
        return rows if until(rows) else None

    return wait_for(passed, timeout, f"{names} to reach the states asked for", interval=every,
                    detail=lambda: "\n" + "\n".join(map(str, log[-30:])) + "\n" +
                    "\n".join(json.dumps(orch.show(n)) for n in names))


def step_of(run_dir: Path, attempt: int) -> int:
    p = protocol.read_progress(run_dir, attempt) or {}
    return int(p.get("step") or 0)


def resumed_from(run_dir: Path) -> int | None:
    return json.loads((run_dir / protocol.RUN_CONFIG).read_text())["resumed_from_step"]


def assert_lost_at_most_one_step(report: dict, resumed: int | None) -> None:
    """The checkpoint written on the signal is the last completed step and the resume starts there:
    no completed step is redone; only the step in flight (its partial accumulation) is discarded."""
    assert report["class"] == "preempted", report
    assert report["checkpoint"] == f"checkpoints/{protocol.checkpoint_name(report['step'])}", report
    assert resumed == report["step"], (report, resumed)


def test_e2e_preemption_spot_requeues_in_place_spot_cancel_requeues_by_orch(orch, slurm_cleanup) -> None:
    steps = 800
    node_idle()
    # Preemption reached the trainers 13-22 s after the prio job's submission. The trainer's own speed
    # varies ~3x with load (21-54 steps/s), so 4000 steps were run to outlast it, 75-190 s per job; with 0.05 s
    # slept per step, 800 steps take at least 40 s at any speed (stopped at step ~330, 22 s after the prio job).
    # (A job ending after its grace but before Slurm acted was recorded TIMEOUT 0:0 although it exited 0.)
    submit(orch, "pre-spot", "--partition", "spot", "--", "--sleep-per-step", "0.05", steps=steps)
    submit(orch, "pre-cancel", "--partition", "spot-cancel", "--", "--sleep-per-step", "0.05", steps=steps)
    spot, cancel = orch.runs / "pre-spot", orch.runs / "pre-cancel"
    log: list = []
    drive(orch, ["pre-spot", "pre-cancel"], lambda r: step_of(spot, 1) >= 20 and step_of(cancel, 1) >= 20,
          timeout=90, log=log)
    ids = {n: r["external_id"] for n, r in statuses(orch).items()}
    t_prio = time.time()
    p = run("sbatch", "--parsable", "-p", "prio", "-c", "2", "--mem=200M", "-o", "/dev/null",
            "--wrap", "sleep 2")  # needs both cores: preempts both trainers
    assert p.returncode == 0, p.stderr
    slurm_cleanup.append(p.stdout.strip())
    # What the backend answers for the spot job at every pass (this test also holds the backend-level claims of
    # the former test_backend_slurm preemption test, to save CI time): never EXITED before the rerun.
    a = orch.show("pre-spot")["attempts"][0]
    spot_ref, backend, answers = AttemptRef(ids["pre-spot"], a["token"], spot, 1), SlurmBackend(), []

    def settled_watching(r: dict) -> bool:
        o = backend.poll([spot_ref]).get(spot_ref.token)
        if o is not None:
            answers.append((o.phase.value, o.backend_state, o.restart_count))
        return settled(r)

    rows = drive(orch, ["pre-spot", "pre-cancel"], settled_watching, timeout=480, log=log)

    # spot: requeued in place by Slurm — one orch attempt, same Slurm id, never a failed state
    assert rows["pre-spot"]["state"] == DONE, log
    spot_states = [entry[1]["pre-spot"] for entry in log]
    assert not {s[0] for s in spot_states} & (BAD | {"retryable_failed"}), spot_states
    assert {s[1] for s in spot_states} == {1} and {s[2] for s in spot_states} == {ids["pre-spot"]}
    show = orch.show("pre-spot")
    assert (spot / "attempts" / "1" / "failure.prev-1.json").exists(), f"pre-spot was never preempted: {show}"
    assert len(show["attempts"]) == 1
    a1 = show["attempts"][0]
    assert (a1["state"], a1["restarts"], a1["external_id"]) == ("succeeded", 1, ids["pre-spot"])
    first_run = json.loads((spot / "attempts" / "1" / "failure.prev-1.json").read_text())
    assert first_run["step"] < steps  # it really was stopped before the end
    assert_lost_at_most_one_step(first_run, resumed_from(spot))
    assert not [x for x in answers if x[0] == "exited" and x[2] == 0], answers  # no EXITED before the rerun
    assert any(x[0] in ("pending", "running") and x[2] == 1 for x in answers), answers  # the rerun, seen live
    assert json.loads((spot / "attempts" / "1" / "exit.prev-1.json").read_text())["returncode"] == 143
    dup = run("sacct", "-X", "-n", "-P", "--duplicates", "-j", ids["pre-spot"], "-o", "State").stdout.split()
    assert dup == ["PREEMPTED", "COMPLETED"], dup

    # spot-cancel: the Slurm job ends PREEMPTED; orch classifies, requeues, attempt 2 resumes
    assert rows["pre-cancel"]["state"] == DONE, log
    show = orch.show("pre-cancel")
    assert [a["state"] for a in show["attempts"]] == ["failed", "succeeded"]
    b1 = show["attempts"][0]
    assert b1["failure_class"] == "preempted" and b1["action"]["auto"] is True, b1
    assert b1["external_id"] == ids["pre-cancel"] and show["attempts"][1]["external_id"] != ids["pre-cancel"]
    report = protocol.read_failure(cancel, 1)
    assert_lost_at_most_one_step(report, resumed_from(cancel))
    sacct = run("sacct", "-X", "-n", "-P", "-j", ids["pre-cancel"], "-o", "State").stdout.split()
    assert sacct == ["PREEMPTED"]

    # Honest counts: the in-place requeue is a preemption too, in show and in metrics, measured.
    assert orch.show("pre-spot")["preemptions"] == {"total": 1, "in_place": 1}
    # ... by the scheduler's own account too (sacct -D's PREEMPTED record of the earlier run, which
    # reconcile keeps; a NODE_FAIL there would read node_fail, tests/slurm/test_node_fail_and_oom.py).
    a1 = orch.show("pre-spot")["attempts"][0]
    assert protocol.read_restart_causes(spot / "attempts" / "1", a1["token"]) == ["preempted"], a1
    assert [h["class"] for h in a1["restart_history"]] == ["preempted"], a1
    assert orch.show("pre-cancel")["preemptions"] == {"total": 1, "in_place": 0}
    metrics = orch("metrics", check=True).stdout
    assert 'orch_attempt_failures{class="preempted"} 2' in metrics, metrics
    assert "orch_preemption_steps_redone_count 2" in metrics and "orch_preemptions_unmeasured 0" in metrics, metrics
    for name in ("pre-spot", "pre-cancel"):
        v = orch("verify", name)
        assert (v.returncode, v.stdout) == (0, "VERIFIED\n")
    # `orch status` names the Slurm job of the latest attempt, which carries that attempt's token
    for name, row in statuses(orch).items():
        token = orch.show(name)["attempts"][-1]["token"]
        job_name = run("sacct", "-X", "-n", "-P", "-j", row["external_id"], "-o", "JobName").stdout.split()
        assert job_name[-1] == f"orch-{token}", (name, job_name)
    t_sig = protocol.read_failure(cancel, 1)["at"]
    print(f"\n[measured] prio submitted {time.strftime('%T', time.localtime(t_prio))}; spot job stopped at "
          f"step {first_run['step']} ({first_run['at']}), spot-cancel at step {report['step']} ({t_sig}); "
          f"both verified {log[-1][0]:.0f} s after the start of driving")


def test_time_limit_warns_first_checkpoints_resumes_and_a_program_that_ignores_it_times_out(
        orch, slurm_cleanup, slurm: SlurmKit, script) -> None:
    """THE Slurm time-limit test (to save CI time: a backend test and an e2e test each waited out a
    limit). Two jobs share one 60 s limit window on the node's two cores:

    - through orch, the bundled trainer with the default warning (TERM, for every program since no
      program is recognised from its argv): warned before the limit, it checkpoints and exits 143; the
      wrapper records the warning; attempt 1 is classified timeout/preempted, uncounted, requeued, and
      attempt 2 resumes from exactly that checkpoint (the run is far too long to finish inside the limit:
      the trainer's speed varies ~8x with load, so the job is cancelled once attempt 2 has resumed);
    - through the backend, a program that opted into USR2 (as a program may) but ignores it: it gets
      USR2, then the limit's TERM, and Slurm ends it TIMEOUT.
    """
    submit(orch, "tl", "--time", "1", "--mem", "1G", steps=10**6, save=100)
    stubborn = slurm.submit(slurm.spec("stubborn", script("signalled", SIGNALLED), time_s=60,
                                       env={"IGNORE_SIGNALS": "SIGUSR2"}, warning_signal="USR2"))
    run_dir = orch.runs / "tl"

    def attempt2_logs() -> str:
        d = run_dir / "attempts" / "2"
        return "".join((d / f).read_text() for f in ("stdout.log", "stderr.log") if (d / f).exists())

    log: list = []
    rows = drive(orch, ["tl"], lambda r: r["tl"]["state"] in BAD
                 or (r["tl"]["attempts"] >= 2 and "resumed from" in attempt2_logs()), timeout=240, log=log)
    assert rows["tl"]["state"] not in BAD, log
    a1 = orch.show("tl")["attempts"][0]
    # The trainer checkpointed on the warning and exited before the limit (Slurm says FAILED, the report
    # says preempted or timeout); either class is resumed, neither counts against --max-attempts.
    assert a1["failure_class"] in {"preempted", "timeout"} and a1["action"]["auto"] is True, a1
    assert a1["counted"] is False, a1
    # 22.05's sacct shows a batch exit status of 143 as ExitCode 15:0: the wrapper's exit.json keeps the
    # real 143, and that it delivered the time-limit warning.
    assert a1["backend_state"] == "FAILED", a1
    rec = read_exit(protocol.attempt_dir(run_dir, 1))
    assert (rec.returncode, rec.stop_signal, rec.stop_source) == (143, "TERM", "warning"), rec
    report = protocol.read_failure(run_dir, 1)
    assert "TERM" in report["detail"] and report["step"] > 0, report
    # the next attempt resumed from exactly the checkpoint this one wrote on the warning
    resumed_line = f"resumed from {protocol.checkpoint_name(report['step'])} (step {report['step']})"
    assert resumed_line in attempt2_logs(), attempt2_logs()[-2000:]
    assert_lost_at_most_one_step(report, resumed_from(run_dir))

    out = slurm.poll_until([stubborn], lambda o: phases(o, stubborn) == (Phase.EXITED,), timeout=120, every=2)
    assert [e["sig"] for e in events(stubborn.run_dir) if e["event"] == "signal"] == ["SIGUSR2", "SIGTERM"]
    assert out[stubborn.token].backend_state == "TIMEOUT", out[stubborn.token]
    assert classify(out[stubborn.token], None, ABSENT).cls == "timeout"
    print(f"\n[measured] time limit: attempt 1 {a1['backend_state']} exit {a1['exit_code']} class "
          f"{a1['failure_class']} step {a1['failure_step']} (lead {warning_lead_s(60)} s); stubborn job: "
          f"{out[stubborn.token]}")


def test_e2e_memory_limit_is_oom_and_the_retry_gets_more_memory(orch, slurm_cleanup) -> None:
    # The trainer's RSS is ~300 MB: 200M is exceeded at once; the policy doubles it for attempt 2. The dev
    # cluster enforces --mem with the job's memory cgroup (task/cgroup): the kernel kills the trainer as it
    # allocates, and sacct says OUT_OF_MEMORY. (An earlier flake came from the accounting poller's 2 s samples,
    # which a short run could outlast; only orch's wrapper writes the marker now, after an exit 0.)
    submit(orch, "mem", "--mem", "200M", steps=400, save=100)
    log: list = []
    rows = drive(orch, ["mem"], lambda r: r["mem"]["state"] in {DONE} | BAD
                 or (r["mem"]["attempts"] >= 2 and r["mem"]["state"] == "retryable_failed"),
                 timeout=180, log=log)
    show = orch.show("mem")
    a1 = show["attempts"][0]
    assert a1["failure_class"] == "oom", show
    assert (a1["backend_state"], a1["detail"]) == ("OUT_OF_MEMORY", "scheduler state OUT_OF_MEMORY"), a1
    assert rows["mem"]["state"] == DONE, log
    sub = json.loads((orch.runs / "mem" / "attempts" / "2" / "slurm" / "submitted.json").read_text())
    assert "--mem=400M" in sub["sbatch"], sub


def test_e2e_sacct_failing_changes_no_job_then_everything_reconciles(orch, slurm_cleanup) -> None:
    submit(orch, "outage-a", "--mem", "1G", steps=150)
    submit(orch, "outage-b", "--mem", "1G", steps=150)
    log: list = []
    drive(orch, ["outage-a", "outage-b"], lambda r: all(x["state"] == "running" for x in r.values()),
          timeout=90, log=log)
    pid = int((STATE / "run" / "slurmdbd.pid").read_text())
    try:
        run("kill", str(pid))
        time.sleep(1)
        down = run("sacct", "-X", "-n", "-j", "1")  # the outage is real: sacct cannot reach slurmdbd
        assert down.returncode == 1 and "database" in (down.stderr + down.stdout).lower(), down
        t0, passes = time.time(), 0

        def both_finished() -> bool:
            return all((orch.runs / n / "done.json").exists() for n in ("outage-a", "outage-b"))

        # At least 5 passes, and on until both trainers have finished during the outage (how long
        # that takes depends on the machine's load).
        while passes < 5 or (not both_finished() and time.time() - t0 < 120):
            orch("reconcile", check=True)
            passes += 1
            for name, row in statuses(orch).items():
                assert row["state"] in {"running", "submitted"}, (name, row)
            time.sleep(2)
        assert both_finished()
        # The backend's own answer once the jobs are gone from squeue (the former backend-level outage test):
        # sacct cannot say how they ended, so UNKNOWN, never EXITED.
        refs = [AttemptRef(a["external_id"], a["token"], orch.runs / n, a["n"])
                for n in ("outage-a", "outage-b") for a in orch.show(n)["attempts"][-1:]]
        t1 = time.time()
        while run("squeue", "-h", "-j", ",".join(r.external_id for r in refs), "-o", "%i").stdout.strip():
            assert time.time() - t1 < 60, run("squeue").stdout
            time.sleep(1)
        out = SlurmBackend().poll(refs)
        assert {out[r.token].phase for r in refs} == {Phase.UNKNOWN}, out
        assert all("sacct failed" in out[r.token].reason for r in refs), out
        orch("reconcile", check=True)  # and a pass after that still changes nothing
        for name, row in statuses(orch).items():
            assert row["state"] in {"running", "submitted"}, (name, row)
    finally:
        p = cluster_up()
        assert p.returncode == 0, p.stdout + p.stderr
    rows = drive(orch, ["outage-a", "outage-b"], settled, timeout=120, log=log)
    assert {r["state"] for r in rows.values()} == {DONE}, log
    assert all(len(orch.show(n)["attempts"]) == 1 for n in rows)


def test_submission_slurm_refuses_fails_the_job_instead_of_retrying_forever(orch, slurm_cleanup):
    # sbatch answers "invalid partition specified": no retry can help, so the job is failed at once
    # (a transient sbatch failure, by contrast, leaves the attempt pending for the next pass).
    p = orch("submit", "--backend", "slurm", "--name", "nopart", "--partition", "no-such-partition", "--",
             "true")
    assert p.returncode == 3, p.stdout + p.stderr
    assert "sbatch refused the job" in p.stderr and "partition" in p.stderr.lower()
    job = orch.show("nopart")
    assert job["state"] == "failed"
    assert [(a["state"], a["failure_class"]) for a in job["attempts"]] == [("failed", "invalid")]
    orch("reconcile", check=True)
    assert orch.show("nopart")["attempts"][-1]["state"] == "failed" and len(orch.show("nopart")["attempts"]) == 1
