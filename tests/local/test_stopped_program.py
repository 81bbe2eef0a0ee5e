"""A program stopped (SIGSTOP, Ctrl-Z) is hung once it stays stopped hang_timeout_s, whatever it wrote: judged from
the wrapper's own sight of it (``attempts/<n>/program-stopped.json``), stopped with a SIGCONT so that it can act on
its stop, and requeued without a person.

Hostile pass: the bundled trainer stopped half a second in (before its first heartbeat) stayed
``running`` with no hang flag, and so did torchrun stopped before any rank started; a cancel then waited the whole
kill grace for the stopped process."""

from __future__ import annotations

import json
import os
import signal
import sys

from orchkit import wait_for

from orchestrator import protocol

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]  # no kit, no heartbeat: only its state tells


def test_a_program_stopped_before_any_heartbeat_is_judged_hung_continued_stopped_and_requeued(orch):
    orch.write_config("[policy]\nhang_timeout_s = 3\n")
    orch.env["ORCH_HEARTBEAT_S"] = "0.2"  # how often the wrapper looks
    orch("submit", "--name", "stp", "--", *SLEEPER, check=True)
    adir = protocol.attempt_dir(orch.runs / "stp", 1)
    wrapper = adir / protocol.WRAPPER_FILE
    wait_for(wrapper.exists, 60, "the wrapper to start the program")
    pid = json.loads(wrapper.read_text())["child_pid"]
    os.kill(pid, signal.SIGSTOP)
    wait_for((adir / protocol.PROGRAM_STOPPED).exists, 30, "the wrapper to see its program stopped")

    def judged() -> dict | None:
        att = orch.show("stp")["attempts"]
        if att[0]["failure_class"] is not None:
            return att[0]
        orch("reconcile", check=True)
        return None

    first = wait_for(judged, 60, "attempt 1 judged", interval=0.3)
    assert first["failure_class"] == "hang" and first["action"]["auto"] is True, first
    # Continued with its stop: it died of the SIGTERM, not of the SIGKILL at the end of the kill grace.
    end = wait_for(lambda: protocol.read_exit(adir), 20, "attempt 1's exit record (the kill grace is 30 s)")
    assert end.returncode == -signal.SIGTERM, end
    assert not (adir / protocol.PROGRAM_STOPPED).exists()  # the record went with the program

    def requeued() -> bool:
        if len(orch.show("stp")["attempts"]) == 2:
            return True
        orch("reconcile", check=True)
        return False

    wait_for(requeued, 60, "attempt 2, requeued by reconcile alone", interval=0.3)
    orch("cancel", "stp", check=True)


def test_a_program_stopped_briefly_is_not_hung(orch):
    """Stopped and continued within the timeout: the record goes, nothing is judged."""
    orch.write_config("[policy]\nhang_timeout_s = 30\n")
    orch.env["ORCH_HEARTBEAT_S"] = "0.2"
    orch("submit", "--name", "brief", "--", *SLEEPER, check=True)
    adir = protocol.attempt_dir(orch.runs / "brief", 1)
    wait_for((adir / protocol.WRAPPER_FILE).exists, 60, "the wrapper to start the program")
    pid = json.loads((adir / protocol.WRAPPER_FILE).read_text())["child_pid"]
    os.kill(pid, signal.SIGSTOP)
    wait_for((adir / protocol.PROGRAM_STOPPED).exists, 30, "the wrapper to see its program stopped")
    os.kill(pid, signal.SIGCONT)
    wait_for(lambda: not (adir / protocol.PROGRAM_STOPPED).exists(), 30, "the wrapper to see it run again")
    orch("reconcile", check=True)
    assert orch.show("brief")["attempts"][0]["state"] == "running"
    orch("cancel", "brief", check=True)


def _rank_pids(run_dir, rank: int) -> tuple[int | None, int | None]:
    """(orch's per-rank parent ``orchestrator.jobside.rankend``, the rank's program) of ``rank`` for ``run_dir``."""
    from pathlib import Path

    want = {f"{protocol.ENV_RUN_DIR}={run_dir}".encode(), f"RANK={rank}".encode()}
    parent = program = None
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and want <= set((d / "environ").read_bytes().split(b"\0")):
                if b"orchestrator.jobside.rankend" in (d / "cmdline").read_bytes():
                    parent = int(d.name)
                else:
                    program = int(d.name)
        except OSError:
            continue
    return parent, program


def test_a_stop_continues_a_stopped_rank_parent_so_the_cancel_ends_at_once(orch):
    """Hostile pass 5: rank 1's orch parent SIGSTOPped, then `orch cancel`: the stop reached only torchrun, the
    parent could not act on torchrun's SIGTERM, and the attempt stayed `stopping` for torchrun's whole shutdown
    timeout, until its SIGKILL took the parent without its record. Continued with the stop, the parent records
    rank 1's end as a stop's consequence (its rank-end record, which a SIGKILLed parent never writes)."""
    orch("submit", "--name", "rp", "--nproc-per-node", "2", "--", *SLEEPER, check=True)
    run_dir = orch.runs / "rp"
    pid = wait_for(lambda: all(_rank_pids(run_dir, 1)) and _rank_pids(run_dir, 1)[0], 60,
                   "rank 1's parent to start its program")
    os.kill(pid, signal.SIGSTOP)
    orch("cancel", "rp", check=True)
    tdir = protocol.attempt_dir(run_dir, 1) / "torchrun"
    record = wait_for(lambda: next(iter(tdir.glob("rank-end.*.1.json")), None), 40,
                      "rank 1's parent to record its end (torchrun's SIGKILL comes after 60 s)")
    assert json.loads(record.read_text())["stopped"] is True
    assert orch.wait("rp", {"cancelled"}, timeout=60) == "cancelled"
