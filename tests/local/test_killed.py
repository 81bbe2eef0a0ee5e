"""A SIGKILL with no record (kill -9; the kernel OOM killer where no memory cgroup tells it apart) is class
``killed``: auto-requeued with back-off and counted, never left for a manual ``orch requeue``.
Real processes, real SIGKILL, real torch in the job."""

from __future__ import annotations

import sys

DONE = "done_marker_verified"

# A plain script with its own checkpoint format: torch.save(path) in place every 10 steps, resumed from the
# newest file by torch.load. Attempt 1 is killed by SIGKILL mid-save of step 20 (a 0-byte file left).
IN_PLACE = """
import os, pathlib, signal, torch
ck = pathlib.Path("ck"); ck.mkdir(exist_ok=True)
saves = sorted(ck.glob("*.pt"), key=lambda p: int(p.stem))
start = torch.load(saves[-1])["step"] if saves else 0
with open("steps.log", "a") as log:
    log.write(f"{os.environ['ORCH_ATTEMPT']} start {start}\\n")
for step in range(start + 1, 31):
    if step % 10 == 0:
        if os.environ["ORCH_ATTEMPT"] == "1" and step == 20:
            open(ck / "20.pt", "wb").close()
            os.kill(os.getpid(), signal.SIGKILL)
        torch.save({"step": step}, ck / f"{step}.pt")
pathlib.Path("result").mkdir(exist_ok=True)
pathlib.Path("result/out.txt").write_text(f"done from {start}")
"""


def test_kill9_mid_save_is_killed_auto_requeued_and_resumes_from_the_last_good_file(orch):
    orch.write_config("[policy]\ncrash_backoff_s = 1\n")
    orch("submit", "--name", "k9", "--outputs", "result/*", "--keep", "ck/*.pt", "--", sys.executable, "-c",
         IN_PLACE, check=True)
    # No `orch requeue` anywhere: reconcile alone brings it back.
    assert orch.wait("k9", {DONE, "failed", "cancelled"}, timeout=120) == DONE, orch.show("k9")
    first, second = orch.show("k9")["attempts"]
    assert first["failure_class"] == "killed" and "SIGKILL" in first["detail"], first
    assert first["counted"] is True and first["action"]["auto"] is True, first
    assert first["action"]["details"]["backoff_s"] == 1.0
    run_dir = orch.runs / "k9"
    assert (run_dir / "steps.log").read_text().split("\n")[1] == "2 start 10"  # not the 0-byte 20.pt
    assert (run_dir / "result" / "out.txt").read_text() == "done from 10"
    assert second["set_aside"][0]["path"] == "ck/20.pt" and second["set_aside"][0]["why"] == "0 bytes", second
    assert len(list((run_dir / "ck").glob("20.pt.torn-*"))) == 1


TRAINER = [sys.executable, "-m", "orch_trainer", "--preset", "tiny", "--max-steps", "100000", "--save-interval", "50"]


def _procs(run_dir, marker: bytes, rank: int | None = None) -> list[int]:
    """Pids whose command line holds ``marker`` and whose environment names ``run_dir`` (and ``rank``)."""
    from pathlib import Path

    from orchestrator import protocol

    want = {f"{protocol.ENV_RUN_DIR}={run_dir}".encode(), *([f"RANK={rank}".encode()] if rank is not None else [])}
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and marker in (d / "cmdline").read_bytes() and \
                    want <= set((d / "environ").read_bytes().split(b"\0")):
                out.append(int(d.name))
        except OSError:
            continue
    return out


def test_kill9_of_torchrun_or_of_a_ranks_orch_parent_is_killed_not_the_leftovers_preemption(orch):
    """Hostile pass 5: kill -9 of torchrun, or of rank 0's orch parent, was `preempted` (uncounted): the wrapper
    then stopped the orphaned ranks, and their kit's stop record (written after the program's end) was read as
    the attempt's. Both are `killed`: counted, backed off, requeued by reconcile alone. Real torchrun, 2 ranks."""
    import os
    import signal

    from orchkit import wait_for

    from orchestrator import protocol

    orch.write_config("[policy]\ncrash_backoff_s = 1\n")
    for name in ("tr", "rp"):
        orch("submit", "--name", name, "--nproc-per-node", "2", "--", *TRAINER, check=True)

    def trained(name: str) -> bool:
        return (protocol.read_progress(orch.runs / name, 1) or {}).get("step", 0) > 60  # a checkpoint committed

    wait_for(lambda: trained("tr") and trained("rp"), 120, "both jobs past their first checkpoint")
    os.kill(_procs(orch.runs / "tr", b"torch.distributed.run")[0], signal.SIGKILL)
    os.kill(_procs(orch.runs / "rp", b"orchestrator.jobside.rankend", rank=0)[0], signal.SIGKILL)

    def ended(name: str) -> dict | None:
        orch("reconcile")
        first = orch.show(name)["attempts"][0]
        return first if first["failure_class"] is not None else None

    try:
        for name in ("tr", "rp"):
            first = wait_for(lambda n=name: ended(n), 120, f"{name}'s attempt 1 to end", interval=0.5)
            assert first["failure_class"] == "killed" and "SIGKILL" in first["detail"], first
            assert first["counted"] is True and first["action"]["auto"] is True, first
    finally:  # a failed assertion must not leave four ranks training for ever (seen: 40 min under CI)
        orch("cancel", "tr", "rp")
        for name in ("tr", "rp"):
            orch.wait(name, {"cancelled"}, timeout=120)
            wait_for(lambda n=name: not _procs(orch.runs / n, b"orch_trainer"), 120, f"{name}'s ranks to end")
