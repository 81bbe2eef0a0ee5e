"""Goodput counts every held second once, by the scheduler's account (issue 45), on the real dev cluster.

A job and a sweep task, each preempted by a real `prio` job and requeued in place by Slurm, while no reconcile
pass runs at all (a cron that came late): the first `orch reconcile` after both completed finds two runs of one
attempt each. Before, the run no pass saw was counted as queue waiting (or the queue time between the runs as
held). Now `orch show`, `orch report` and `orch metrics` count each run from sacct's own Start and End, the queue
between the runs as waiting after a preemption, `orch plot` marks the resume, and a job that forges every time it can
write (its wrapper records, its heartbeats) leaves its held time where sacct put it.
"""

from __future__ import annotations

import json
import sys

import pytest
from orchkit import ROOT, wait_for
from slurmkit import node_idle, run

from orchestrator import protocol

STEP_SLEEP_S = 0.05
# 800 steps of at least 0.05 s outlast the preemption (it reached jobs 13-22 s after the prio job's submission).
LOOP = [sys.executable, str(ROOT / "examples" / "plain_loop.py"), "--max-steps", "800", "--save-every", "50",
        "--sleep-per-step", str(STEP_SLEEP_S)]
# sacct's Start and End are whole seconds; orch takes them as they are, so it agrees to within rounding.
TOLERANCE_S = 1.0


@pytest.fixture
def cleanup(orch):
    extra: list[str] = []
    yield extra
    from slurmkit import cancel_all_of

    cancel_all_of(orch, extra)


def sacct_runs(job_id: str) -> list[tuple[str, float | None, float | None]]:
    """(state, start, end) of each run of a Slurm job, oldest first, as sacct accounts them (epoch seconds)."""
    p = run("sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", "State,Start,End")
    assert p.returncode == 0, p.stderr
    out = []
    for line in p.stdout.split():
        state, start, end = line.split("|")
        out.append((state, float(start) if start.isdigit() else None, float(end) if end.isdigit() else None))
    return out


def test_an_in_place_requeue_no_pass_saw_is_held_as_sacct_accounted_it_in_show_report_metrics_and_plot(
        orch, cleanup, monkeypatch):
    monkeypatch.setenv("SLURM_TIME_FORMAT", "%s")  # this test's own sacct calls (orch sets it for its own)
    node_idle()
    p = orch("submit", "--backend", "slurm", "--partition", "spot", "--cpus-per-task", "1", "--name", "gp", "--",
             *LOOP)
    assert p.returncode == 0, p.stdout + p.stderr
    p = orch("sweep", "--name", "gs", "--backend", "slurm", "--partition", "spot", "--cpus-per-task", "1",
             "--grid", "seed=3", "--", *LOOP, "--seed", "{seed}")
    assert p.returncode == 0, p.stdout + p.stderr
    names = {"gp": orch.runs / "gp", "gs.0000": orch.runs / "gs.0000"}
    ids = {n: orch.show(n)["attempts"][0]["external_id"] for n in names}

    def step(n: str) -> int:
        return int((protocol.read_progress(names[n], 1) or {}).get("step") or 0)

    wait_for(lambda: all(step(n) >= 20 for n in names), 120, "both programs at step 20",
             detail=lambda: {n: step(n) for n in names})
    q = run("sbatch", "--parsable", "-p", "prio", "-c", "2", "--mem=200M", "-o", "/dev/null", "--wrap", "sleep 2")
    assert q.returncode == 0, q.stderr  # both cores: it preempts both
    cleanup.append(q.stdout.strip())

    def both_completed_twice() -> bool:
        return all([s for s, _, _ in sacct_runs(ids[n])] == ["PREEMPTED", "COMPLETED"] for n in names)

    # No orch pass while they run, are preempted, wait and run again: the observable end is sacct's.
    wait_for(both_completed_twice, 300, "both Slurm jobs preempted once and completed",
             detail=lambda: {n: sacct_runs(ids[n]) for n in names})
    assert orch.reconcile_runs == 0
    wait_for(lambda: orch("reconcile", check=True) and all(
        r["state"] == "done_marker_verified" for r in orch.json("status")), 60, "both jobs verified")

    shows = {n: orch.show(n) for n in names}
    for n, show in shows.items():
        (state1, s1, e1), (state2, s2, e2) = sacct_runs(ids[n])
        g, a = show["goodput"], show["goodput"]["attempts"][0]
        assert (show["attempts"][0]["restarts"], a["runs"], a["held_from"]) == (1, 2, "scheduler"), (n, a)
        held = (e1 - s1) + (e2 - s2)
        assert abs(a["held_s"] - held) <= TOLERANCE_S, (n, a["held_s"], held)
        assert abs(sum(v for k, v in a["seconds"].items()) - a["held_s"]) < 1e-6, a
        # the queue between the runs is waiting after the preemption, never held
        gap = [w for w in g["waits"] if w["cause"] == "preempted"]
        assert len(gap) == 1 and abs(gap[0]["seconds"] - (s2 - e1)) <= TOLERANCE_S, (n, g["waits"], s2 - e1)
        # each step slept STEP_SLEEP_S: a step time below it counted held time that was not training as training
        assert a["step_time_s"] >= STEP_SLEEP_S and a["seconds"]["useful"] > 0, a
        marks = orch.json("plot", n)["marks"]
        assert [m for m in marks if m["kind"] == "resume" and m.get("in_place")], marks

    rep = json.loads(orch("report", "--since", "1h", "--json", check=True).stdout)
    spot = rep["by_partition"]["slurm/spot"]
    assert spot["jobs"] == 2 and rep["by_sweep"]["gs"]["jobs"] == 1
    assert abs(spot["held_s"] - sum(s["goodput"]["held_s"] for s in shows.values())) < 1e-6, spot
    assert spot["preemptions"] == 2, spot
    gauges = {line.split("category=\"")[1].split("\"")[0]: float(line.rsplit(" ", 1)[1])
              for line in orch("metrics", check=True).stdout.splitlines()
              if line.startswith('orch_goodput_seconds{partition="slurm/spot"')}
    assert gauges == pytest.approx(spot["seconds"], abs=1e-3)

    # The job forges every time it can write; its held time stays sacct's.
    before = shows["gp"]["goodput"]["attempts"][0]["held_s"]
    adir = protocol.attempt_dir(names["gp"], 1)
    for rec, when in (("wrapper.prev-1.json", "2020-01-01T00:00:00+00:00"),
                      ("wrapper.json", "2099-01-01T00:00:00+00:00")):
        w = json.loads((adir / rec).read_text())
        protocol.atomic_write_json(adir / rec, {**w, "started_at": when})
    history = adir / protocol.PROGRESS_HISTORY
    lines = [json.loads(x) for x in history.read_text().splitlines()]
    history.write_text("".join(json.dumps({**r, "time": r["time"] + 365 * 86400}) + "\n" for r in lines))
    forged = orch.show("gp")["goodput"]["attempts"][0]
    assert abs(forged["held_s"] - before) < 1e-6, (forged["held_s"], before)
    assert any("heartbeat(s) dated outside its held time ignored" in x for x in forged["assumptions"]), forged
    text = orch("show", "gp", check=True).stdout
    assert "in 2 runs (the scheduler's account)" in text and "goodput note:" in text, text
    print(f"\n[measured] gp: sacct runs {sacct_runs(ids['gp'])}; orch held {before:.1f} s")
