"""Multi-rank jobs in the kit: real torchrun, gloo on CPU, 2 ranks, orch_run around a DDP loop.

What is proved here, with real processes and signals:

* SIGTERM to ONE rank stops every rank after the same step, with one commit holding every rank's files,
  and the resumed run ends bit-exact with an uninterrupted 2-rank run;
* a bit-flipped shard (same size) passes the controller's size check but makes the whole step unusable:
  the ranks, hashing their shares in parallel at resume, set it aside and resume from the previous step;
* kill -9 of one rank ends the others (no hang in a collective), the attempt is classified and requeued
  from the last committed step by orch alone;
* a rank whose save fails leaves no commit for that step and the previous one intact; one EIO there is
  ``storage``: retried, never counted;
* kill -9 of one rank at each commit point never leaves a verified partial step;
* 2 ranks -> 1 rank resumes the sharded state with the same effective batch and the loss curve continues.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from intkit import DONE, quiet_env, state_dicts_equal, wait_for

from orchestrator import protocol
from orchestrator.decide import policy

FORMAT = "orch-sharded-1"  # the manifest format a multi-rank commit writes

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(Path(__file__).parent / "scripts" / "mr_train.py")
PY = sys.executable


def torchrun(nproc: int, *args: str) -> list[str]:
    return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", SCRIPT, *args]


def run_direct(run_dir: Path, nproc: int, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """The program without orch (``--run-dir``), to its end or its fault."""
    argv = torchrun(nproc, *args, "--run-dir", str(run_dir)) if nproc > 1 else [PY, SCRIPT, *args, "--run-dir",
                                                                                   str(run_dir)]
    p = subprocess.run(argv, env=quiet_env({"OMP_NUM_THREADS": "1"}), capture_output=True, text=True, timeout=180)
    if ok:
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def log_lines(path: Path) -> list[tuple[int, int, int, float]]:
    """(attempt, rank, step, loss) per completed step and rank."""
    out = []
    for line in path.read_text().splitlines():
        a, r, s, loss = line.split()
        out.append((int(a), int(r), int(s), float(loss)))
    return out


def rank_pid(run_dir: Path, rank: int) -> int | None:
    """The pid of the torchrun worker with RANK=<rank> of this run dir (its environ names both)."""
    want = {f"{protocol.ENV_RUN_DIR}={run_dir}".encode(), f"RANK={rank}".encode()}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                env = set((d / "environ").read_bytes().split(b"\0"))
                if want <= env and b"mr_train.py" in (d / "cmdline").read_bytes():
                    return int(d.name)
            except OSError:
                continue
    return None


def committed(run_dir: Path) -> dict[int, Path]:
    return {protocol.checkpoint_step(p) or 0: p for p in protocol.iter_checkpoint_dirs(run_dir)}


def assert_complete_step(path: Path, world: int) -> None:
    """Verifies (every sha256), and its manifest lists every rank's files: never a partial step."""
    assert protocol.verify_checkpoint(path) is None, protocol.verify_checkpoint(path)
    m = json.loads((path / protocol.MANIFEST).read_text())
    assert m["format"] == FORMAT and m["world_size"] == world, m
    assert sorted(m["ranks"]) == [str(r) for r in range(world)], m["ranks"]
    names = set(m["files"])
    assert {"dcp/.metadata", "state.pt"} <= names, names
    for r in range(world):
        assert f"rank-{r:05d}/rng.pt" in names and f"dcp/__{r}_0.distcp" in names, names


