"""Multi-rank jobs on the local backend: ``orch submit --nproc-per-node 2`` starts the program once per
rank through ``torchrun --standalone``; every rank sees torchrun's environment; ``orch cancel`` stops every rank
(none is left in the process table, although torchrun starts each in a session of its own); the attempt ends
stopped, and ``orch requeue`` resumes it from the checkpoint the stop wrote, 0 steps redone, verified.
"""

from __future__ import annotations

import json
import os
import sys

from orchkit import wait_for
from rankkit import GLOO_ENV, TORCHRUN_ENV, cmdline_of, rank_envs, rank_program, steps_done, token_carriers

from orchestrator import protocol

DONE = {"done_marker_verified"}


def test_two_ranks_see_torchrun_env_cancel_stops_every_rank_requeue_resumes_verified(orch, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    prog = rank_program(tmp_path)
    p = orch("submit", "--name", "mr", "--nproc-per-node", "2", "--", sys.executable, str(prog),
             "--max-steps", "60", "--sleep", "0.1", "--log-dir", str(logs), env=GLOO_ENV)
    assert p.returncode == 0, p.stdout + p.stderr
    run_dir = orch.runs / "mr"
    token = orch.show("mr")["attempts"][0]["token"]

    envs = wait_for(lambda: len(e := rank_envs(logs, 1)) == 2 and e, 60, "both ranks' environments")
    for rank, env in envs.items():
        assert all(env[k] for k in TORCHRUN_ENV), env
        assert (int(env["RANK"]), env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["world"]) == (rank, "2", "2", 2)
        assert int(env["LOCAL_RANK"]) == rank
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    # torchrun is told the job's grace, not its own fixed 30 s, between SIGTERM and SIGKILL of the ranks
    torchrun = cmdline_of(token_carriers(token), "torch.distributed.run")
    assert torchrun is not None and torchrun[torchrun.index("--shutdown-timeout") + 1] == "60", torchrun
    assert "--standalone" in torchrun and torchrun[torchrun.index("--nproc-per-node") + 1] == "2"
    # torchrun's own files stay in the attempt's dir (a /tmp/torchelastic_* dir per attempt was left behind)
    log_dir = run_dir / "attempts" / "1" / "torchrun"
    assert torchrun[torchrun.index("--log-dir") + 1] == str(log_dir), torchrun
    assert log_dir.is_dir()
    orch("reconcile", check=True)
    live = orch.show("mr")["attempts"][0]  # while it runs: from the wrapper's record of this attempt
    assert (live["state"], live["world_size"], live["nodes"]) == ("running", 2, os.uname().nodename), live

    wait_for(lambda: len(steps_done(logs, 1)) >= 5, 60, "rank 1 at step 5")
    assert orch("cancel", "mr").returncode == 0
    a1 = wait_for(lambda: (a := orch("reconcile") and orch.show("mr")["attempts"][0])["state"] != "stopping"
                  and a["state"] != "running" and a, 60, "attempt 1 to end")
    # Every rank stopped: nothing that carries the attempt's token is left, whatever its session.
    left = token_carriers(token)
    assert not left, [(q.pid, q.cmdline()) for q in left]
    for env in envs.values():
        assert not _alive(env["pid"]), env
    assert (a1["state"], a1["failure_class"]) == ("cancelled", "cancelled"), a1
    rec = protocol.read_exit(run_dir / "attempts" / "1", token)
    assert rec is not None and rec.stop_signal == "TERM", rec
    assert (a1["world_size"], a1["nodes"]) == (2, os.uname().nodename), a1
    stopped_at = protocol.read_failure(run_dir, 1)
    assert stopped_at["class"] == "preempted", stopped_at  # the kit's own record: checkpointed at the stop

    p = orch("requeue", "mr")
    assert p.returncode == 0, p.stdout + p.stderr
    assert orch.wait("mr", DONE, timeout=120) in DONE
    for rank in (0, 1):
        steps = [s for _a, s in steps_done(logs, rank)]
        assert steps == list(range(1, 61)), (rank, steps)  # 0 steps redone, none skipped, on every rank
    show = orch.show("mr")
    assert [a["state"] for a in show["attempts"]] == ["cancelled", "succeeded"]
    assert show["attempts"][1]["world_size"] == 2
    assert rank_envs(logs, 2).keys() == {0, 1}
    assert orch("verify", "mr").stdout == "VERIFIED\n"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_ranks_orphaned_by_torchrun_death_are_stopped_with_the_attempt(orch, tmp_path):
    """torchrun starts each rank in a session of its own: SIGKILL torchrun and the ranks would run on as
    orphans beside the next attempt. The wrapper stops every process carrying the attempt's token."""
    logs = tmp_path / "logs"
    logs.mkdir()
    prog = rank_program(tmp_path)
    orch("submit", "--name", "orph", "--nproc-per-node", "2", "--max-attempts", "1", "--", sys.executable,
         str(prog), "--max-steps", "100000", "--sleep", "0.05", "--log-dir", str(logs), env=GLOO_ENV, check=True)
    token = orch.show("orph")["attempts"][0]["token"]
    envs = wait_for(lambda: len(e := rank_envs(logs, 1)) == 2 and e, 60, "both ranks' environments")
    assert {e["sid"] for e in envs.values()} != {None} and len({e["sid"] for e in envs.values()}) == 2
    carriers = token_carriers(token)
    torchrun = [q for q in carriers if "torch.distributed.run" in q.cmdline()]
    assert len(torchrun) == 1
    torchrun[0].kill()
    a1 = wait_for(lambda: (a := orch("reconcile") and orch.show("orph")["attempts"][0])["state"]
                  not in ("running", "submitted", "stopping") and a, 60, "attempt 1 to end")
    assert a1["state"] == "failed", a1
    assert not token_carriers(token)
    for env in envs.values():
        assert not _alive(env["pid"]), env


def test_local_kill_reaches_ranks_outside_the_session(tmp_path):
    """LocalBackend.kill (a stop past its grace) SIGKILLs the attempt's session AND what left it carrying the
    token (a torchrun worker): with only the session killed, such a process lived on."""
    from orchestrator.backends.base import AttemptRef, SubmitSpec
    from orchestrator.backends.local import LocalBackend

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    token = "tok-" + os.urandom(4).hex()
    # a process in a new session (as torchrun starts its workers), then the program itself waits
    spec = SubmitSpec(job="k", attempt=1, token=token, run_dir=run_dir,
                      command=("bash", "-c", "setsid sleep 300 & sleep 300"))
    backend = LocalBackend()
    ext = backend.submit(spec)
    wait_for(lambda: any(q.cmdline()[:1] == ["sleep"] and os.getsid(q.pid) == q.pid for q in token_carriers(token)),
             30, "the process that left the session")
    backend.kill([AttemptRef(ext, token, run_dir, 1)])
    wait_for(lambda: not token_carriers(token), 30, "every process of the attempt to be gone")


def test_ranks_left_by_a_killed_wrapper_and_torchrun_keep_the_attempt_alive_and_cancel_stops_them(orch, tmp_path):
    """kill -9 of the wrapper AND torchrun leaves the ranks (sessions of their own) training: the attempt is
    alive while a process carrying its token runs, and `orch cancel` reaches them (hostile test: the attempt was
    called gone, `orch cancel` said cancelled and both ranks trained on)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    prog = rank_program(tmp_path)
    orch("submit", "--name", "left", "--nproc-per-node", "2", "--", sys.executable, str(prog),
         "--max-steps", "100000", "--sleep", "0.05", "--log-dir", str(logs), env=GLOO_ENV, check=True)
    token = orch.show("left")["attempts"][0]["token"]
    envs = wait_for(lambda: len(e := rank_envs(logs, 1)) == 2 and e, 60, "both ranks' environments")
    ranks = {e["pid"] for e in envs.values()}
    try:
        carriers = token_carriers(token)
        for q in carriers:  # everything of the attempt but the ranks: the wrapper, torchrun
            if q.pid not in ranks:
                q.kill()
        wait_for(lambda: {q.pid for q in token_carriers(token)} == ranks, 30, "only the ranks left")
        assert orch("reconcile").returncode == 0
        a = orch.show("left")["attempts"][0]
        assert a["state"] == "running" and orch.state("left") == "running", a
        p = orch("cancel", "left")
        assert p.returncode == 0, p.stderr
        wait_for(lambda: not token_carriers(token), 60, "the ranks to stop")
        a = wait_for(lambda: (x := orch("reconcile") and orch.show("left")["attempts"][0])["state"]
                     not in ("running", "stopping") and x, 60, "attempt 1 to end")
        assert a["state"] == "cancelled" and orch.state("left") == "cancelled", a
    finally:
        for q in token_carriers(token):
            q.kill()


def test_the_bundled_trainer_refuses_a_fault_drill_on_two_ranks_as_invalid_before_writing(orch):
    """The bundled trainer runs DDP over several ranks (tests/trainer/test_trainer_ddp.py), but a combination it
    does not support there is refused before the process group or any checkpoint exists: `--inject-fault` (one
    fault file per run dir: two ranks raced on it, and a SIGTERM fault stopped one rank alone). invalid, exit 2
    from the CLI's view of the job, said in one line."""
    p = orch("submit", "--name", "t2", "--nproc-per-node", "2", "--wait", "--", sys.executable, "-m", "orch_trainer",
             "--preset", "tiny", "--max-steps", "20", "--batch-size", "8", "--micro-batch-size", "2",
             "--inject-fault", "sigterm@step=3", env=GLOO_ENV)
    assert p.returncode == 4, p.stdout + p.stderr  # submit --wait: ended without a verified marker
    a = orch.show("t2")["attempts"][0]
    assert (orch.state("t2"), a["failure_class"]) == ("failed", "invalid"), a
    assert "--inject-fault is not supported with WORLD_SIZE=2 (it is a one-process drill)" in a["detail"], a
    assert "\n" not in a["detail"].strip(), a
    run_dir = orch.runs / "t2"
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())
    assert not (run_dir / protocol.RUN_CONFIG).exists()  # refused before the model: nothing of the run written


