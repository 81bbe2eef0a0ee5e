"""One rank of a multi-rank job hung: real torchrun, gloo on CPU, 2 ranks.

Rank 1 stops itself with SIGSTOP in the middle of attempt 1 (after step 12 is logged, before the kit counts it):
it never goes on, and rank 0 blocks in the next collective with it. What is proved, with real processes:

* every rank beats on its own (rank 0 ``progress.json``, rank 1 ``progress.rank-00001.json``), so orch's hang
  policy judges the attempt by its oldest rank and its record names the rank that stopped and its step;
* the hang stop ends the WHOLE attempt: no process carrying its token is left (torchrun starts each rank in a
  session of its own; the stopped rank never handles a SIGTERM), both ranks' processes gone;
* the attempt is classified ``hang``, requeued by orch alone, and the job ends verified, attempt 2 resuming
  every rank from the last committed step (10) without redoing or skipping a step.

A second job's rank 1 stops itself before its heartbeat starts: it never writes its file, and is still the rank
judged and named (counted from the attempt's start), not rank 0 that waits for it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import psutil
from intkit import DONE, wait_for
from rankkit import token_carriers

from orchestrator import protocol

SCRIPT = str(Path(__file__).parent / "scripts" / "mr_train.py")
ENDED = ("failed", "cancelled", "succeeded")


def _rank_proc(run_dir: Path, rank: int) -> psutil.Process | None:
    """The live torchrun worker with RANK=<rank> of this run dir."""
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if env.get(protocol.ENV_RUN_DIR) == str(run_dir) and env.get("RANK") == str(rank) and \
                    SCRIPT in p.cmdline():
                return p
        except (psutil.Error, OSError):
            continue
    return None


def _steps(log: Path) -> list[tuple[int, int, int]]:
    """(attempt, rank, step) per completed step and rank."""
    return [(int(a), int(r), int(s)) for a, r, s, _loss in (ln.split() for ln in log.read_text().splitlines())]


def _rank1_stopped(run_dir: Path) -> tuple[psutil.Process, psutil.Process] | None:
    """Both ranks' processes once rank 1 is stopped (its own SIGSTOP), else None."""
    r0, r1 = _rank_proc(run_dir, 0), _rank_proc(run_dir, 1)
    try:
        return r0 and r1 and r1.status() == psutil.STATUS_STOPPED and (r0, r1)
    except psutil.Error:
        return None


def _hang_of(orch, name: str, *script_args: str) -> tuple[Path, dict]:
    """Run SCRIPT on 2 torchrun ranks under orch (hang_timeout_s 5) until rank 1 stopped itself, then reconcile
    until attempt 1 ends; check that the hang stop ended the WHOLE attempt and it is a resumed hang.
    (run dir, attempt 1 as orch show --json has it)."""
    orch.write_config("[policy]\nhang_timeout_s = 5\n")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", SCRIPT, *script_args]
    # heartbeats every 0.5 s: a healthy rank's file is never near the 5 s timeout, even on a loaded machine
    orch("submit", "--name", name, "--", *argv, env={"OMP_NUM_THREADS": "1", "ORCH_HEARTBEAT_S": "0.5"},
         check=True)
    run_dir = orch.runs / name
    token = orch.show(name)["attempts"][0]["token"]
    ranks = wait_for(lambda: _rank1_stopped(run_dir), 120, "rank 1 stopped by its own SIGSTOP", interval=0.1)
    a1 = wait_for(lambda: orch("reconcile", check=True) and (a := orch.show(name)["attempts"][0])["state"] in ENDED
                  and a, 120, "attempt 1 to end", interval=0.5)
    # The whole attempt stopped: no process of it is left, whatever its session, the stopped rank included.
    left = token_carriers(token)
    assert not left, [(q.pid, q.cmdline()) for q in left]
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks), ranks
    assert (a1["state"], a1["failure_class"], (a1["action"] or {}).get("action")) == ("failed", "hang", "resume"), a1
    return run_dir, a1


