"""P7d measured: the checkpoint interval orch chooses (``--save-interval auto``) against fixed intervals, in a REAL run
with injected kills: the bundled trainer under orch on the local backend, kill -9 at Poisson times, orch recovering.

The simulation (bench/bench_interval.py) models a day-long job; this run checks the same mechanism for real at a
scale that fits minutes on 2 cores. What runs, in one ORCH_HOME, every strategy's job at the same time (so the
machine's load, which moves the trainer's start-up most, is the same for all of them):

* the job: ``bench/_interval_job.py``, the bundled trainer (``orch_trainer``'s own ``main()``, tiny preset, one
  thread, batch 2) with each step paced to at least ``--step-s`` (50 ms; the model computes ~5-15 ms of it) and
  ``--save-s`` (0.5 s) added to every checkpoint save, blocking (``--no-background-save``): a save the loop
  visibly waits for, as a bigger model's would. ``--save-interval auto`` is handed M = 1/λ (``--mtbf-s``, which
  replaces the ``ORCH_MTBF_S`` orch set: orch's own estimate starts at its 24 h prior and would need days of such
  kills to come down to seconds; the trainer's log keeps what orch handed);
* the kills: attempt n's program gets SIGKILL at age a_n of held time, counted from its start as orch's job
  wrapper records it (``wrapper.json``), unless it has ended; a_1, a_2, ... are exponential with mean M = 1/λ,
  drawn up front from one seeded generator (a Poisson process in held time, start-up and saves included:
  memoryless, so one draw per attempt is the same process), the same ages for every strategy;
* the recovery: orch alone. ``orch reconcile --watch 0.5`` runs beside it; each kill is classified ``killed`` and
  requeued from the newest committed checkpoint. ``orch.toml`` sets ``crash_backoff_s = 0`` (the default 30 s
  back-off per kill would be most of the run), ``max_attempts = 1000``, ``[policy.caps] killed = 1000`` and
  ``no_progress_attempts = 0`` (a kill before the next save is this bench's normal case, not a stuck job);
* the strategies: ``auto`` (submitted first); once it has measured its save cost C (its first save's
  ``save_cost_s``) and step time, every 10 steps (the trainer's default), every N steps with N = Daly's τ for C
  and M in steps, and every 2·N steps.

Measured per strategy, from orch's own accounting (``orch show NAME --json``: the goodput split of every attempt):
goodput (useful / held), lost work and steps redone per kill, save stall, start-up; the interval auto chose (its
heartbeats' ``save_interval_s``). Cross-checked by the bench's own count: steps logged again after each kill
(``stderr.log``, ``--log-interval 1``: exact, where orch reads steps from heartbeats 0.1 s apart), and
useful steps × step time (from the heartbeats) / the held time the bench saw (wrapper start -> the program's end
in /proc). Lost work per kill is compared with half the interval in compute seconds (auto: the
``save_interval_s`` in force at the kill; fixed: N × orch's step time).

Run: ``.venv/bin/python bench/bench_interval_real.py`` (5–6 minutes): prints the table and writes the section
after P7d in BENCHMARKS.md; ``--quick`` is CI's smoke run (two strategies, one kill each, nothing written; the exit
code says only whether orch recovered every kill, verified the job and lost at most one interval per kill).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common as C

from orchestrator import protocol
from orchestrator.kit.interval import daly_interval

TITLE = "Checkpoint interval chosen by orch, real run with injected kills (P7d, measured)"
AFTER = "Checkpoint interval chosen by orch (P7d)"
JOB = Path(__file__).resolve().parent / "_interval_job.py"
STOP = threading.Event()  # set when the run is over: a failed run's threads must not write into its removed dir
STEP_RE = re.compile(r"\[trainer\] step (\d+)/")
HANDED_RE = re.compile(r"orch handed ([0-9.]+|none)")
ORCH_TOML = """[policy]
crash_backoff_s = 0
max_attempts = 1000
no_progress_attempts = 0
[policy.caps]
killed = 1000
"""


@dataclass
class Kill:
    attempt: int
    age_s: float  # the attempt's age (held time, from its wrapper's recorded start) when it was killed


@dataclass
class Outcome:
    label: str
    fixed: int | None  # steps between saves; None: auto
    name: str  # the job's
    run_dir: Path
    t0: float  # monotonic, at submit
    kills: list[Kill] = field(default_factory=list)
    held_seen: float = 0.0  # the program's start (its wrapper's record) -> its end as the bench saw it in /proc
    wall: float = 0.0
    show: dict = field(default_factory=dict)


def env(home: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "SLURM_"))}
    e.update(ORCH_HOME=str(home), PYTHONPATH=str(C.ROOT), PYTHONUNBUFFERED="1")
    return e


def orch(home: Path, *args: str) -> str:
    p = subprocess.run([C.PY, "-m", "orchestrator.cli", *args], capture_output=True, text=True, env=env(home),
                       cwd=str(C.ROOT), timeout=180)
    if p.returncode != 0:
        raise RuntimeError(f"orch {' '.join(args)} exited {p.returncode}: {p.stdout}{p.stderr}")
    return p.stdout


def wrapper_record(run_dir: Path, n: int) -> dict | None:
    """What orch's job wrapper wrote when it started attempt ``n``'s program: its pid and the held time's start."""
    try:
        return json.loads((protocol.attempt_dir(run_dir, n) / protocol.WRAPPER_FILE).read_text())
    except (OSError, ValueError):
        return None


