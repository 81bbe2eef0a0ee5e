"""A sweep on the real dev Slurm cluster: one job array, each task recovered on its own.

20 tasks in ONE `sbatch --array`: 3 are preempted by a real `prio` job (spot: Slurm requeues each
in place as that task only, and it finishes as its single orch attempt), 2 crash once (one
`orch requeue --failed` sends both out again as ONE new small array), 1 reports `invalid` (failed
for good), and the other 14 finish untouched. sacct shows exactly the two arrays.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
import time
from pathlib import Path

import pytest
from orchkit import wait_for
from slurmkit import node_idle, run, start_requeued, submitted_since

from orchestrator import protocol

N = 20
PREEMPTED = (0, 1, 2)
CRASH_ONCE = (3, 4)
INVALID = 5
TASK = textwrap.dedent('''
    import json, os, signal, sys, time
    from orchestrator import protocol
    i, attempt = int(os.environ["ORCH_TASK_INDEX"]), int(os.environ["ORCH_ATTEMPT"])
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    log = os.environ["SWEEP_LOG"]
    def note(event):
        with open(log, "a") as f:
            f.write(json.dumps({"task": i, "attempt": attempt, "restart": restart, "event": event,
                                "job": os.environ.get("SLURM_JOB_ID"), "t": time.time()}) + "\\n")
    note("start")
    if i in PREEMPTED and restart == 0:
        def stop(*_):
            note("preempted")
            sys.exit(143)
        signal.signal(signal.SIGTERM, stop)
        for _ in range(3000):  # waits for its preemption (gives up after ~5 min)
            time.sleep(0.1)
        sys.exit(1)
    if i in CRASH_ONCE and attempt == 1:
        sys.exit(1)
    if i == INVALID:
        protocol.write_failure(os.environ["ORCH_RUN_DIR"], attempt, "invalid", None, "bad argument set")
        sys.exit(3)
    with open("result.txt", "w") as f:
        f.write(f"task {i} {os.environ['ORCH_SWEEP_PARAMS']}\\n")
    note("done")
''')


def events(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def task_status(orch) -> dict[str, dict]:
    return task_status_of(orch, "sw")


@pytest.fixture
def cleanup(orch):
    extra: list[str] = []
    yield extra
    ids = set(extra)
    for r in orch.json("status"):
        if r.get("external_id"):
            ids.add(r["external_id"].split("_")[0])
    if ids:
        run("scancel", *sorted(ids))


def _start_requeued(sweep_ids: set[str]) -> None:
    start_requeued(lambda jid, _name: jid.split("_")[0] in sweep_ids)


def test_a_twenty_task_array_recovers_each_task_on_its_own(orch, cleanup, tmp_path):
    node_idle()
    script = tmp_path / "task.py"
    script.write_text(f"PREEMPTED, CRASH_ONCE, INVALID = {PREEMPTED}, {CRASH_ONCE}, {INVALID}\n" + TASK)
    log = tmp_path / "sweep.log"
    # The DB exists, as after a home's first command: the sweep takes the quick path (orchestrator/ops/quicksweep.py).
    assert orch("status").returncode == 0
    p = orch("sweep", "--name", "sw", "--backend", "slurm", "--partition", "spot", "--cpus-per-task", "1",
             "--mem", "100M", "--grid", "i=" + ",".join(map(str, range(N))), "--throttle", "3",
             "--outputs", "result.txt", "--", sys.executable, str(script), env={"SWEEP_LOG": str(log)})
    assert p.returncode == 0, p.stdout + p.stderr
    rows = task_status(orch)
    arrays = {r["external_id"].split("_")[0] for r in rows.values()}
    assert len(rows) == N and len(arrays) == 1, rows  # ONE sbatch for the whole sweep
    (array,) = arrays
    assert {r["external_id"] for r in rows.values()} == {f"{array}_{i}" for i in range(N)}

    # Preempt the three gated tasks, each while it runs, with real prio jobs (2 CPUs: all of the node).
    preempted: set = set()

    def all_preempted() -> bool:
        nonlocal preempted
        orch("reconcile", check=True)
        ev = events(log)
        preempted = {e["task"] for e in ev if e["event"] == "preempted"}
        if preempted == set(PREEMPTED):
            return True
        running = {e["task"] for e in ev if e["event"] == "start" and e["restart"] == 0} & set(PREEMPTED)
        if running - preempted and not run("squeue", "-h", "-p", "prio", "-o", "%i").stdout.strip():
            q = run("sbatch", "--parsable", "-p", "prio", "-c", "2", "--mem=200M", "-o", "/dev/null",
                    "--wrap", "sleep 2")
            assert q.returncode == 0, q.stderr
            cleanup.append(q.stdout.strip())
        _start_requeued({array})
        return False

    wait_for(all_preempted, 400, "every gated task preempted once", interval=1,
             detail=lambda: f"preempted so far: {preempted}; {events(log)[-5:]}")

    def settled(rows: dict) -> bool:
        return all(r["state"] in {"done_marker_verified", "retryable_failed", "failed"} for r in rows.values())


    def settled_now() -> dict | None:
        rows = task_status(orch)
        if settled(rows):
            return rows
        orch("reconcile", check=True)
        _start_requeued({array})
        return None

    rows = wait_for(settled_now, 400, "every task to settle", interval=1,
                    detail=lambda: {n: r["state"] for n, r in task_status(orch).items()})
    name = {i: f"sw.{i:04d}" for i in range(N)}
    for i in PREEMPTED:  # requeued in place by Slurm, as that task only: one attempt, restarted
        a = orch.show(name[i])["attempts"]
        assert rows[name[i]]["state"] == "done_marker_verified" and len(a) == 1, a
        assert a[0]["restarts"] >= 1 and a[0]["external_id"] == f"{array}_{i}", a
    for i in CRASH_ONCE:
        assert rows[name[i]]["state"] == "retryable_failed", rows[name[i]]
        assert orch.show(name[i])["attempts"][0]["failure_class"] == "crash"
    assert rows[name[INVALID]]["state"] == "failed"
    assert orch.show(name[INVALID])["attempts"][0]["failure_class"] == "invalid"
    untouched = [i for i in range(N) if i not in (*PREEMPTED, *CRASH_ONCE, INVALID)]
    assert len(untouched) == 14
    starts = events(log)
    for i in untouched:  # one attempt each; a quick task a prio job caught running was requeued in place too
        a = orch.show(name[i])["attempts"]
        assert rows[name[i]]["state"] == "done_marker_verified" and len(a) == 1, a
        # orch counts every Slurm rerun; the task logs only the runs that reached its program: a run preempted
        # before it logged, or a rerun whose wrapper found the marker already verified (a quick task caught
        # by a prio job as it finished: seen twice in CI), leaves no event of its own.
        assert a[0]["restarts"] >= max(e["restart"] for e in starts if e["task"] == i), (a, i)

    # One requeue of the failed tasks: ONE new array with just those two.
    r = orch("requeue", "--failed", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted((x["name"], x["outcome"]) for x in json.loads(r.stdout)) == [
        (name[i], "requeued") for i in CRASH_ONCE]
    retry_ids = {orch.show(name[i])["attempts"][1]["external_id"] for i in CRASH_ONCE}
    retry_arrays = {x.split("_")[0] for x in retry_ids}
    assert len(retry_arrays) == 1 and retry_arrays != {array}, retry_ids
    (retry,) = retry_arrays
    assert retry_ids == {f"{retry}_{i}" for i in CRASH_ONCE}

    def retried() -> bool:
        if all(task_status(orch)[name[i]]["state"] == "done_marker_verified" for i in CRASH_ONCE):
            return True
        orch("reconcile", check=True)
        return False

    wait_for(retried, 200, "the crashed tasks verified on their retry", interval=1,
             detail=lambda: task_status(orch))
    # Every verified task holds its own result; the invalid one was never retried.
    for i in range(N):
        if i != INVALID:
            assert protocol.verify_done_marker(orch.runs / name[i]).verified, i
    assert len(orch.show(name[INVALID])["attempts"]) == 1

    # sacct: exactly the two submissions (the array, then the retry array), all tasks accounted for.
    acct = run("sacct", "-X", "-n", "-P", "--duplicates", "-S", "now-1hour", "-o", "JobID,JobName").stdout
    ours = {line.split("|")[0].split("_")[0] for line in acct.splitlines()
            if line.split("|")[0].split("_")[0] in (array, retry)}
    assert ours == {array, retry}
    retry_tasks = {line.split("|")[0] for line in acct.splitlines() if line.startswith(f"{retry}_")}
    assert retry_tasks == {f"{retry}_{i}" for i in CRASH_ONCE}
    table = orch("status", check=True).stdout
    assert "sweep of 20: 19 done_marker_verified, 1 failed" in table, table


@pytest.mark.parametrize("site", ["after_backend_submit", "group_claimed", "group_written"])
def test_a_sweep_whose_submitter_dies_right_after_sbatch_is_found_by_its_token(orch, cleanup, site):
    # Exactly-once per task across a crash between sbatch and orch's DB: the submitting process dies (as a
    # kill -9 would) just after sbatch accepted the array; the next reconcile pass finds that array by the
    # token in its job name and records each task's id, instead of submitting the sweep a second time.
    # The launch is batched: "group_claimed" dies after the ONE transaction that claimed every task,
    # "group_written" after every task's command/fence records were written but before the one flush that
    # puts them in place; each task must still run exactly once, under its one attempt.
    node_idle()
    assert orch("status").returncode == 0  # the DB exists: the quick path (each of its steps killed here)
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    p = orch("sweep", "--name", "kx", "--backend", "slurm", "--partition", "spot", "--cpus-per-task", "1",
             "--mem", "100M", "--grid", "i=0,1,2", "--outputs", "result.txt", "--", sys.executable, "-c",
             "open('result.txt', 'w').write('{i}')", env={"ORCH_FAULT": site})
    assert p.returncode == 99, p.stdout + p.stderr  # testhooks: died at the site
    if site != "after_backend_submit":  # died before sbatch: the claims are in the DB, no record in place
        attempts = [orch.show(f"kx.{i:04d}")["attempts"] for i in range(3)]
        assert all(len(a) == 1 and a[0]["state"] == "launching" for a in attempts), attempts
        assert not list(orch.runs.glob("kx.*/attempts/1/fence.json"))
    names = [f"kx.{i:04d}" for i in range(3)]
    assert all(not a["external_id"] for n in names for a in orch.show(n)["attempts"])  # the DB never heard back

    def verified() -> bool:
        if all(r["state"] == "done_marker_verified" for r in task_status_of(orch, "kx").values()):
            return True
        # The dead submitter's claim expires after the launch grace (120 s: longer than sbatch's timeout).
        orch("reconcile", check=True, env={"ORCH_LAUNCH_GRACE_S": "5"})
        return False

    wait_for(verified, 200, "every kx task verified", interval=1, detail=lambda: task_status_of(orch, "kx"))
    ids = {n: orch.show(n)["attempts"] for n in names}
    assert all(len(a) == 1 for a in ids.values()), ids  # one attempt each: found, not resubmitted
    exts = {a[0]["external_id"] for a in ids.values()}
    submitted = submitted_since(since)
    if site == "after_backend_submit":
        arrays = {e.split("_")[0] for e in exts}
        assert len(arrays) == 1, ids
        (array,) = arrays
        assert exts == {f"{array}_{i}" for i in range(3)}
        # sacct: every job submitted since the sweep began is that one array (no second sbatch).
        assert submitted == {array}, submitted
    else:
        # Nothing was submitted before the crash and no group token recorded: the reconciler re-claims and
        # launches each task (as its own job); sacct holds exactly the 3 jobs the DB names, no second copy.
        assert len(exts) == 3 and submitted == {e.split("_")[0] for e in exts}, (submitted, ids)
    for n in names:
        assert (orch.runs / n / "result.txt").read_text() == n[-1]


def task_status_of(orch, sweep: str) -> dict[str, dict]:
    return {r["name"]: r for r in orch.json("status") if r.get("sweep") == sweep}


def test_a_sweep_larger_than_the_clusters_max_array_size_is_refused_before_anything_is_written(orch):
    # Found by the P6 benchmark: task 1500 of one array is "Invalid job array specification" on a default
    # cluster (MaxArraySize=1001), which orch took for a permanent refusal: every task ended failed.
    limit = int(re.search(r"MaxArraySize\s*=\s*(\d+)", run("scontrol", "show", "config").stdout).group(1))
    p = orch("sweep", "--name", "big", "--backend", "slurm", "--partition", "spot", "--grid",
             "i=" + ",".join(map(str, range(limit + 1))), "--", "true")
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip() == (f"orch: a sweep of {limit + 1} tasks is more than this cluster's job arrays take "
                                f"(MaxArraySize={limit}): split it into sweeps of at most {limit}, or raise "
                                "MaxArraySize"), p.stderr
    assert orch.json("status") == [] and (not orch.runs.exists() or not any(orch.runs.iterdir()))


def test_a_pending_array_task_keeps_its_run_dir_after_the_db_is_lost(orch, cleanup):
    # A queued task's run dir stays empty (its records wait in its batch) and the array's submission is
    # recorded once, in its batch dir. A DB lost while the array waits (held here by --begin): resubmitting the
    # sweep, or one of its tasks, must still see the pending task in its run dir, found from the batch's task
    # table by the array's job name (a second run of the same job would start beside it).
    assert orch("status").returncode == 0  # the DB exists: the quick path, as users' sweeps take it
    p = orch("sweep", "--name", "held", "--backend", "slurm", "--partition", "spot", "--cpus-per-task", "1",
             "--mem", "50M", "--sbatch-arg=--begin=now+7days", "--grid", "i=0,1,2", "--", "true")
    assert p.returncode == 0, p.stdout + p.stderr
    exts = {r["name"]: r["external_id"] for r in orch.json("status")}
    array = exts["held.0001"].split("_")[0]
    cleanup.append(array)
    assert exts == {f"held.{i:04d}": f"{array}_{i}" for i in range(3)}, exts
    assert all(not any((orch.runs / f"held.{i:04d}").iterdir()) for i in range(3))  # the batch holds it all
    for f in orch.home.glob("orch.db*"):  # the DB is lost; the runs root and the held array are not
        f.unlink()
    p = orch("submit", "--name", "held.0001", "--backend", "slurm", "--partition", "spot", "--", "true")
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stderr == (f"orch: refused: a live attempt runs in {orch.runs / 'held.0001'} (Slurm job {array}_1 "
                        "(PENDING)) that this DB does not know (was the DB deleted?); stop it first\n"), p.stderr
    p = orch("sweep", "--name", "held", "--backend", "slurm", "--partition", "spot", "--grid", "i=0,1,2", "--",
             "true")
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stderr.startswith(f"orch: refused: a live attempt runs in {orch.runs / 'held.0000'} (Slurm job "
                               f"{array}_0 (PENDING)"), p.stderr
    assert orch.json("status") == []  # nothing recorded
    run("scancel", array)
    wait_for(lambda: not run("squeue", "-h", "-j", array).stdout.strip(), 60,  # the controller drops them
             "the cancelled tasks to leave squeue", interval=0.5,
             detail=lambda: run("squeue", "-h", "-j", array).stdout)
    p = orch("submit", "--name", "held.0001", "--backend", "slurm", "--partition", "spot",
             "--sbatch-arg=--begin=now+7days", "--", "true")
    assert p.returncode == 0, p.stdout + p.stderr  # nothing live there any more: the run dir is usable
    cleanup.append(orch.show("held.0001")["attempts"][-1]["external_id"])


def _attempt_state(orch, name: str) -> str:
    return orch.show(name)["attempts"][-1]["state"]


def test_a_task_cancelled_while_queued_settles_and_gives_its_room_back(orch, cleanup):
    # Hostile test: Slurm drops a pending array task cancelled on its own from its array and never accounts it, so
    # `orch cancel` left the attempt `stopping` (the job not requeueable, "still stopping") for good, and the batch
    # kept the task's slot of disk. A whole array cancelled while pending is listed as CANCELLED, then dropped.
    from orchestrator.jobside.ballast import SLOT_BYTES

    assert orch("status").returncode == 0
    p = orch("sweep", "--name", "cq", "--backend", "slurm", "--partition", "spot", "--cpus-per-task", "1",
             "--mem", "50M", "--sbatch-arg=--begin=now+7days", "--grid", "i=0,1,2", "--", "true")
    assert p.returncode == 0, p.stdout + p.stderr
    array = orch.show("cq.0000")["attempts"][-1]["external_id"].split("_")[0]
    cleanup.append(array)
    (pool,) = orch.runs.glob(".orch-batches/*/exit.reserve")
    assert pool.stat().st_blocks * 512 // SLOT_BYTES == 3
    assert orch("cancel", "cq.0001").returncode == 0

    def cancelled(names: list[str]) -> bool:
        if {_attempt_state(orch, n) for n in names} == {"cancelled"}:
            return True
        orch("reconcile", check=True)
        return False

    wait_for(lambda: cancelled(["cq.0001"]), 120, "cq.0001 cancelled", interval=0, detail=lambda: orch.show("cq.0001"))
    assert pool.stat().st_blocks * 512 // SLOT_BYTES == 2
    assert _attempt_state(orch, "cq.0000") == "submitted"
    assert orch("cancel", "cq.0000", "cq.0002").returncode == 0
    wait_for(lambda: cancelled(["cq.0000", "cq.0002"]), 120, "cq.0000 and cq.0002 cancelled", interval=0,
             detail=lambda: orch.json("status"))
    assert not pool.exists()
