"""Hang detection reads when the heartbeat was written from the filesystem, never from the job's own clock.

Found by a hostile test: a job whose node clock ran 60 s behind wrote heartbeats whose ``time`` looked stale,
was stopped as ``hang`` on every attempt and ended ``failed`` for good; a heartbeat without ``time`` was never
judged at all.
"""

from __future__ import annotations

import sys
import textwrap
import time

from orchkit import wait_for

BEATS = textwrap.dedent('''
    import json, os, sys, time
    d = os.path.join(os.environ["ORCH_RUN_DIR"], "attempts", os.environ["ORCH_ATTEMPT"])
    skew, beats = float(sys.argv[1]), int(sys.argv[2])
    for step in range(1, 10_000):
        if step <= beats:
            rec = {"step": step, "loss": 1.0}
            if skew == skew:  # not nan: write a "time" from a clock that is `skew` seconds off
                rec["time"] = time.time() + skew
            with open(os.path.join(d, "p.tmp"), "w") as f:
                json.dump(rec, f)
            os.replace(os.path.join(d, "p.tmp"), os.path.join(d, "progress.json"))
        time.sleep(0.3)
''')


def _drive(orch, name: str, seconds: float) -> list[str]:
    """Reconcile passes for ``seconds``; the job's states seen."""
    seen, t0 = [], time.monotonic()
    while time.monotonic() - t0 < seconds:
        orch("reconcile", check=True)
        seen.append(orch.state(name))
        time.sleep(0.5)
    return seen


def test_a_job_whose_clock_is_behind_is_not_hung_while_it_beats(orch, tmp_path):
    orch.write_config("[policy]\nhang_timeout_s = 3\n")
    script = tmp_path / "beats.py"
    script.write_text(BEATS)
    orch("submit", "--name", "skew", "--", sys.executable, str(script), "-3600", "1000000", check=True)
    seen = _drive(orch, "skew", 8)  # well past hang_timeout_s, with fresh heartbeats all along
    assert set(seen[1:]) == {"running"}, seen
    assert orch.show("skew")["attempts"][0]["state"] == "running"
    orch("cancel", "skew", check=True)


def test_a_heartbeat_without_time_that_stops_is_judged_hung(orch, tmp_path):
    orch.write_config("[policy]\nhang_timeout_s = 3\n")
    script = tmp_path / "beats.py"
    script.write_text(BEATS)
    orch("submit", "--name", "notime", "--max-attempts", "1", "--", sys.executable, str(script), "nan", "2",
         check=True)

    def judged_hung() -> bool:
        if orch.show("notime")["attempts"][0]["failure_class"] == "hang":
            return True
        orch("reconcile", check=True)
        return False

    wait_for(judged_hung, 60, "notime judged hung", interval=0.5, detail=lambda: orch.show("notime")["attempts"][0])