def running(pid: int, run_dir: Path, n: int) -> bool:
    """``pid`` is still attempt ``n``'s program (a pid reused by another process is not)."""
    try:
        env_ = set((Path(f"/proc/{pid}") / "environ").read_bytes().split(b"\0"))
    except OSError:
        return False
    return (f"{protocol.ENV_RUN_DIR}={run_dir}".encode() in env_
            and f"{protocol.ENV_ATTEMPT}={n}".encode() in env_)


def drive(home: Path, out: Outcome, rate: float, seed: int, max_kills: int, deadline: float) -> None:
    """Kill attempt n's program at age ages[n] (held time, from its wrapper's start) until the job's marker
    verifies; orch alone recovers each kill. The ages are drawn up front: attempt n of every strategy gets the
    same one."""
    rng = random.Random(seed)
    ages = [rng.expovariate(rate) for _ in range(max_kills)]
    n = 1
    while not protocol.verify_done_marker(out.run_dir).verified:
        if STOP.is_set():
            return
        if time.time() > deadline:
            raise RuntimeError(f"{out.name} not verified in time:\n{orch(home, 'show', out.name)}")
        w = wrapper_record(out.run_dir, n)
        if w is None or not running(pid := int(w["child_pid"]), out.run_dir, n):
            if (protocol.attempt_dir(out.run_dir, n) / protocol.EXIT_FILE).exists():
                n += 1  # it ended before this loop saw it run (a fast last attempt)
            time.sleep(0.05)
            continue
        start = datetime.fromisoformat(w["started_at"]).timestamp()
        age = ages[n - 1] if n <= len(ages) else math.inf
        while running(pid, out.run_dir, n) and time.time() < start + age and not STOP.is_set():
            time.sleep(min(0.02, max(0.001, start + age - time.time())))
        if STOP.is_set():
            return
        if running(pid, out.run_dir, n):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended between the check and the kill: not a kill
                out.held_seen += time.time() - start
                n += 1
                continue
            out.kills.append(Kill(n, time.time() - start))
            print(f"    {out.name}: killed attempt {n} at age {out.kills[-1].age_s:.2f} s", flush=True)
        out.held_seen += time.time() - start
        n += 1
    while (show := json.loads(orch(home, "show", out.name, "--json")))["state"] != "done_marker_verified":
        if time.time() > deadline + 60:
            raise RuntimeError(f"{out.name}: the marker verifies but orch says {show['state']}")
        time.sleep(0.3)
    out.show = show


def submit(home: Path, label: str, fixed: int | None, a: argparse.Namespace) -> Outcome:
    name = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    interval = ["--save-interval", "auto" if fixed is None else str(fixed)]
    cmd = [C.PY, str(JOB), "--save-s", str(a.save_s), "--step-s", str(a.step_s), "--mtbf-s", f"{a.mtbf_s:g}", "--",
           "--preset", "tiny", "--threads", "1", "--batch-size", "2", "--max-steps", str(a.max_steps), *interval,
           "--no-background-save", "--keep-last-k", "2", "--log-interval", "1", "--heartbeat-interval", "0.1"]
    print(f"  {label}: {a.max_steps} steps, kills at rate 1/{a.mtbf_s:g} s", flush=True)
    orch(home, "submit", "--name", name, "--", *cmd)
    return Outcome(label, fixed, name, home / "runs" / name, time.monotonic())


