#!/usr/bin/env python3
"""P4 on the real dev Slurm cluster: work lost and time lost per REAL partition preemption.

Each trial submits the bundled trainer (``python -m orch_trainer --preset tiny``) with ``orch submit
--backend slurm`` to ``spot`` (PreemptMode=REQUEUE: Slurm requeues it in place) or ``spot-cancel``
(PreemptMode=CANCEL: orch classifies the attempt and requeues it), drives ``orch reconcile`` (as cron
would, every ~1 s) until the trainer passed a uniformly random step, then submits a real ``prio`` job
that needs both cores (``sbatch -p prio -c 2 --wrap 'sleep 2'``), and reconciles on until the job is
``done_marker_verified``. Measured per preemption, from the run dir and sacct:

* steps redone = the last step the stopped run logged (``--log-interval 1``) − ``resumed_from_step``
  of the run that resumed (``run_config.json``), as the local P4 does;
* the time from the preemption to the first resumed step, split by who spent it: Slurm (prio job
  submitted -> SIGTERM in the trainer; requeue, BeginTime and start of the rerun), the trainer (SIGTERM
  -> exit, from failure.json's ``stop_requested_time`` and the wrapper's exit.json), orch (exit -> the
  reconcile pass that resubmits, spot-cancel only) and the rerun's start-up (sacct Start -> first resumed
  step in progress.jsonl: wrapper, interpreter, torch import, checkpoint verify + load);
* that the job ended ``done_marker_verified`` and ``orch verify`` says VERIFIED.

The cluster is shared: before each trial the script waits until no other Slurm test or benchmark runs
(``pgrep -af "tests/slurm|bench_sweep"``) and squeue is empty; it cancels only the jobs it started.
Usage: ``.venv/bin/python bench/bench_preemption_slurm.py [--trials 3] [--cancel-trials 1] [--no-write]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common as C

from orchestrator import protocol

TITLE = "Preemption on the dev Slurm cluster (P4, real preemptions)"
DONE = "done_marker_verified"
BAD = {"failed", "cancelled"}
STEP_RE = re.compile(r"\[trainer\] step (\d+)/")
OTHERS_RE = "tests/slurm|bench_sweep"


def sh(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)


def cluster_busy() -> str | None:
    """Why the shared cluster is not ours right now, or None."""
    mine = C.ancestors()  # the pytest run (or shell, flock) that started this script is not another user
    # Not users: a shell that only waits with the same pgrep (another bench's polling loop), and a
    # pytest run that names tests/slurm only to leave it out (--ignore=tests/slurm).
    others = [ln for ln in sh("pgrep", "-af", OTHERS_RE).stdout.splitlines()
              if ln.split()[0].isdigit() and int(ln.split()[0]) not in mine and "pgrep" not in ln
              and re.search(OTHERS_RE, re.sub(r"--ignore[= ]\S*tests/slurm\S*", "", ln))]
    if others:
        return "another Slurm test or benchmark runs: " + others[0][:100]
    jobs = C.competing_jobs()
    return f"{len(jobs)} jobs in squeue (first: {jobs[0]})" if jobs else None


class ClusterBusy(Exception):
    """Other work kept the shared cluster longer than --wait-limit."""


class NotPreempted(Exception):
    """The trainer finished before Slurm's SIGTERM reached it (prio -> SIGTERM took longer than the
    steps left): no preemption was measured. CI's --quick run met it once with 2,500 steps."""


def wait_for_cluster(limit: float) -> float:
    """Poll until the cluster is free; seconds waited."""
    t0, said = time.time(), None
    while (why := cluster_busy()) is not None:
        if why != said:
            print(f"  waiting for the cluster: {why}", flush=True)
            said = why
        if time.time() - t0 > limit:
            raise ClusterBusy(f"the cluster stayed busy for {limit:.0f} s ({why})")
        time.sleep(10)
    return time.time() - t0


