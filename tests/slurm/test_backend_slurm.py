"""SlurmBackend against the real dev cluster: what Slurm 22.05 does, and what poll() says about it.

Each test submits orch wrapper jobs running small Python programs, so the claims are about real
sbatch, real signals, real preemption, real sacct/squeue — the numbers in deploy/slurm/README.md
come from these runs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from slurmkit import STATE, SlurmKit, cluster_up, node_idle, phases, run

from orchestrator import protocol
from orchestrator.backends.base import Phase
from orchestrator.backends.slurm import warning_lead_s
from orchestrator.classify import classify
from orchestrator.protocol import read_exit

ABSENT = protocol.Verification(protocol.MarkerStatus.ABSENT, "no done.json")

# A program that records its runs and the signals it gets in events.jsonl (in its run dir, its cwd).
# First run (SLURM_RESTART_COUNT unset or 0): waits for a signal, then exits 143 (what a trainer does
# after checkpointing). A rerun after an in-place requeue: exits 0 at once.
SIGNALLED = r'''
import json, os, signal, sys, time
RESTART = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
IGNORE = os.environ.get("IGNORE_SIGNALS", "").split(",")
def log(**kw):
    with open("events.jsonl", "a") as f:
        f.write(json.dumps({"t": time.time(), "restart": RESTART, **kw}) + "\n")
def handler(signum, _frame):
    log(event="signal", sig=signal.Signals(signum).name)
    if signal.Signals(signum).name not in IGNORE:
        # Slurm signals every process of the job and orch's wrapper forwards the same signal: a
        # second SIGTERM during interpreter shutdown would kill us by the signal instead of exit 143.
        for s in (signal.SIGTERM, signal.SIGUSR2):
            signal.signal(s, signal.SIG_IGN)
        sys.exit(143)
for s in (signal.SIGTERM, signal.SIGUSR2):
    signal.signal(s, handler)
log(event="start", job=os.environ.get("SLURM_JOB_ID"), attempt=os.environ.get("ORCH_ATTEMPT"))
if RESTART > 0:
    sys.exit(0)
for _ in range(600):
    time.sleep(0.5)
'''


def events(run_dir: Path) -> list[dict]:
    p = run_dir / "events.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def wait_started(run_dir: Path, timeout: float = 60) -> dict:
    t0 = time.time()
    while time.time() - t0 < timeout:
        ev = [e for e in events(run_dir) if e["event"] == "start"]
        if ev:
            return ev[0]
        time.sleep(0.3)
    raise AssertionError(f"{run_dir.name} did not start: {run('squeue').stdout}")


def test_exit_codes_env_and_find_by_token(slurm: SlurmKit, script) -> None:
    prog = script("envcheck", "import os, sys; open('foo.txt', 'w').write(os.environ['FOO']); "
                  "sys.exit(int(os.environ['RC']))")
    hostile = "bar baz\n#SBATCH --partition=prio\n$(echo no)"
    a = slurm.submit(slurm.spec("exit3", prog, env={"FOO": hostile, "RC": "3"}))
    b = slurm.submit(slurm.spec("exit0", prog, env={"FOO": "x", "RC": "0"}))
    assert slurm.backend.find_by_token([a, b]) == {a.token: a.external_id, b.token: b.external_id}
    out = slurm.poll_until([a, b], lambda o: phases(o, a, b) == (Phase.EXITED,) * 2, timeout=60)
    assert (out[a.token].backend_state, out[a.token].exit_code, out[a.token].signal) == ("FAILED", 3, None)
    assert (out[b.token].backend_state, out[b.token].exit_code) == ("COMPLETED", 0)
    # spec.env reached the program untouched, and the directive inside it stayed a value
    assert (a.run_dir / "foo.txt").read_text() == hostile
    assert run("sacct", "-X", "-n", "-P", "-j", a.external_id, "-o", "Partition").stdout.strip() == "spot"
    assert read_exit(a.attempt_dir).returncode == 3
    # a ref whose token is not the job's (a reused id) is not answered with that job's record
    stranger = type(a)(a.external_id, "someone-else", a.run_dir, 1)
    assert slurm.backend.poll([stranger])["someone-else"].phase is Phase.UNKNOWN


def test_preempted_spot_job_is_requeued_in_place_and_spot_cancel_job_ends_preempted(slurm: SlurmKit,
                                                                                   script) -> None:
    node_idle()
    prog = script("signalled", SIGNALLED)
    req = slurm.submit(slurm.spec("on-spot", prog, partition="spot"))
    can = slurm.submit(slurm.spec("on-spot-cancel", prog, partition="spot-cancel"))
    wait_started(req.run_dir)
    wait_started(can.run_dir)
    t_prio = time.time()
    slurm.sbatch("-p", "prio", "-c", "2", "--mem=200M", "--wrap", "sleep 1")  # needs both cores
    history: list = []
    out = slurm.poll_until([req, can], lambda o: phases(o, req, can) == (Phase.EXITED,) * 2,
                           timeout=180, history=history)

    # REQUEUE partition: SIGTERM, exit 143, requeued in place under the same id, rerun exits 0.
    seen = [h[1][req.token] for h in history]
    first_exit = next(i for i, s in enumerate(seen) if s[0] == "exited")
    assert first_exit == len(seen) - 1, f"an EXITED answer before the rerun ended: {seen}"
    assert ("pending", "PENDING", 1) in seen or any(s[0] == "pending" and s[2] == 1 for s in seen), seen
    final = out[req.token]
    assert (final.backend_state, final.exit_code, final.restart_count) == ("COMPLETED", 0, 1)
    ev = events(req.run_dir)
    starts = [e for e in ev if e["event"] == "start"]
    assert [(e["restart"], e["job"], e["attempt"]) for e in starts] == [(0, req.external_id, "1"),
                                                                         (1, req.external_id, "1")]
    term = [e for e in ev if e["event"] == "signal"]
    assert [e["sig"] for e in term] == ["SIGTERM"]
    assert read_exit(req.attempt_dir).returncode == 0  # the rerun's record; the first one set aside
    assert json.loads((req.attempt_dir / "exit.prev-1.json").read_text())["returncode"] == 143

    # CANCEL partition: SIGTERM, then the job ends PREEMPTED, which the classifier calls preempted.
    fin = out[can.token]
    assert (fin.phase, fin.backend_state, fin.restart_count) == (Phase.EXITED, "PREEMPTED", 0)
    assert [e["sig"] for e in events(can.run_dir) if e["event"] == "signal"] == ["SIGTERM"]
    assert classify(fin, None, ABSENT).cls == "preempted"
    print(f"\n[measured] prio submitted -> SIGTERM in spot job: {term[0]['t'] - t_prio:.1f} s; "
          f"-> rerun started: {starts[1]['t'] - t_prio:.1f} s; states seen (spot): "
          f"{sorted({s[:2] for s in seen})}")


def test_time_limit_sends_the_warning_signal_first_then_timeout(slurm: SlurmKit, script) -> None:
    prog = script("signalled", SIGNALLED)
    # Any program gets the warning as SIGTERM (issue 10: a program without a USR2 handler died of
    # orch's own warning); it exits on it, and the wrapper records that it delivered the warning.
    warned = slurm.submit(slurm.spec("warned", prog, time_s=60))
    # A program that opted into SIGUSR2 (the bundled trainer does) but ignores it: it exits on the
    # time limit's SIGTERM (one that ignored that too would only add KillWait before the SIGKILL).
    stubborn = slurm.submit(slurm.spec("stubborn", prog, time_s=60, env={"IGNORE_SIGNALS": "SIGUSR2"},
                                       warning_signal="USR2"))
    out = slurm.poll_until([warned, stubborn], lambda o: phases(o, warned, stubborn) == (Phase.EXITED,) * 2,
                           timeout=200, every=2)
    w_start = wait_started(warned.run_dir)
    w_sigs = [e for e in events(warned.run_dir) if e["event"] == "signal"]
    assert [e["sig"] for e in w_sigs] == ["SIGTERM"] and w_sigs[0]["t"] - w_start["t"] < 60
    # 22.05's sacct shows a batch exit status of 143 as ExitCode 15:0 (137 as 9:0): the wrapper's
    # exit.json keeps the real 143, and that it was the time-limit warning.
    assert (out[warned.token].backend_state, out[warned.token].exit_code) == ("FAILED", 15)
    rec = read_exit(warned.attempt_dir)
    assert (rec.returncode, rec.stop_signal, rec.stop_source) == (143, "TERM", "warning")
    assert classify(out[warned.token], None, ABSENT, exit_record=rec).cls == "timeout"
    s_sigs = [e["sig"] for e in events(stubborn.run_dir) if e["event"] == "signal"]
    assert s_sigs == ["SIGUSR2", "SIGTERM"]  # the warning, then the time limit's TERM
    assert out[stubborn.token].backend_state == "TIMEOUT"
    assert classify(out[stubborn.token], None, ABSENT).cls == "timeout"
    print(f"\n[measured] warning {w_sigs[0]['t'] - w_start['t']:.1f} s after start (limit 60 s, "
          f"lead {warning_lead_s(60)} s); stubborn job: {out[stubborn.token]}")


def test_memory_limit_kill_is_reported_as_out_of_memory(slurm: SlurmKit, script) -> None:
    prog = script("hog", "import time\nb = bytearray(600 * 2**20)\nfor i in range(0, len(b), 4096):\n"
                  "    b[i] = 1\ntime.sleep(60)\n")
    r = slurm.submit(slurm.spec("hog", prog, mem_mb=100))
    out = slurm.poll_until([r], lambda o: phases(o, r) == (Phase.EXITED,), timeout=90)
    oc = out[r.token]
    # Without cgroups (JobAcctGatherParams=OverMemoryKill) sacct says FAILED 0:9; the backend finds
    # slurmstepd's line in the job's Slurm output and reports OUT_OF_MEMORY.
    assert (oc.backend_state, oc.signal) == ("OUT_OF_MEMORY", 9)
    assert "exceeded memory limit" in oc.reason
    sacct = run("sacct", "-X", "-n", "-P", "-j", r.external_id, "-o", "State,ExitCode").stdout.strip()
    assert sacct == "FAILED|0:9"
    assert classify(oc, None, ABSENT).cls == "oom"


def test_cancel_sends_sigterm_and_ends_cancelled(slurm: SlurmKit, script) -> None:
    r = slurm.submit(slurm.spec("cancelme", script("signalled", SIGNALLED)))
    wait_started(r.run_dir)
    slurm.backend.cancel([r])
    out = slurm.poll_until([r], lambda o: phases(o, r) == (Phase.EXITED,), timeout=60)
    assert out[r.token].backend_state == "CANCELLED"
    assert [e["sig"] for e in events(r.run_dir) if e["event"] == "signal"] == ["SIGTERM"]
    slurm.backend.cancel([r])  # cancelling an ended job is not an error


def test_sacct_failing_gives_unknown_never_exited_then_recovers(slurm: SlurmKit, script) -> None:
    r = slurm.submit(slurm.spec("through-outage", script("short", "import time; time.sleep(6)")))
    slurm.poll_until([r], lambda o: phases(o, r) == (Phase.RUNNING,), timeout=60)
    pid = int((STATE / "run" / "slurmdbd.pid").read_text())
    try:
        run("kill", str(pid))
        time.sleep(1)
        answers = []
        t0 = time.time()
        while time.time() - t0 < 12:  # the job ends meanwhile: sacct cannot say so
            oc = slurm.backend.poll([r])[r.token]
            answers.append((oc.phase, oc.reason))
            time.sleep(1)
        assert {a[0] for a in answers} == {Phase.UNKNOWN}, answers
        assert "sacct failed" in answers[-1][1]
    finally:
        p = cluster_up()
        assert p.returncode == 0, p.stdout + p.stderr
    out = slurm.poll_until([r], lambda o: phases(o, r) == (Phase.EXITED,), timeout=90, every=1)
    assert (out[r.token].backend_state, out[r.token].exit_code) == ("COMPLETED", 0)