def auto_interval_steps(o: Outcome, deadline: float) -> tuple[int, float]:
    """(N, C): the interval ``auto`` chose at its second save (Daly's τ for its measured C and M), in steps of its
    median step time so far, and that C. Not from its first save: the first steps, four trainers starting at once
    on a loaded machine, ran at 2-3x the paced step time and made N a third of auto's interval."""
    while time.time() < deadline:
        hb = [b for n in range(1, 100) if protocol.attempt_dir(o.run_dir, n).is_dir() for b in beats(o.run_dir, n)]
        second = next((b for b in hb if b.get("saved_step", 0) > 1 and "save_interval_s" in b), None)
        if second is None and protocol.verify_done_marker(o.run_dir).verified:  # --quick: a short job
            second = next((b for b in reversed(hb) if "save_cost_s" in b), None)
        if second is not None:
            return max(1, round(second["save_interval_s"] / step_time(hb))), float(second["save_cost_s"])
        time.sleep(0.1)
    raise RuntimeError(f"auto made no second save:\n{orch(o.run_dir.parents[1], 'show', o.name)}")


def run_all(home: Path, a: argparse.Namespace, outs: list[Outcome]) -> tuple[list[Outcome], float]:
    """``auto`` and the default interval first; once auto has chosen its interval, the fixed ones near it: all of
    them at once (the same machine load for every strategy), each driven by its own thread. Returns auto's C."""
    deadline = time.time() + a.limit_s
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []

    def go(o: Outcome) -> None:
        try:
            drive(home, o, 1 / a.mtbf_s, a.seed, a.max_kills, deadline)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        o.wall = time.monotonic() - o.t0

    def start(label: str, fixed: int | None) -> Outcome:
        outs.append(submit(home, label, fixed, a))  # the caller's list: it cancels what did not finish
        threads.append(threading.Thread(target=go, args=(outs[-1],), daemon=True))
        threads[-1].start()
        return outs[-1]

    auto = start("auto", None)
    start("every 10 steps (default)", 10)
    n_daly, cost = auto_interval_steps(auto, deadline)
    if not a.quick:
        start(f"every {n_daly} steps (≈ auto's)", n_daly)
        start(f"every {2 * n_daly} steps (2×)", 2 * n_daly)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return outs, cost


# ------------------------------------------------------------------------------------------------ reading
def logged_steps(run_dir: Path, n: int) -> list[int]:
    try:
        text = (protocol.attempt_dir(run_dir, n) / "stderr.log").read_text(errors="replace")
    except OSError:
        return []
    return [int(m.group(1)) for m in STEP_RE.finditer(text)]


def beats(run_dir: Path, n: int) -> list[dict]:
    return protocol.read_progress_history(run_dir, n)


def step_time(hb: list[dict]) -> float:
    """The median seconds per step from beat to beat, where no save came between (the bench's own reading)."""
    dts = [(y["time"] - x["time"]) / (y["step"] - x["step"]) for x, y in zip(hb, hb[1:], strict=False)
           if y["step"] > x["step"] and "saved_step" not in y and y.get("resumed_from") == x.get("resumed_from")]
    return statistics.median(dts) if dts else float("nan")


def resumed_from(run_dir: Path, n: int) -> int | None:
    """The step attempt ``n`` resumed from (its first heartbeat); None when it wrote none (killed in startup)."""
    b = beats(run_dir, n)
    return int(b[0].get("resumed_from") or 0) if b else None


def next_resume(run_dir: Path, n: int, attempts: int) -> int:
    """The step the first later attempt that got going resumed from: where the work of attempt ``n`` was cut back."""
    return next((r for m in range(n + 1, attempts + 1) if (r := resumed_from(run_dir, m)) is not None), 0)


@dataclass
class PerKill:
    attempt: int
    in_training: bool  # the killed attempt had computed a step
    redone_orch: int  # orch's steps_redone of the killed attempt
    redone_seen: int  # the bench's: its last logged step - the next attempt's resume step
    lost_s: float  # orch's lost_work seconds of the killed attempt
    half_interval_s: float  # half the interval in force, in compute seconds
    bound_steps: int  # the most a kill may lose: one interval, in steps
    resumed_ok: bool  # the next attempt resumed from a checkpoint at least as new as the last save it reported
    expected_s: float = 0.0  # what a kill uniform in the save cycle loses: τ(τ/2 + C)/(τ + C)


