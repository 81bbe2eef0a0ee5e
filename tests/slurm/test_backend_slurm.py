"""SlurmBackend against the real dev cluster: what Slurm 22.05 does, and what poll() says about it.

Each test submits orch wrapper jobs running small Python programs, so the claims are about real
sbatch, real signals, real sacct/squeue. What the backend answers under a real preemption, a time limit
and an sacct outage is asserted inside the orch-level tests of test_e2e_slurm.py, which wait out the same
scheduler events once (to save CI time); a cgroup OOM kill and a node failure are in
test_node_fail_and_oom.py.
"""

from __future__ import annotations

from slurmkit import SIGNALLED, SlurmKit, events, phases, run, wait_started

from orchestrator.backends.base import Phase
from orchestrator.protocol import read_exit


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


def test_cancel_sends_sigterm_and_ends_cancelled(slurm: SlurmKit, script) -> None:
    r = slurm.submit(slurm.spec("cancelme", script("signalled", SIGNALLED)))
    wait_started(r.run_dir)
    slurm.backend.cancel([r])
    out = slurm.poll_until([r], lambda o: phases(o, r) == (Phase.EXITED,), timeout=60)
    assert out[r.token].backend_state == "CANCELLED"
    assert [e["sig"] for e in events(r.run_dir) if e["event"] == "signal"] == ["SIGTERM"]
    slurm.backend.cancel([r])  # cancelling an ended job is not an error
