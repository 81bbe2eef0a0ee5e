"""The bundled trainer as DDP over 2 ranks, through the real CLI: ``orch submit --nproc-per-node 2 --
python -m orch_trainer ...`` (torchrun, gloo on CPU, OMP_NUM_THREADS=1).

What is proved here, with real processes and signals:

* a 2-rank job preempted twice (SIGTERM to every rank, as a scheduler sends it) ends verified and bit-exact
  (final weights and final loss) with an uninterrupted 2-rank run: one commit per step with every rank's RNG,
  the data a pure function of the global step;
* the same job preempted on 2 ranks resumes on 1 rank with the same effective batch (4 micro-batches of 2
  accumulated on one rank vs 2 per rank on 2) and ends verified, 0 steps redone;
* SIGTERM to ONE rank only: both ranks stop after the same step (the kit's StopAgreement), one commit holding
  both ranks' files, 0 steps redone by the next attempt;
* ``--fsdp``: the shards of both ranks committed through DCP, resumed on the same world size bit-exact with an
  uninterrupted 2-rank FSDP run; such a commit is refused (invalid, one line) by a run without ``--fsdp``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import torch
from orchkit import wait_for
from rankkit import GLOO_ENV
from trainerkit import run_trainer, trainer_env

from orchestrator import protocol

DONE = "done_marker_verified"
# Tiny and short: 2 micro-batches of 2 per rank per step (global batch 8), a save every 10 steps.
ARGS = ["--preset", "tiny", "--batch-size", "8", "--micro-batch-size", "2", "--save-interval", "10",
        "--keep-last-k", "2", "--seed", "3", "--heartbeat-interval", "0.05", "--log-interval", "1000"]
# A rank left waiting in a collective (a bug under test) fails within a minute, not the trainer's 300 s.
ENV = {**GLOO_ENV, "ORCH_HEARTBEAT_S": "0.05", "ORCH_TRAINER_COLLECTIVE_TIMEOUT_S": "60"}


def submit(orch, name: str, steps: int, *extra: str) -> Path:
    """``orch submit --nproc-per-node 2 [extra orch options] -- python -m orch_trainer ARGS [extra after "--"]``."""
    cut = extra.index("--") if "--" in extra else len(extra)
    orch("submit", "--name", name, "--nproc-per-node", "2", *extra[:cut], "--", sys.executable, "-m", "orch_trainer",
         *ARGS, "--max-steps", str(steps), *extra[cut + 1:], env=ENV, check=True)
    return orch.runs / name


def rank_pids(run_dir: Path, attempt: int) -> dict[int, int]:
    """{RANK: pid} of the trainer processes of ``attempt`` (not their orch rankend parents, not torchrun)."""
    want = {f"{protocol.ENV_RUN_DIR}={run_dir}".encode(), f"{protocol.ENV_ATTEMPT}={attempt}".encode()}
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[1:3] == [b"-m", b"orch_trainer"] and want <= set(env):
            rank = next((e[5:] for e in env if e.startswith(b"RANK=")), b"")
            if rank.isdigit():
                out[int(rank)] = int(d.name)
    return out


def progress(run_dir: Path, attempt: int) -> int:
    return int((protocol.read_progress(run_dir, attempt) or {}).get("step") or 0)


def signal_ranks(orch, run_dir: Path, attempt: int, past: int, ranks: tuple[int, ...] = (0, 1)) -> None:
    """SIGTERM ``ranks`` of ``attempt`` once rank 0 posted a step past ``past`` (reconciling until it runs)."""
    def ready() -> dict[int, int] | None:
        early = protocol.attempt_dir(run_dir, attempt) / protocol.FAILURE_FILE
        assert not early.exists(), early.read_text()  # ended before the signal (e.g. refused): say why
        pids = rank_pids(run_dir, attempt)
        if len(pids) < 2:
            orch("reconcile", check=True)
            return None
        return pids if progress(run_dir, attempt) > past else None

    pids = wait_for(ready, 120, f"attempt {attempt} past step {past}", interval=0.02)
    for r in ranks:
        os.kill(pids[r], signal.SIGTERM)
    wait_for(lambda: (protocol.attempt_dir(run_dir, attempt) / protocol.FAILURE_FILE).exists(), 120,
             f"attempt {attempt}'s report")


def report(run_dir: Path, attempt: int) -> dict:
    return json.loads((protocol.attempt_dir(run_dir, attempt) / protocol.FAILURE_FILE).read_text())


def run_config(run_dir: Path) -> dict:
    return json.loads((run_dir / protocol.RUN_CONFIG).read_text())


def assert_two_rank_commit(path: Path) -> None:
    """Verifies (every sha256), and its manifest lists both ranks' RNG beside rank 0's replicated state."""
    assert protocol.verify_checkpoint(path) is None, protocol.verify_checkpoint(path)
    m = json.loads((path / protocol.MANIFEST).read_text())
    assert m["world_size"] == 2 and sorted(m["ranks"]) == ["0", "1"], m
    assert {"model.pt", "optim.pt", "meta.json", "rank-00000/rng.pt", "rank-00001/rng.pt"} <= set(m["files"]), m


def test_two_rank_trainer_preempted_twice_ends_bit_exact_with_an_uninterrupted_two_rank_run(orch):
    steps = 60
    ref = submit(orch, "ref", steps)  # the uninterrupted 2-rank run, beside it (its start-up overlaps)
    run_dir = submit(orch, "pre", steps)
    signal_ranks(orch, run_dir, 1, 8)
    first = report(run_dir, 1)
    assert first["class"] == "preempted", first
    signal_ranks(orch, run_dir, 2, first["step"] + 8)
    second = report(run_dir, 2)
    assert second["class"] == "preempted" and second["step"] > first["step"], (first, second)
    assert orch.wait("pre", {DONE, "failed", "cancelled"}, timeout=180) == DONE, orch.show("pre")
    shown = orch.show("pre")["attempts"]
    assert [(a["failure_class"], (a["action"] or {}).get("auto")) for a in shown] == \
        [("preempted", True), ("preempted", True), (None, None)], shown
    assert all(a["world_size"] == 2 for a in shown), shown
    for n, rep in ((1, first), (2, second)):  # each stop committed its step, on both ranks; the next resumed it
        assert rep["checkpoint"] == f"checkpoints/{protocol.checkpoint_name(rep['step'])}", rep
        assert protocol.read_progress(run_dir, n + 1)["resumed_from"] == rep["step"]
    # Every commit kept (keep-last-k 2) is a two-rank one. Which steps they are depends on how far the ranks ran
    # before each SIGTERM landed: on an idle machine the second stop came at step 57, and step 50 was pruned.
    kept = sorted((run_dir / "checkpoints").glob("step-*"))
    assert len(kept) == 2 and kept[-1].name == protocol.checkpoint_name(steps), kept
    for path in kept:
        assert_two_rank_commit(path)
    assert orch("verify", "pre").stdout == "VERIFIED\n"

    assert orch.wait("ref", {DONE, "failed", "cancelled"}, timeout=180) == DONE, orch.show("ref")
    got, want = torch.load(run_dir / "result" / "model.pt"), torch.load(ref / "result" / "model.pt")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    m_got, m_want = (json.loads((d / "result" / "metrics.json").read_text()) for d in (run_dir, ref))
    assert (m_got["final_loss"], m_got["eval_loss"]) == (m_want["final_loss"], m_want["eval_loss"]), (m_got, m_want)
    assert run_config(run_dir)["accumulation_steps"] == 2 and run_config(run_dir)["world_size"] == 2


def test_two_rank_trainer_preempted_then_resumed_on_one_rank_keeps_the_effective_batch(orch, tmp_path):
    steps = 60
    run_dir = submit(orch, "shrink", steps, "--max-attempts", "1")
    signal_ranks(orch, run_dir, 1, 8)
    stop = report(run_dir, 1)["step"]
    assert report(run_dir, 1)["class"] == "preempted" and 8 < stop < steps
    assert_two_rank_commit(run_dir / "checkpoints" / protocol.checkpoint_name(stop))
    two = run_config(run_dir)
    assert (two["world_size"], two["micro_batch_size"], two["accumulation_steps"]) == (2, 2, 2), two
    # The same run dir on ONE rank (no torchrun): the 2-rank commit is resumed as is.
    p = run_trainer(run_dir, *ARGS, "--max-steps", str(steps), attempt=2,
                    env=trainer_env(ORCH_ATTEMPT="2", OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"resumed from {protocol.checkpoint_name(stop)} (step {stop})" in p.stderr, p.stderr[-3000:]
    one = run_config(run_dir)
    # 4 micro-batches of 2 on one rank = 2 x 2 per rank on two: the effective batch 8 is kept
    assert (one.get("world_size", 1), one["micro_batch_size"], one["accumulation_steps"]) == (1, 2, 4), one
    assert one["resumed_from_step"] == stop
    metrics = json.loads((run_dir / "result" / "metrics.json").read_text())
    assert (metrics["steps"], metrics["batch_size"], metrics["resumed_from_step"]) == (steps, 8, stop), metrics
    # 0 steps redone: this attempt computed exactly the micro-batches of the steps after the stop
    assert metrics["micro_batches_computed"] == (steps - stop) * 4, metrics
    assert protocol.verify_done_marker(run_dir).verified


def test_sigterm_to_one_rank_only_stops_both_after_the_same_step_with_one_commit(orch):
    steps = 80
    run_dir = submit(orch, "one", steps)
    signal_ranks(orch, run_dir, 1, 8, ranks=(1,))  # rank 1 ONLY
    rep = report(run_dir, 1)
    stop = rep["step"]
    assert rep["class"] == "preempted" and 8 < stop < steps, rep
    adir = protocol.attempt_dir(run_dir, 1)
    # One commit at the stop step, holding both ranks' files; it is what the report names.
    assert rep["checkpoint"] == f"checkpoints/{protocol.checkpoint_name(stop)}", rep
    assert_two_rank_commit(run_dir / rep["checkpoint"])
    assert not [p.name for p in (run_dir / "checkpoints").iterdir() if protocol.TMP_INFIX in p.name]
    assert orch.wait("one", {DONE, "failed", "cancelled"}, timeout=180) == DONE, orch.show("one")
    # attempt 1 over (both ranks exited): rank 1 reported nothing of its own, rank 0 reported the stop of both
    assert not list(adir.glob("failure.rank-*.json")), [p.name for p in adir.iterdir()]
    # Both ranks' last completed step was the stop step (rank 0: progress.json, rank 1: its own heartbeat file,
    # each written last as its rank exited)
    assert progress(run_dir, 1) == stop
    assert protocol.read_step(adir / protocol.RANK_PROGRESS.format(1)) == stop
    # 0 steps redone: attempt 2 resumed at the stop step and computed only the steps after it
    assert protocol.read_progress(run_dir, 2)["resumed_from"] == stop
    metrics = json.loads((run_dir / "result" / "metrics.json").read_text())
    assert (metrics["resumed_from_step"], metrics["micro_batches_computed"]) == (stop, (steps - stop) * 2), metrics
    assert orch("verify", "one").stdout == "VERIFIED\n"


def test_fsdp_two_rank_trainer_preempted_resumes_its_shards_and_ends_bit_exact(orch, tmp_path):
    """--fsdp: model and optimizer sharded over the 2 ranks (FSDP2), each commit through DCP with every rank's
    shard hashed in the manifest; a preemption resumes the shards on the same world size, bit-exact."""
    steps = 40
    ref = submit(orch, "fsdp-ref", steps, "--", "--fsdp")
    run_dir = submit(orch, "fsdp", steps, "--", "--fsdp")
    signal_ranks(orch, run_dir, 1, 8)
    stop = report(run_dir, 1)
    assert stop["class"] == "preempted" and stop["checkpoint"] == \
        f"checkpoints/{protocol.checkpoint_name(stop['step'])}", stop
    path = run_dir / stop["checkpoint"]
    assert protocol.verify_checkpoint(path) is None, protocol.verify_checkpoint(path)
    m = json.loads((path / protocol.MANIFEST).read_text())
    assert m["world_size"] == 2 and sorted(m["ranks"]) == ["0", "1"], m
    assert {"dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp", "sched.pt", "meta.json", "rank-00000/rng.pt",
            "rank-00001/rng.pt"} <= set(m["files"]) and "model.pt" not in m["files"], m
    for name in (run_dir, ref):
        assert orch.wait(name.name, {DONE, "failed", "cancelled"}, timeout=180) == DONE, orch.show(name.name)
    assert protocol.read_progress(run_dir, 2)["resumed_from"] == stop["step"]
    got, want = torch.load(run_dir / "result" / "model.pt"), torch.load(ref / "result" / "model.pt")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    m_got, m_want = (json.loads((d / "result" / "metrics.json").read_text()) for d in (run_dir, ref))
    assert (m_got["final_loss"], m_got["eval_loss"]) == (m_want["final_loss"], m_want["eval_loss"]), (m_got, m_want)
    assert orch("verify", "fsdp").stdout == "VERIFIED\n"
    # Its sharded commit is refused, in one line and before the model is built, by a run without --fsdp
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    (copy / protocol.DONE_MARKER).unlink()
    p = run_trainer(copy, *ARGS, "--max-steps", str(steps + 10), attempt=4)
    assert p.returncode == protocol.EXIT_FAILURE_REPORTED, p.stderr[-2000:]
    rep = report(copy, 4)
    assert rep["class"] == "invalid" and rep["detail"] == \
        f"checkpoint {protocol.checkpoint_name(steps)} was written with --fsdp; resume it the same way", rep