def per_kill(o: Outcome, step_s: float, cost_s: float) -> list[PerKill]:
    """Per kill: what orch and the bench count lost, against half the interval in force and the expectation for a
    kill uniform in the cycle of τ computing and C saving (a kill during a save loses the whole τ: that save never
    committed)."""
    att = {x["n"]: x for x in o.show["goodput"]["attempts"]}
    rows = []
    for k in o.kills:
        g = att.get(k.attempt, {})
        steps = logged_steps(o.run_dir, k.attempt)
        nxt = next_resume(o.run_dir, k.attempt, len(att))
        hb = beats(o.run_dir, k.attempt)
        if o.fixed is not None:
            half, bound = o.fixed * (g.get("step_time_s") or step_s) / 2, o.fixed
        else:  # the interval in force at the kill: the attempt's last beat that says, else its predecessor's
            ivs = [b["save_interval_s"] for m in range(k.attempt, 0, -1) for b in reversed(beats(o.run_dir, m))
                   if "save_interval_s" in b]
            iv = ivs[0] if ivs else 0.0
            # the most steps between two saves: the longest interval it used, each step >= step_s (the pacing)
            half, bound = iv / 2, math.ceil(max(ivs, default=0.0) / step_s) + 2
        saved = max([b["saved_step"] for b in hb if "saved_step" in b] + [resumed_from(o.run_dir, k.attempt) or 0])
        rows.append(PerKill(k.attempt, bool(steps), int(g.get("steps_redone") or 0),
                            max(0, (max(steps) if steps else 0) - nxt), float(g.get("seconds", {}).get("lost_work", 0)),
                            half, bound, nxt >= saved))
        rows[-1].expected_s = half * (2 * half + 2 * cost_s) / (2 * half + cost_s)
    return rows


def handed(o: Outcome, attempts: int) -> str:
    """The ORCH_MTBF_S orch itself handed the last attempt (the job replaced it; the trainer's log keeps it)."""
    try:
        m = HANDED_RE.search((protocol.attempt_dir(o.run_dir, attempts) / "stderr.log").read_text(errors="replace"))
    except OSError:
        m = None
    return m.group(1) if m else "?"


def mm(xs: list[float], d: int = 1, unit: str = "") -> str:
    if not xs:
        return "–"
    return f"{statistics.mean(xs):.{d}f} ({min(xs):.{d}f}–{max(xs):.{d}f}){unit}"


def summarize(o: Outcome, a: argparse.Namespace, cost: float) -> tuple[list[object], dict]:
    """One table row and the facts the result paragraph and the exit code use; ``cost``: auto's measured C."""
    g = o.show["goodput"]
    sec, held = g["seconds"], g["held_s"]
    ks = per_kill(o, a.step_s, cost)
    trained = [k for k in ks if k.in_training]
    step_t = statistics.median(x["step_time_s"] for x in g["attempts"] if x.get("step_time_s"))  # orch's
    if o.fixed is None:
        ivs = [b["save_interval_s"] for n in range(1, len(g["attempts"]) + 1) for b in beats(o.run_dir, n)
               if "saved_step" in b and "save_interval_s" in b]
        costs = [b["save_cost_s"] for n in range(1, len(g["attempts"]) + 1) for b in beats(o.run_dir, n)
                 if "saved_step" in b and "save_cost_s" in b]
        interval = f"auto: {statistics.median(ivs):.2f} s ≈ {statistics.median(ivs) / step_t:.0f} steps"
    else:
        ivs, costs = [o.fixed * step_t], []
        interval = f"{o.fixed} steps = {o.fixed * step_t:.2f} s"
    own_t = step_time([b for n in range(1, len(g["attempts"]) + 1) for b in beats(o.run_dir, n)])
    own = a.max_steps * own_t / o.held_seen if o.held_seen else float("nan")
    lost = [k.lost_s for k in trained]
    half = [k.half_interval_s for k in trained]
    dep = (sec["lost_work"] + sec["save_stall"]) / held  # the part of the badput the interval decides
    row = [o.label, interval, f"{len(o.kills)} ({len(trained)})",
           mm([k.redone_orch for k in trained]), mm([k.redone_seen for k in trained]),
           f"{statistics.mean(lost):.2f} s vs {statistics.mean(half):.2f} s; expected "
           f"{statistics.mean(k.expected_s for k in trained):.2f} s" if trained else "–",
           f"{100 * g['goodput']:.1f} %", f"{100 * own:.1f} %",
           f"{sec['lost_work']:.1f} + {sec['save_stall']:.1f} s = {100 * dep:.1f} %",
           f"{sec['startup'] + sec.get('failed_attempt', 0):.1f} s", f"{held:.1f} s", f"{o.wall:.0f} s"]
    facts = {"goodput": g["goodput"], "own": own, "dep": dep, "lost": lost, "half": half, "kills": len(o.kills),
             "expected": [k.expected_s for k in trained], "handed": handed(o, len(g["attempts"])),
             "lost_seen": [k.redone_seen * step_t for k in trained], "stall": sec["save_stall"],
             "trained": len(trained), "interval_s": statistics.median(ivs), "step_s": step_t,
             "cost_s": statistics.median(costs) if costs else None,
             "ok": (all(k.resumed_ok and k.redone_seen <= k.bound_steps for k in ks)
                    and all(x.get("failure_class") == "killed" for x in o.show["attempts"][:-1])
                    and len(o.show["attempts"]) == len(o.kills) + 1
                    and protocol.verify_done_marker(o.run_dir).verified),
             "classes": [x.get("failure_class") for x in o.show["attempts"]]}
    return row, facts