def test_a_hung_rank_stops_the_whole_attempt_named_in_its_record_and_the_job_resumes_verified(orch, tmp_path):
    log = tmp_path / "steps.log"
    run_dir, a1 = _hang_of(orch, "hung", "--max-steps", "30", "--save-every", "5", "--sleep-per-step", "0.05",
                           "--stop-step", "1:12", "--step-log", str(log))
    # The record names the rank that stopped progressing, at the step of its own last heartbeat, behind rank 0.
    m = re.fullmatch(r"stopped by the reconciler: rank 1: no progress for \d+ s at step (\d+)", a1["detail"] or "")
    assert m, a1["detail"]
    # Typed, not parsed from that sentence (migration 0010): show --json has the stale rank, its step, its age.
    assert (a1["stale_rank"], a1["stale_step"]) == (1, int(m.group(1))) and a1["stale_age_s"] > 5, a1
    assert f"hang stop: rank 1: no progress for {a1['stale_age_s']:.0f} s at step {m.group(1)}" in \
        orch("show", "hung", check=True).stdout
    rank1_file = protocol.attempt_dir(run_dir, 1) / protocol.RANK_PROGRESS.format(1)
    # (> 0: rank 1's own heartbeat moved with its steps, 12 of >= 0.05 s each against a beat every 0.5 s)
    assert 0 < int(m.group(1)) == protocol.read_step(rank1_file) < 12 <= protocol.read_progress(run_dir, 1)["step"]

    assert orch.wait("hung", {DONE, "failed", "cancelled"}, timeout=180) == DONE, orch.show("hung")
    lines = _steps(log)
    show = orch.show("hung")
    assert [a["state"] for a in show["attempts"]] == ["failed", "succeeded"], show["attempts"]  # CI: a resume stopped
    for rank in (0, 1):
        first = [s for a, r, s in lines if a == 1 and r == rank]
        second = [s for a, r, s in lines if a == 2 and r == rank]
        assert first == list(range(1, 13)), (rank, first)  # rank 1 logged step 12, then stopped
        assert second == list(range(11, 31)), (rank, second)  # from step-10, the last commit: none skipped
    assert orch("verify", "hung").stdout == "VERIFIED\n"


def test_a_rank_hung_before_its_first_heartbeat_is_judged_from_the_start_and_named(orch):
    """Rank 1 stops itself where orch_run starts its heartbeat (after the resume's collectives, as a rank stuck
    loading its share of a restore would): it never writes ``progress.rank-00001.json``. Rank 0 beats (its
    progress.json says world_size 2), then blocks in the first step's stop agreement with rank 1. Only the files
    that existed were judged: the stop blamed rank 0, the rank that was waiting ("rank 0: ... at step 0"). The
    missing rank counts from the attempt's start, is the one furthest behind and is named, with no step."""
    run_dir, a1 = _hang_of(orch, "early", "--max-steps", "6", "--save-every", "3", "--stop-before-beat", "1")
    assert (a1["stale_rank"], a1["stale_step"]) == (1, None), a1
    assert re.fullmatch(r"stopped by the reconciler: rank 1: no progress for \d+ s, before any step heartbeat",
                        a1["detail"] or ""), a1["detail"]
    assert not (protocol.attempt_dir(run_dir, 1) / protocol.RANK_PROGRESS.format(1)).exists()
    assert protocol.read_progress(run_dir, 1)["world_size"] == 2  # rank 0 beat, naming its world
    assert orch.wait("early", {DONE, "failed", "cancelled"}, timeout=180) == DONE, orch.show("early")
    assert orch("verify", "early").stdout == "VERIFIED\n"


def test_a_rank_hung_before_the_process_group_forms_is_judged_from_the_start_and_named(orch):
    """Rank 1 stopped before its process group formed; rank 0 waited in init_process_group, so no rank
    ever beat and the hang detector, which judged only jobs that beat, never armed: the attempt held its machine
    for the collective timeout and ended a counted crash. Rank 0's kit armed as the script imported it; rank 1
    never got that far: judged from the attempt's start, named, stopped with the whole attempt, resumed."""
    run_dir, a1 = _hang_of(orch, "start", "--max-steps", "6", "--save-every", "3", "--stop-before-group", "1")
    assert (a1["stale_rank"], a1["stale_step"]) == (1, None), a1
    assert re.fullmatch(r"stopped by the reconciler: rank 1: no progress for \d+ s, before any step heartbeat",
                        a1["detail"] or ""), a1["detail"]
    assert protocol.read_progress(run_dir, 1) is None  # no rank beat in attempt 1
    assert protocol.armed_ranks(run_dir, 1) == {0: 2}
    assert orch.wait("start", {DONE, "failed", "cancelled"}, timeout=180) == DONE, orch.show("start")
    assert orch("verify", "start").stdout == "VERIFIED\n"


def test_a_rank_hung_after_it_armed_before_its_group_formed_is_judged_by_its_unrefreshed_record(orch):
    """Rank 1 armed (orch's kit imported), then stopped before init_process_group; rank 0 waits there, alive, and
    keeps its armed record fresh. Rank 1's record is no longer refreshed: it is judged, named and stopped with the
    whole attempt, which resumes verified."""
    run_dir, a1 = _hang_of(orch, "armed", "--max-steps", "6", "--save-every", "3", "--stop-after-arm", "1")
    assert (a1["stale_rank"], a1["stale_step"]) == (1, None), a1
    assert re.fullmatch(r"stopped by the reconciler: rank 1: no progress for \d+ s, before any step heartbeat",
                        a1["detail"] or ""), a1["detail"]
    assert protocol.read_progress(run_dir, 1) is None  # no rank beat in attempt 1
    assert protocol.armed_ranks(run_dir, 1) == {0: 2, 1: 2}
    assert orch.wait("armed", {DONE, "failed", "cancelled"}, timeout=180) == DONE, orch.show("armed")
    assert orch("verify", "armed").stdout == "VERIFIED\n"