def test_the_readmes_two_rank_trainer_command_runs_as_written_and_verifies(orch):
    """`orch submit --nproc-per-node 2 -- python -m orch_trainer --preset tiny` was `invalid` at once:
    the default micro-batch was the whole global batch on each rank. It now splits the batch over the ranks."""
    p = orch("submit", "--name", "ddp", "--nproc-per-node", "2", "--wait", "--", sys.executable, "-m", "orch_trainer",
             "--preset", "tiny", env=GLOO_ENV, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    (a,) = orch.show("ddp")["attempts"]
    assert (a["state"], a["world_size"]) == ("succeeded", 2), a
    metrics = json.loads((orch.runs / "ddp" / "result" / "metrics.json").read_text())
    assert (metrics["batch_size"], metrics["micro_batch_size"]) == (8, 4), metrics


def test_a_rank_that_would_abort_while_the_interpreter_finalizes_never_turns_a_completed_run_into_a_crash(orch):
    """A 2-rank run completed, then one rank aborted in interpreter finalization ("terminate called without an
    active exception": gloo's threads torn down); torchrun exited 1 and the finished run was a `crash` waiting for
    a person. Each rank now ends without finalizing once its attempt returned; the fault aborts every rank that
    does finalize."""
    env = {**GLOO_ENV, "ORCH_FAULT": "trainer_exit"}
    p = orch("submit", "--name", "fin", "--nproc-per-node", "2", "--wait", "--", sys.executable, "-m", "orch_trainer",
             "--preset", "tiny", "--max-steps", "4", env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    (a,) = orch.show("fin")["attempts"]
    assert (a["state"], a["exit_code"], a["world_size"]) == ("succeeded", 0, 2), a