HEADERS = ["strategy", "interval (compute between saves)", "kills (in training)",
           "steps redone per kill in training (orch), mean (min–max)", "the same, counted in stderr.log",
           "lost work per kill in training (orch) vs half the interval; expected (kill uniform in the cycle)",
           "goodput (orch)", "goodput (bench's cross-check)", "lost work + save stall (orch), share of held",
           "startup + failed starts (orch)", "held (orch)", "wall"]


def start_reconciler(home: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([C.PY, "-m", "orchestrator.cli", "reconcile", "--watch", "0.5"], env=env(home),
                            cwd=str(C.ROOT), stdout=log.open("w"), stderr=subprocess.STDOUT)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=1000)
    ap.add_argument("--mtbf-s", type=float, default=15.0, help="M = 1/λ: mean held seconds between kills")
    ap.add_argument("--save-s", type=float, default=0.5, help="seconds added to every save")
    ap.add_argument("--step-s", type=float, default=0.05, help="every step takes at least this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-kills", type=int, default=40, help="no more kills after this many (a bound on the run)")
    ap.add_argument("--limit-s", type=float, default=420, help="give up (and cancel the jobs) after this long")
    ap.add_argument("--no-write", action="store_true")
    C.add_quick(ap)
    a = ap.parse_args()
    if a.quick:  # CI: every code path, tiny sizes, one kill per strategy, nothing written
        a.max_steps, a.mtbf_s, a.seed, a.max_kills, a.limit_s, a.no_write = 120, 10.0, 6, 1, 120, True
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="orch-bench-interval-"))
    home = work / "home"
    home.mkdir()
    (home / "orch.toml").write_text(ORCH_TOML)
    rec = start_reconciler(home, work / "reconcile.log")
    outs: list[Outcome] = []
    try:
        outs, cost = run_all(home, a, outs)
        tau = daly_interval(cost, a.mtbf_s)
        results = [summarize(o, a, cost) for o in outs]
    finally:
        STOP.set()
        for o in outs:  # a failed run leaves no trainer behind
            if not protocol.verify_done_marker(o.run_dir).verified:
                subprocess.run([C.PY, "-m", "orchestrator.cli", "cancel", o.name], env=env(home), cwd=str(C.ROOT),
                               capture_output=True, timeout=120)
        rec.send_signal(signal.SIGTERM)
        try:
            rec.wait(30)
        except subprocess.TimeoutExpired:
            rec.kill()
            rec.wait(10)
        load_after = os.getloadavg()[0]
        shutil.rmtree(work, ignore_errors=True)
    tab = (f"Load (1-min average): {load_before:.1f} before, {load_after:.1f} after.\n\n"
           + C.table(HEADERS, [r for r, _ in results]))
    print(tab)
    ok = all(f["ok"] for _, f in results)
    for (r, f) in results:
        if not f["ok"]:
            print(f"NOT OK: {r[0]}: classes {f['classes']}", flush=True)
    if not a.no_write:
        C.replace_section(TITLE, C.preamble("bench_interval_real.py", notes(a, load_before, load_after))
                          + "\n" + tab + "\n\n" + textwrap.fill(result_text(a, results, tau, cost), 115) + "\n",
                          after=AFTER)
    return 0 if ok else 1


