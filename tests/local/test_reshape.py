"""`orch requeue NAME --nodes N --nproc-per-node K` (issue 31): the next attempt runs on another rank layout.

Nothing else could change the shape of an existing job: `orch requeue` took no resources, and a new submit of the
name is refused, although orch's kit resumes a checkpoint on any world size. Here the plain-loop example runs on
two ranks (torchrun, gloo), is cancelled mid-run (every rank saves the step they agreed on), and is requeued on
one rank: it resumes from that step, computes no step twice, and ends verified. Layouts the job's backend cannot
run, or arguments that cannot be, are refused before anything is written.
"""

from __future__ import annotations

import sys

from orchkit import ROOT, wait_for

from orchestrator import protocol

LOOP = [sys.executable, str(ROOT / "examples" / "plain_loop.py"), "--max-steps", "80", "--save-every", "1000",
        "--sleep-per-step", "0.05"]


def _attempts(orch, name: str) -> list[dict]:
    return orch.show(name)["attempts"]


def test_a_two_rank_job_requeued_on_one_rank_resumes_where_both_stopped_with_no_step_redone(orch):
    steps = orch.home / "steps.log"  # "<attempt> <step>[ <rank>]" per step each rank completes
    p = orch("submit", "--name", "rs", "--nproc-per-node", "2", "--", *LOOP, "--step-log", str(steps))
    assert p.returncode == 0, p.stdout + p.stderr
    run_dir = orch.runs / "rs"
    wait_for(lambda: int((protocol.read_progress(run_dir, 1) or {}).get("step") or 0) >= 10, 120, "step 10")
    assert orch("cancel", "rs").returncode == 0
    # settled: the job cancelled and its attempt ended (requeue refuses while it is still stopping: its ranks save)
    wait_for(lambda: orch("reconcile") and (lambda j: (j["state"], j["attempts"][-1]["state"]))(orch.show("rs"))
             == ("cancelled", "cancelled"), 90, "the cancel to settle")

    # refused before anything is written: no new attempt, the job as it was
    for args, code, words in ((("--nodes", "2"), 3, "its backend runs a job on one machine only"),
                              (("--nproc-per-node", "0"), 2, "0 is not in the range"),
                              (("--failed", "--nodes", "1"), 2, "change the named jobs only")):
        argv = ("requeue", *args) if "--failed" in args else ("requeue", "rs", *args)
        r = orch(*argv)
        assert (r.returncode, words in r.stdout + r.stderr) == (code, True), (args, r.returncode, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        assert len(_attempts(orch, "rs")) == 1 and orch.show("rs")["state"] == "cancelled"

    dry = orch("requeue", "rs", "--nproc-per-node", "1", "--dry-run")
    assert dry.returncode == 0 and "on 1 node x 1 rank" in dry.stdout, dry.stdout
    assert len(_attempts(orch, "rs")) == 1
    r = orch("requeue", "rs", "--nproc-per-node", "1")
    assert r.returncode == 0 and "on 1 node x 1 rank, was 1 node x 2 ranks" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: orch("reconcile") and orch.show("rs")["state"] == "done_marker_verified", 180, "verified")
    a1, a2 = _attempts(orch, "rs")
    assert (a1["world_size"], a2["world_size"]) == (2, 1), (a1, a2)
    stopped = protocol.read_progress(run_dir, 2)["resumed_from"]  # the step both ranks agreed on and saved
    lines = [line.split() for line in steps.read_text().splitlines()]
    first = sorted({int(s) for n, s, *_ in lines if n == "1"})
    second = [int(s) for n, s, *_ in lines if n == "2"]
    assert first == list(range(1, stopped + 1)), (stopped, first[-3:])  # both ranks stopped at the agreed step
    assert second == list(range(stopped + 1, 81)), second[:3]  # one rank, from the next step: none twice
    events = orch.json("show", "rs", "--events")["events"]
    assert any("on 1 node x 1 rank, was 1 node x 2 ranks" in (e["reason"] or "") for e in events), events

    plain = orch("submit", "--name", "plain", "--max-attempts", "1", "--wait", "--", sys.executable, "-c",
                 "raise SystemExit(3)")
    assert plain.returncode == 4, plain.stdout + plain.stderr  # ended without a verified marker
    r = orch("requeue", "plain", "--nodes", "1")
    assert r.returncode == 3 and "--nodes needs --nproc-per-node" in r.stdout + r.stderr, r.stdout + r.stderr
    assert len(_attempts(orch, "plain")) == 1