def test_sigterm_to_one_rank_stops_all_at_one_step_with_one_commit_and_resumes_bit_exact(orch, tmp_path):
    log = tmp_path / "steps.log"
    # 40 steps of >= 0.1 s: the signal, sent once rank 1 is past step 4, lands well before the last step (with
    # 20 x 50 ms and a reconcile in each poll, a loaded CI machine stopped it at step 20: no step left to resume).
    args = ["--max-steps", "40", "--sleep-per-step", "0.1"]
    orch("submit", "--name", "mr", "--", *torchrun(2, *args, "--step-log", str(log)),
         env={"OMP_NUM_THREADS": "1"}, check=True)
    run_dir = orch.runs / "mr"

    def rank1_past_step_4() -> int | None:
        if log.exists() and any(r == 1 and s > 4 for _a, r, s, _l in log_lines(log)):
            return rank_pid(run_dir, 1)
        return None

    os.kill(wait_for(rank1_past_step_4, 120, "rank 1 past step 4", interval=0.02), signal.SIGTERM)  # rank 1 ONLY
    assert orch.wait("mr", {DONE, "failed", "cancelled"}, timeout=180) == DONE, orch.show("mr")
    first = orch.show("mr")["attempts"][0]
    assert first["failure_class"] == "preempted", first
    report = json.loads((protocol.attempt_dir(run_dir, 1) / protocol.FAILURE_FILE).read_text())
    stop = report["step"]
    lines = log_lines(log)
    # Every rank ended attempt 1 after the same step, the one committed; attempt 2 started right after it.
    assert {max(s for a, r, s, _l in lines if a == 1 and r == rank) for rank in (0, 1)} == {stop}, lines
    assert {min(s for a, r, s, _l in lines if a == 2 and r == rank) for rank in (0, 1)} == {stop + 1}, lines
    assert report["checkpoint"] == f"checkpoints/{protocol.checkpoint_name(stop)}"
    assert_complete_step(committed(run_dir)[stop], 2)
    assert orch("verify", "mr").stdout == "VERIFIED\n"
    ref = tmp_path / "ref"
    run_direct(ref, 2, *args[:2])
    assert state_dicts_equal(torch.load(run_dir / "result" / "model.pt"), torch.load(ref / "result" / "model.pt"))