def notes(a: argparse.Namespace, lb: float, la: float) -> str:
    return (f"Measured (the set-up in bench/bench_interval_real.py's docstring): the bundled trainer under orch on "
            f"the local backend, {a.max_steps} steps paced to ≥ {a.step_s * 1e3:.0f} ms, every save made "
            f"{a.save_s:g} s slower and blocking; SIGKILL of the program at exponential ages with mean "
            f"M = {a.mtbf_s:g} s of held time (seed {a.seed}; attempt n of every strategy dies at the same age); orch "
            "alone recovers each kill (`orch reconcile --watch 0.5`, class `killed`, `crash_backoff_s = 0`). `auto` "
            f"is given M = 1/λ = {a.mtbf_s:g} s (the simulation's oracle column). The four jobs run at the same "
            f"time, one run each; 1-min load average {lb:.1f} before, {la:.1f} after (2 cores, shared with other "
            "work). Goodput, steps redone, lost work, save stall, start-up and held time are orch's own (`orch show "
            "--json`'s goodput split; orch reads steps from heartbeats 0.1 s apart, so its steps redone can be a "
            "heartbeat short); the bench's own counts are the steps logged again after each kill and useful steps "
            "× step time / the held time it saw. \"In training\": the killed attempt had logged a step (a kill in "
            "start-up loses no steps, only the start-up).")


def result_text(a: argparse.Namespace, results: list[tuple[list[object], dict]], tau: float, cost: float) -> str:
    """The plain result, every figure from this run."""
    f = {r[0]: x for r, x in results}
    auto, default = f["auto"], results[1][1]

    def ratio(x: dict, key: str, se: bool = False) -> str:
        half = statistics.mean(x["half"])
        err = statistics.stdev(x[key]) / math.sqrt(len(x[key])) / half if se and len(x[key]) > 1 else None
        return f"{statistics.mean(x[key]) / half:.2f}" + (f" ± {err:.2f}" if err is not None else "")

    ratios = "; ".join(f"{r[0]} {ratio(x, 'lost')} by orch's count, {ratio(x, 'lost_seen', True)} by the bench's "
                       f"(expected {ratio(x, 'expected')})" for r, x in results if x["lost"])
    others = ", ".join(f"{100 * x['goodput']:.1f} % ({r[0]})" for r, x in results[1:])
    deps = ", ".join(f"{100 * x['dep']:.1f} % ({r[0]})" for r, x in results)
    near = results[2][1] if len(results) > 2 else auto
    return (f"**Result, plainly:** auto measured C = {cost:.2f} s and saved every {auto['interval_s']:.2f} s of "
            f"compute (Daly's τ for that C and M = {a.mtbf_s:g} s: {tau:.2f} s); orch's goodput for it was "
            f"{100 * auto['goodput']:.1f} %, against {others}. The part of the held time the interval decides "
            f"(lost work + save stall): {deps}. The default's deficit is its save stall "
            f"({default['stall']:.0f} s: a 0.5 s save every 10 steps), which does not depend on where the kills "
            f"land; auto and the fixed interval next to it are {100 * abs(auto['goodput'] - near['goodput']):.1f} pp "
            "apart, which one run per strategy cannot resolve. Start-up (a fresh interpreter, torch and the "
            "checkpoint load, several seconds under load; kills during it included) is most of the rest of the "
            "held time, and costs every strategy the same per kill. Lost work per kill in training over half the "
            f"interval (means): {ratios}. The expectation is above 1 because a kill during a save loses the whole "
            "interval (that save never committed): τ(τ/2 + C)/(τ + C) for a kill uniform in the cycle of τ "
            "computing and C saving. orch's count reads steps from heartbeats 0.1 s (2 steps) apart, which matters "
            f"for a 10-step interval. {sum(x['kills'] for x in f.values())} kills in all, "
            f"{sum(x['trained'] for x in f.values())} of them in training (± is one standard error of the "
            "bench's mean). orch's own M for this "
            f"ORCH_HOME (all four jobs' kills), handed to auto's last attempt in ORCH_MTBF_S and replaced by 1/λ "
            f"here, was {auto['handed']} s: after a few minutes of held time the 24 h prior still dominates it, so "
            "without the oracle auto would have saved far too rarely in this run.")


if __name__ == "__main__":
    sys.exit(main())
