"""A plain multi-rank program (no orch kit) one of whose ranks ends on its own, through
``orch submit --nproc-per-node 2`` on the local backend, real torchrun and gloo:

* rank 1 SIGKILLed (a kill -9, the OOM killer without a cgroup): the attempt is ``killed``, as a single
  process killed so is, and the reconciler requeues it by itself; attempt 2 resumes from the program's own
  checkpoint and the job ends verified. torchrun alone exits 1 for it, which read as ``crash`` (a human's
  ``orch requeue``);
* rank 1 raising (exit 1): still ``crash``, waiting for ``orch requeue``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from intkit import DONE
from orchkit import wait_for

from orchestrator import protocol

SCRIPT = str(Path(__file__).parent / "scripts" / "plain_ddp_rank_end.py")
GLOO_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def submit(orch, name: str, end: str) -> Path:
    orch.write_config("[policy]\ncrash_backoff_s = 0.2\n")  # the claim is the class and who requeues
    orch("submit", "--name", name, "--nproc-per-node", "2", "--outputs", "result/model.pt", "--",
         sys.executable, SCRIPT, "--end", end, "--at", "7", env=GLOO_ENV, check=True)
    return orch.runs / name


def steps(run_dir: Path, rank: int) -> list[tuple[int, int]]:
    p = run_dir / f"steps-{rank}.log"
    return [(int(x), int(y)) for x, y in (ln.split() for ln in p.read_text().splitlines())] if p.exists() else []


def test_a_plain_rank_killed_by_sigkill_is_killed_and_requeued_by_the_reconciler(orch):
    run_dir = submit(orch, "k9", "kill9")
    first = wait_for(lambda: (a := orch("reconcile") and orch.show("k9")["attempts"][0])["failure_class"] and a,
                     240, "attempt 1 to be classified")
    assert first["failure_class"] == "killed", first  # crash, before: waiting for a human's `orch requeue`
    assert (first["action"] or {}).get("auto"), first
    assert "rank 1" in first["detail"], first
    assert orch.wait("k9", {DONE, "failed", "cancelled"}, timeout=240) == DONE, orch.show("k9")  # reconcile only
    shown = orch.show("k9")["attempts"]
    rec = protocol.read_exit(protocol.attempt_dir(run_dir, 1))
    assert rec is not None and (rec.failed_rank, rec.rank_returncode) == (1, -9), rec
    assert rec.returncode == 1  # torchrun's own exit: what alone read as crash
    assert len(shown) == 2 and shown[1]["state"] == "succeeded", shown
    assert min(s for a, s in steps(run_dir, 1) if a == 2) == 7, steps(run_dir, 1)  # from its step-6 checkpoint
    assert orch("verify", "k9").stdout == "VERIFIED\n"


def test_a_plain_rank_that_raises_is_still_a_crash(orch):
    run_dir = submit(orch, "r1", "raise")
    assert orch.wait("r1", {DONE, "failed", "cancelled", "retryable_failed"}, timeout=240) == "retryable_failed"
    a = orch.show("r1")["attempts"]
    assert len(a) == 1 and a[0]["failure_class"] == "crash", a
    assert not (a[0]["action"] or {}).get("auto"), a[0]  # waits for `orch requeue`
    rec = protocol.read_exit(protocol.attempt_dir(run_dir, 1))
    assert rec is not None, rec
    # Rank 1's exit 1 names it. Where rank 1 instead aborted on its way out, or torchrun stopped it during its exit
    # after rank 0's gloo abort (CI, stops 26 and 27), the ends cannot tell who began it and no rank is named
    # (rankend.first_own_end); rank 0, which only lost its peer, never is.
    assert (rec.failed_rank, rec.rank_returncode) in ((1, 1), (None, None)), rec