def test_a_bit_flipped_shard_passes_the_size_check_but_the_ranks_resume_from_the_previous_step(tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "steps.log"
    # 10 steps: the final step is a periodic one, so the previous commit (5) is still kept (keep_last 2).
    run_direct(run_dir, 2, "--max-steps", "10", "--save-every", "5", "--step-log", str(log))
    assert sorted(committed(run_dir)) == [5, 10]
    (run_dir / protocol.DONE_MARKER).unlink()
    shard = committed(run_dir)[10] / "dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: only a hash sees it
    shard.write_bytes(bytes(data))
    # The controller's decision (requeue, rollback) reads manifests and sizes only: it still counts step 10.
    good, bad = policy.checkpoints_by_verification(run_dir)
    assert ([s for s, _p in good], bad) == ([10, 5], [])
    p = run_direct(run_dir, 2, "--max-steps", "10", "--save-every", "5", "--step-log", str(log))
    assert "resumed from step-00000005" in p.stderr, p.stderr[-3000:]
    assert [x.name.split(".")[1].split("-")[0] for x in (run_dir / "checkpoints").glob("step-00000010.*")] == \
        ["corrupt"]
    second = [s for a, r, s, _l in log_lines(log)[20:] if r == 0]
    assert second == list(range(6, 11)), second  # the whole step 10 unusable: 6.. redone, never a partial load
    assert protocol.verify_done_marker(run_dir).verified


def test_kill9_of_one_rank_ends_the_others_and_orch_requeues_from_the_last_commit(orch, tmp_path):
    log = tmp_path / "steps.log"
    orch.write_config("[policy]\ncrash_backoff_s = 0.2\n")  # the claim is the class and the resume point
    orch("submit", "--name", "k9", "--", *torchrun(2, "--max-steps", "12", "--save-every", "5", "--kill-step",
                                                    "1:8", "--step-log", str(log)),
         env={"OMP_NUM_THREADS": "1"}, check=True)
    # Rank 0 is then blocked in a collective with a dead peer: it must end (gloo's error/timeout), not hang.
    assert orch.wait("k9", {DONE, "failed", "cancelled"}, timeout=180) == DONE, orch.show("k9")
    shown = orch.show("k9")["attempts"]
    # Rank 0 survived: its collective failed for a lost peer, which is `killed` (auto-requeued), not its crash.
    assert shown[0]["failure_class"] == "killed" and (shown[0]["action"] or {}).get("auto"), shown[0]
    assert "lost a peer rank" in json.loads((protocol.attempt_dir(orch.runs / "k9", 1) / protocol.FAILURE_FILE)
                                            .read_text())["detail"]
    assert len(shown) == 2 and shown[1]["state"] == "succeeded", shown
    lines = log_lines(log)
    assert min(s for a, _r, s, _l in lines if a == 2) == 6, lines  # from step-5, the last commit


def test_a_rank_failing_its_save_commits_nothing_and_keeps_the_previous_step(tmp_path):
    run_dir = tmp_path / "run"
    p = run_direct(run_dir, 2, "--max-steps", "12", "--save-every", "5", "--fail-save", "1:10", ok=False)
    assert p.returncode != 0
    assert "injected: rank 1 cannot write step 10" in p.stderr, p.stderr[-3000:]
    assert sorted(committed(run_dir)) == [5]
    assert_complete_step(committed(run_dir)[5], 2)
    assert [x.name for x in (run_dir / "checkpoints").iterdir()] == ["step-00000005"]  # no tmp dir left
    # ENOSPC on rank 1: the attempt's class is the disk's (enospc), passed to every rank with the verdict.
    assert json.loads((protocol.attempt_dir(run_dir, 1) / protocol.FAILURE_FILE).read_text())["class"] == "enospc"


def test_one_eio_in_one_ranks_save_is_storage_retried_uncounted_and_the_job_ends_verified(orch, tmp_path):
    """A single EIO while rank 1 wrote its share of step 10 (step 5 intact) was a counted crash, and with
    --max-attempts 1 the job failed. It is a storage fault: retried after a back-off, never counted, resumed from
    step 5, verified."""
    log = tmp_path / "steps.log"
    orch.write_config("[policy]\ncrash_backoff_s = 0.2\n")
    orch("submit", "--name", "eio", "--max-attempts", "1", "--", *torchrun(
        2, "--max-steps", "12", "--save-every", "5", "--fail-save", "1:10", "--fail-errno", "5", "--step-log",
        str(log)), env={"OMP_NUM_THREADS": "1"}, check=True)
    assert orch.wait("eio", {DONE, "failed", "cancelled"}, timeout=180) == DONE, orch.show("eio")
    shown = orch.show("eio")["attempts"]
    assert [(a["state"], a["failure_class"]) for a in shown] == [("failed", "storage"), ("succeeded", None)], shown
    assert "injected: rank 1 cannot write step 10" in shown[0]["detail"], shown[0]
    assert min(s for a, _r, s, _l in log_lines(log) if a == 2) == 6  # from step-5, the last commit


@pytest.mark.parametrize(("point", "rank"), [("writing", 1), ("rank_files", 1), ("gathered", 0),
                                             ("manifest", 0), ("committed", 0)])
def test_kill9_of_one_rank_at_a_commit_point_never_leaves_a_verified_partial_step(tmp_path, point, rank):
    run_dir = tmp_path / "run"
    p = run_direct(run_dir, 2, "--max-steps", "12", "--save-every", "5", "--kill-at", f"{point}:{rank}:10", ok=False)
    assert p.returncode != 0, p.stderr[-2000:]
    steps = committed(run_dir)
    for path in steps.values():
        assert_complete_step(path, 2)
    assert sorted(steps) == ([5, 10] if point == "committed" else [5])


def test_two_ranks_then_one_keeps_the_effective_batch_and_continues_the_loss_curve(tmp_path):
    args = ["--max-steps", "12", "--save-every", "6", "--dropout", "0"]
    run_dir, log = tmp_path / "run", tmp_path / "steps.log"
    run_direct(run_dir, 2, *args, "--kill-step", "0:9", "--step-log", str(log), ok=False)
    assert sorted(committed(run_dir)) == [6]
    two = {s: loss for _a, r, s, loss in log_lines(log) if r == 0}
    assert sorted(two) == list(range(1, 9))  # steps 7 and 8 ran on 2 ranks after the commit of step 6
    p = run_direct(run_dir, 1, *args, "--step-log", str(log))
    assert "resumed from step-00000006" in p.stderr, p.stderr[-3000:]
    assert protocol.verify_done_marker(run_dir).verified
    one = {s: loss for _a, r, s, loss in log_lines(log)[len(two) * 2:]}
    assert sorted(one) == list(range(7, 13))
    # The same samples (global index in state), the same effective batch (4 micro-batches accumulated on one
    # rank vs 2 ranks x 2): steps 7 and 8 give the 2-rank losses again up to the summation order (1e-4).
    for s in (7, 8):
        assert one[s] == pytest.approx(two[s], rel=1e-4), (s, one[s], two[s])


def test_with_very_short_steps_the_ranks_agree_every_n_steps_and_still_stop_after_one_step(tmp_path):
    """Steps of ~1 ms: an all-reduce at every boundary would cost more than the step, so the ranks check every N
    steps; N is agreed too, so a SIGTERM seen by rank 1 alone still stops both after the same step."""
    run_dir, log = tmp_path / "run", tmp_path / "steps.log"
    p = run_direct(run_dir, 2, "--max-steps", "3000", "--global-batch", "2", "--micro-batch", "1", "--dropout", "0",
                   "--signal-step", "1:400", "--step-log", str(log), ok=False)
    assert p.returncode != 0 and "preempted (SIGTERM) at step" in p.stderr, p.stderr[-3000:]
    lines = log_lines(log)
    last = {r: max(s for _a, rr, s, _l in lines if rr == r) for r in (0, 1)}
    report = json.loads((protocol.attempt_dir(run_dir, 1) / protocol.FAILURE_FILE).read_text())
    # >= : when the boundary after step 400 is one of the agreed checks (a loaded machine's slower steps make N
    # small), the stop is taken right there; else at the next check. Both ranks, the same step, either way.
    assert last[0] == last[1] == report["step"] >= 400, (last, report)
    assert "SIGTERM" in report["detail"], report  # rank 0 saw no signal: the agreement told it which one
    assert sorted(committed(run_dir)) == [report["step"]]
    assert_complete_step(committed(run_dir)[report["step"]], 2)


def test_save_every_auto_on_two_ranks_takes_one_save_decision_for_both(tmp_path):
    """save_every="auto" with a sharded (collective) save: each rank's clock says "due" at its own moment, so the
    decision is agreed; rank 0 deciding alone left it waiting in the gather for a rank that never saved (found
    when the auto interval and the sharded commit met at merge)."""
    run_dir = tmp_path / "run"
    env = quiet_env({"OMP_NUM_THREADS": "1", "ORCH_MTBF_S": "4"})  # Daly's interval for this M: well under 1 s
    p = subprocess.run(torchrun(2, "--max-steps", "40", "--save-every", "auto", "--sleep-per-step", "0.03",
                                "--dropout", "0", "--run-dir", str(run_dir)),
                       env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    steps = sorted(committed(run_dir))
    assert steps and steps[0] < 40, steps  # periodic saves happened before the final one
    for s in steps:
        assert_complete_step(committed(run_dir)[s], 2)
    assert protocol.verify_done_marker(run_dir).verified


def test_rank_zero_failing_to_choose_the_resume_step_fails_every_rank_at_once(tmp_path):
    """A rollback override naming another run's checkpoint that is gone: rank 0 refuses it (RunDirError). The
    other ranks, waiting for rank 0's choice, hear the refusal and raise it too, rather than waiting in the
    broadcast until the process group's timeout."""
    env = quiet_env({"OMP_NUM_THREADS": "1", protocol.ENV_OVERRIDES: json.dumps(
        {"resume": str(tmp_path / "other" / "checkpoints" / protocol.checkpoint_name(5))})})
    p = subprocess.run(torchrun(2, "--max-steps", "4", "--run-dir", str(tmp_path / "run")), env=env,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode != 0
    assert p.stderr.count("RunDirError: choosing the checkpoint to resume from failed on rank 0") == 2, \
        p.stderr[-4000:]


def test_four_ranks_then_two_then_three_reshards_and_keeps_the_effective_batch(tmp_path):
    """4 -> 2 -> 3 ranks (each attempt killed after a commit): DCP reshards the model and optimizer, each world size
    accumulates global_batch / (micro x ranks) micro-batches, and the steps after each resume repeat the losses of
    the steps the previous world size ran after the same commit (same samples: a global index), within 1e-4."""
    args = ["--max-steps", "12", "--save-every", "4", "--dropout", "0", "--global-batch", "12", "--micro-batch", "1"]
    run_dir = tmp_path / "run"
    logs = [tmp_path / f"steps-{w}.log" for w in (4, 2, 3)]
    for world, log, kill in ((4, logs[0], "0:6"), (2, logs[1], "1:10")):
        p = run_direct(run_dir, world, *args, "--kill-step", kill, "--step-log", str(log), ok=False)
        assert p.returncode != 0, p.stderr[-2000:]
    p = run_direct(run_dir, 3, *args, "--step-log", str(logs[2]))
    assert "resumed from step-00000008" in p.stderr, p.stderr[-3000:]
    assert protocol.verify_done_marker(run_dir).verified
    loss = [{s: v for _a, r, s, v in log_lines(log) if r == 0} for log in logs]
    assert sorted(loss[0]) == list(range(1, 6)) and sorted(loss[1]) == list(range(5, 10)), loss
    assert sorted(loss[2]) == list(range(9, 13)), loss
    assert loss[1][5] == pytest.approx(loss[0][5], rel=1e-4)  # 4 -> 2 after the commit of step 4
    assert loss[2][9] == pytest.approx(loss[1][9], rel=1e-4)  # 2 -> 3 after the commit of step 8
