"""SlurmBackend against the real dev cluster: what Slurm 22.05 does, and what poll() says about it.

Each test submits orch wrapper jobs running small Python programs, so the claims are about real
sbatch, real signals, real preemption, real sacct/squeue — the numbers in deploy/slurm/README.md
come from these runs.
"""

from __future__ import annotations

import json
import time

from slurmkit import SIGNALLED, STATE, SlurmKit, cluster_up, events, node_idle, phases, run, wait_started

from orchestrator import protocol
from orchestrator.backends.base import Phase
from orchestrator.classify import classify
from orchestrator.protocol import read_exit

ABSENT = protocol.Verification(protocol.MarkerStatus.ABSENT, "no done.json")

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
