"""Hostile pass 4: rank 1 of 2 kill -9'd right after launch, before its first heartbeat. Rank 0, waiting
for it, ignored torchrun's SIGTERM; the reconciler stopped the attempt as "rank 1: no progress" and its SIGKILL took
the wrapper before exit.json. The attempt was `hang`; the rank's parent had recorded its own SIGKILL: `killed`."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestrator import protocol
from orchestrator.backends.base import AttemptRef, Outcome, Phase
from orchestrator.decide.classify import classify
from orchestrator.decide.staleness import Stale
from orchestrator.jobside import rankend
from orchestrator.ops.attemptend import evidence_of_end

TOKEN, LAUNCH = "tok-1", "launch-a"
SELF_KILL = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


def _attempt(tmp_path, wrapper_token: str = TOKEN) -> AttemptRef:
    """A 2-rank attempt whose rank 1 was SIGKILLed on its own (recorded by orch's real per-rank parent) and whose
    wrapper left wrapper.json but no exit.json."""
    ref = AttemptRef(None, TOKEN, tmp_path, 1)
    ref.attempt_dir.mkdir(parents=True)
    env = {**os.environ, "RANK": "1", protocol.ENV_TOKEN: TOKEN}
    p = subprocess.run([sys.executable, "-m", "orchestrator.jobside.rankend",
                        "--dir", str(ref.attempt_dir / "torchrun"),
                        "--launch", LAUNCH, "--", sys.executable, "-c", SELF_KILL], env=env, timeout=60)
    assert p.returncode == -9
    protocol.atomic_write_json(ref.attempt_dir / protocol.WRAPPER_FILE,
                               {"token": wrapper_token, "launch": LAUNCH, "world_size": 2})
    return ref


def test_the_rank_records_name_the_killed_rank_when_no_exit_record_was_left(tmp_path):
    ev = evidence_of_end(_attempt(tmp_path), Outcome(Phase.VANISHED))
    assert ev.exit_record is None and ev.rank_end == (1, -9)
    c = classify(ev.outcome, ev.report, ev.verification, stop_reason="hang", hang=Stale(1, 23.0, None),
                 exit_record=ev.exit_record, stop_record=ev.stop, rank_end=ev.rank_end)
    assert c.cls is protocol.FailureClass.KILLED and c.detail.startswith("rank 1 killed by SIGKILL"), c


def test_another_launchs_wrapper_record_reads_no_rank_end(tmp_path):
    """wrapper.json of another submission (its token): the records are not this attempt's account."""
    assert evidence_of_end(_attempt(tmp_path, wrapper_token="other"), Outcome(Phase.VANISHED)).rank_end is None


def test_the_record_directory_is_the_one_the_wrapper_gives_torchrun():
    from orchestrator.jobside import wrapper

    assert wrapper.TORCHRUN_DIR == rankend.TORCHRUN_DIR == "torchrun"