class Orch:
    """`python -m orchestrator.cli` with a private ORCH_HOME (this checkout's code, as jobs import it)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "SLURM_"))}
        self.env.update(ORCH_HOME=str(home), PYTHONPATH=str(C.ROOT), PYTHONUNBUFFERED="1")

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        p = subprocess.run([C.PY, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                           env=self.env, cwd=str(C.ROOT), timeout=180)
        if p.returncode != 0:
            raise RuntimeError(f"orch {' '.join(args)} exited {p.returncode}: {p.stdout}{p.stderr}")
        return p

    def row(self, name: str) -> dict:
        return next(r for r in json.loads(self("status", "--json").stdout) if r["name"] == name)

    def slurm_ids(self) -> list[str]:
        ids = []
        for r in json.loads(self("status", "--json").stdout):
            ids += [a["external_id"] for a in json.loads(self("show", r["name"], "--json").stdout)["attempts"]
                    if a.get("external_id")]
        return ids


def epoch(iso: str) -> float:
    """An ISO time (orch's, UTC with offset; sacct's, local without one) as epoch seconds."""
    return datetime.fromisoformat(iso).timestamp()


def sacct_runs(job_id: str) -> list[dict]:
    """Every run of a Slurm job id (an in-place requeue adds one), oldest first."""
    out = sh("sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", "State,Eligible,Start,End").stdout
    runs = []
    for ln in out.splitlines():
        state, elig, start, end = ln.split("|")
        runs.append({"state": state, "eligible": elig, "start": start, "end": end})
    return sorted(runs, key=lambda r: r["start"])


def last_logged_step(stderr_text: str) -> int:
    steps = [int(m.group(1)) for m in STEP_RE.finditer(stderr_text)]
    return steps[-1] if steps else 0


def first_resumed_step_time(adir: Path, after: float, resumed: int) -> float:
    """Epoch of the first heartbeat after ``after`` that shows a step past ``resumed``."""
    for rec in protocol.read_progress_history(adir.parents[1], int(adir.name)):
        if rec.get("time", 0) > after and isinstance(rec.get("step"), int) and rec["step"] > resumed:
            return float(rec["time"])
    return float("nan")


def reconcile_until(orch: Orch, name: str, until, timeout: float, fast_s: float = 90) -> dict:
    """Reconcile every ~1 s for ``fast_s`` (what the delays are measured under), then every 5 s: each pass
    is a Python process, and on 2 cores it would slow the trainer it waits for."""
    t0 = time.time()
    while True:
        orch("reconcile")
        row = orch.row(name)
        if until(row):
            return row
        if time.time() - t0 > timeout:
            raise RuntimeError(f"{name}: not there after {timeout:.0f} s: {row}")
        time.sleep(1.0 if time.time() - t0 < fast_s else 5.0)


def trial(orch: Orch, partition: str, i: int, args: argparse.Namespace, rng: random.Random,
          prio_ids: list[str]) -> dict:
    name = f"p4-{partition}-{i}"
    orch("submit", "--backend", "slurm", "--name", name, "--partition", partition, "--cpus-per-task", "1",
         "--mem", "1G", "--", C.PY, "-m", "orch_trainer", "--preset", "tiny", "--threads", "1",
         "--max-steps", str(args.max_steps), "--save-interval", str(args.save_interval), "--log-interval", "1",
         "--heartbeat-interval", "0.2", "--sleep-per-step", str(args.sleep_per_step))
    rd = orch.home / "runs" / name
    target = rng.randint(args.save_interval // 4, args.max_steps // 5)
    reconcile_until(orch, name, lambda r: ((protocol.read_progress(rd, 1) or {}).get("step") or 0) >= target,
                    timeout=300)
    job1 = orch.row(name)["external_id"]
    p = sh("sbatch", "--parsable", "-p", "prio", "-c", "2", "--mem=200M", "-o", "/dev/null", "--wrap", "sleep 2")
    t_prio = time.time()
    if p.returncode != 0:
        raise RuntimeError(f"sbatch prio: {p.stderr}")
    prio_ids.append(p.stdout.strip().split(";")[0])
    row = reconcile_until(orch, name, lambda r: r["state"] in {DONE} | BAD, timeout=900)
    show = json.loads(orch("show", name, "--json").stdout)
    verify = subprocess.run([C.PY, "-m", "orchestrator.cli", "verify", name], capture_output=True, text=True,
                            env=orch.env, cwd=str(C.ROOT), timeout=120)
    a1 = protocol.attempt_dir(rd, 1)
    rerun_dir = a1 if partition == "spot" else protocol.attempt_dir(rd, 2)
    if not (a1 / ("failure.prev-1.json" if partition == "spot" else protocol.FAILURE_FILE)).exists() \
            or not rerun_dir.is_dir():
        raise NotPreempted(f"{name} ended {row['state']} in {len(show['attempts'])} attempt(s) without a "
                           f"preemption at {args.max_steps} steps")
    if partition == "spot":  # the same attempt ran twice: the first run's records were set aside
        failure = json.loads((a1 / "failure.prev-1.json").read_text())
        exit1 = json.loads((a1 / "exit.prev-1.json").read_text())
        stopped_log = (a1 / protocol.STDERR_LOG).read_text().split("resumed from", 1)[0]
        rerun_dir, rerun = a1, sacct_runs(job1)[-1]
    else:
        failure = json.loads((a1 / protocol.FAILURE_FILE).read_text())
        exit1 = json.loads((a1 / protocol.EXIT_FILE).read_text())
        stopped_log = (a1 / protocol.STDERR_LOG).read_text()
        rerun_dir = protocol.attempt_dir(rd, 2)
        rerun = sacct_runs(json.loads((rerun_dir / protocol.SLURM_DIR / protocol.SLURM_SUBMITTED).read_text())
                           ["job_id"])[-1]
    resumed = int(json.loads((rd / protocol.RUN_CONFIG).read_text()).get("resumed_from_step") or 0)
    t_sig, t_exit, t_start = float(failure["stop_requested_time"]), float(exit1["time"]), epoch(rerun["start"])
    t_first = first_resumed_step_time(rerun_dir, t_exit, resumed)
    r = {"name": name, "partition": partition, "target": target, "last": last_logged_step(stopped_log),
         "saved": failure["step"], "resumed": resumed, "discarded": failure.get("micro_batches_discarded"),
         "class": failure["class"], "state": row["state"], "verified": verify.stdout.strip() == "VERIFIED",
         "attempts": len(show["attempts"]), "restarts": sum(a.get("restarts") or 0 for a in show["attempts"]),
         "prio_to_sig": t_sig - t_prio, "sig_to_exit": t_exit - t_sig, "start_to_first": t_first - t_start,
         "sig_to_first": t_first - t_sig, "prio_to_first": t_first - t_prio}
    r["redone"] = r["last"] - resumed
    if partition == "spot":
        r["exit_to_eligible"] = epoch(rerun["eligible"]) - t_exit
        r["eligible_to_start"] = t_start - epoch(rerun["eligible"])
    else:
        t_sub = epoch(json.loads((rerun_dir / protocol.SLURM_DIR / protocol.SLURM_SUBMITTED).read_text())
                      ["submitted_at"])
        r["exit_to_resubmit"] = t_sub - t_exit
        r["resubmit_to_start"] = t_start - t_sub
    slurm = r["prio_to_sig"] + r.get("exit_to_eligible", 0) + r.get("eligible_to_start", 0) + \
        r.get("resubmit_to_start", 0)
    r["slurm_s"], r["orch_s"] = slurm, r["prio_to_first"] - slurm
    print(f"  {name}: prio at step ~{target}; stopped at {r['last']} (saved {r['saved']}), resumed {resumed}, "
          f"redone {r['redone']}; SIGTERM {r['prio_to_sig']:.1f} s after prio, first resumed step "
          f"{r['sig_to_first']:.1f} s after SIGTERM; {r['state']}, {r['attempts']} attempt(s)", flush=True)
    return r


def cell(rows: list[dict], key: str, unit: str = " s", d: int = 1) -> str:
    xs = [r[key] for r in rows if key in r]
    if not xs:
        return "—"
    if len(xs) == 1:
        return f"{xs[0]:.{d}f}{unit}"
    return f"{statistics.median(xs):.{d}f} ({min(xs):.{d}f}–{max(xs):.{d}f}){unit}"


def table(spot: list[dict], cancel: list[dict]) -> str:
    def both(label: str, key: str, unit: str = " s", d: int = 1) -> list[str]:
        return [label, cell(spot, key, unit, d), cell(cancel, key, unit, d)]

    def count(rows: list[dict], ok) -> str:
        return f"{sum(1 for r in rows if ok(r))}/{len(rows)}" if rows else "—"

    rows = [
        both("steps redone (last step logged − resumed_from_step)", "redone", "", 0),
        ["stopped at step → resumed from", ", ".join(f"{r['last']}→{r['resumed']}" for r in spot) or "—",
         ", ".join(f"{r['last']}→{r['resumed']}" for r in cancel) or "—"],
        both("micro-batches of the step in flight discarded", "discarded", "", 0),
        both("Slurm: prio job submitted → SIGTERM in the trainer", "prio_to_sig"),
        both("trainer: SIGTERM → exit (checkpoint + failure.json)", "sig_to_exit", " s", 2),
        both("Slurm: exit → requeued job eligible (BeginTime)", "exit_to_eligible"),
        both("Slurm: eligible → rerun started (sacct Start)", "eligible_to_start"),
        both("orch: exit → resubmitted by a reconcile pass (passes every ~1 s here)", "exit_to_resubmit"),
        both("Slurm: resubmitted → started (sacct Start)", "resubmit_to_start"),
        both("rerun started → first resumed step (wrapper, torch import, checkpoint load)", "start_to_first"),
        both("total: SIGTERM → first resumed step", "sig_to_first"),
        both("total: prio job submitted → first resumed step", "prio_to_first"),
        both("  of which Slurm (preemption decision + grace, requeue/start)", "slurm_s"),
        both("  of which orch + trainer (checkpoint, reconcile, start-up)", "orch_s"),
        ["failure.json class preempted", count(spot, lambda r: r["class"] == "preempted"),
         count(cancel, lambda r: r["class"] == "preempted")],
        ["ended done_marker_verified, `orch verify` VERIFIED", count(spot, lambda r: r["state"] == DONE
                                                                   and r["verified"]),
         count(cancel, lambda r: r["state"] == DONE and r["verified"])],
        ["orch attempts / Slurm in-place restarts", ", ".join(f"{r['attempts']}/{r['restarts']}" for r in spot)
         or "—", ", ".join(f"{r['attempts']}/{r['restarts']}" for r in cancel) or "—"],
    ]
    return C.table(["", f"spot (REQUEUE: Slurm requeues in place), {len(spot)} trials",
                    f"spot-cancel (CANCEL: orch requeues), {len(cancel)} trial(s)"], rows)


def slurm_config() -> str:
    out = sh("scontrol", "show", "config").stdout
    keep = ("AuthInfo", "KillWait", "PreemptMode", "PreemptType", "SchedulerParameters", "SLURM_VERSION")
    vals = [re.sub(r"\s+=\s+", "=", ln.strip()) for ln in out.splitlines() if ln.split("=")[0].strip() in keep]
    parts = sh("scontrol", "show", "partition", "-o").stdout
    grace = sorted(set(re.findall(r"PartitionName=(\S+).*?GraceTime=(\d+)", parts)))
    return "; ".join(vals) + "; GraceTime " + ", ".join(f"{p}={g} s" for p, g in grace)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3, help="preemptions on spot (Slurm requeues in place)")
    ap.add_argument("--cancel-trials", type=int, default=1, help="preemptions on spot-cancel (orch requeues)")
    ap.add_argument("--max-steps", type=int, default=2500)
    ap.add_argument("--sleep-per-step", type=float, default=0.0,
                    help="the trainer's --sleep-per-step (--quick: 0.05 s, so 600 steps outlast the preemption)")
    ap.add_argument("--save-interval", type=int, default=200)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--wait-limit", type=float, default=3600, help="seconds to wait for a busy cluster")
    ap.add_argument("--no-write", action="store_true")
    C.add_quick(ap)
    args = ap.parse_args()
    if args.quick:  # one in-place requeue (the run must outlast Slurm's preemption delay)
        args.trials, args.cancel_trials, args.wait_limit, args.no_write = 1, 0, 300, True
        # 2,500 steps at the trainer's own speed (21-54 steps/s with load) took ~100 s; slept steps take a known time
        args.max_steps, args.sleep_per_step = 600, 0.05
    if shutil.which("sbatch") is None or sh("sinfo", "-h").returncode != 0:
        print("no Slurm cluster here (sinfo failed); see deploy/slurm/README.md", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    home = Path(tempfile.mkdtemp(prefix="orch-bench-p4slurm-", dir="/tmp"))
    orch, prio_ids, results, waited, loads, skipped, fleet = Orch(home), [], [], 0.0, [], "", ""
    t_begin = time.time()
    try:
        plan = ["spot"] * args.trials + ["spot-cancel"] * args.cancel_trials
        for i, partition in enumerate(plan):
            try:
                waited += wait_for_cluster(args.wait_limit)
            except ClusterBusy as e:  # keep (and report) the trials already measured
                skipped = f"{len(plan) - i} of {len(plan)} planned trials not run: {e}. "
                print(skipped, flush=True)
                waited += args.wait_limit
                break
            loads.append(os.getloadavg()[0])
            print(f"trial {i + 1}/{len(plan)} on {partition} (1-min load {loads[-1]:.1f})", flush=True)
            for tries in range(3):
                try:
                    results.append(trial(orch, partition, i + 100 * tries, args, rng, prio_ids))
                    break
                except NotPreempted as e:  # a trial that measured nothing: run it again with more steps
                    sh("scancel", *orch.slurm_ids(), *prio_ids)
                    args.max_steps *= 2
                    print(f"  {e}; again with --max-steps {args.max_steps}", flush=True)
            else:
                raise RuntimeError(f"no preemption measured in 3 tries of trial {i + 1}")
            sh("scancel", *orch.slurm_ids(), *prio_ids)
        # `orch report` over these real-cluster jobs (preempted, requeued, resumed, done): the fleet
        # view a user reads, kept next to the per-trial table so its split can be checked against it.
        fleet = orch("report").stdout.rstrip() if results else ""
    finally:
        ids = list(prio_ids)
        try:
            ids += orch.slurm_ids()
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError):
            pass  # nothing submitted yet: no DB
        if ids:
            sh("scancel", *ids)
        shutil.rmtree(home, ignore_errors=True)
    if not results:
        print("nothing measured", file=sys.stderr)
        return 1
    spot = [r for r in results if r["partition"] == "spot"]
    cancel = [r for r in results if r["partition"] == "spot-cancel"]
    tab = table(spot, cancel)
    if fleet:
        tab += ("\n\n`orch report` over the same ORCH_HOME afterwards (every job above; the goodput split of "
                "docs/guides/goodput.md):\n\n```\n" + fleet + "\n```")
    print(tab)
    ok = all(r["state"] == DONE and r["verified"] and r["redone"] <= 1 and r["class"] == "preempted"
             for r in results) and all(r["attempts"] == 1 for r in spot) and all(r["attempts"] == 2 for r in cancel)
    notes = (
        f"Real Slurm {sh('sinfo', '-V').stdout.strip()} dev cluster (`deploy/slurm/cluster.sh`: one node, 2 CPUs, "
        f"shared with other work): {slurm_config()}. Each trial: `orch submit --backend slurm --partition "
        f"<p> --cpus-per-task 1 --mem 1G -- python -m orch_trainer --preset tiny --threads 1 --max-steps "
        f"{args.max_steps} --save-interval {args.save_interval} --log-interval 1 --heartbeat-interval 0.2`; "
        "`orch reconcile` every ~1 s (cron would run it every minute or so: on spot-cancel that delay adds to "
        "orch's share); at a uniformly random step a real `sbatch -p prio -c 2 --mem=200M --wrap 'sleep 2'` "
        "preempts the trainer. Slurm's own requeue delay was NOT shortened with `scontrol update "
        "StartTime=now`: the dev cluster's `AuthInfo=cred_expire=10` makes a requeued job eligible ~11 s "
        "after it ended (Slurm's default cred_expire of 120 s would make that ~2 min). SIGTERM reaches the "
        "batch job at the END of the partition's GraceTime (Slurm 22.05 without `preempt_send_user_signal` "
        "signals the batch process only then), which is most of \"prio → SIGTERM\". Times come from "
        "failure.json (`stop_requested_time`), the wrapper's exit.json, orch's submitted.json, sacct (Start "
        "and Eligible: whole seconds, so a split can be off by up to 1 s) and the trainer's heartbeats "
        "(every 0.2 s). Steps redone are counted from the trainer's per-step log, as in the local P4. "
        f"1-min load average at the trials' starts: {', '.join(f'{x:.1f}' for x in loads)}; waited "
        f"{waited:.0f} s in all for other tests/benchmarks to leave the cluster; run took "
        f"{(time.time() - t_begin) / 60:.1f} min. {skipped}Medians (min–max) over the trials.")
    if not args.no_write:
        C.replace_section(TITLE, C.preamble("bench_preemption_slurm.py", notes) + "\n" + tab + "\n")
        print(f"wrote section '{TITLE}' of {C.BENCHMARKS}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
