"""P7d measured: the checkpoint interval orch chooses (``--save-interval auto``) against fixed intervals, in a REAL run
with injected kills: the bundled trainer under orch on the local backend, kill -9 at Poisson times, orch recovering.

The simulation (bench/bench_interval.py) models a day-long job; this run checks the same mechanism for real at a
scale that fits minutes on 2 cores. What runs, per strategy, one after the other in one ORCH_HOME:

* the job: ``bench/_interval_job.py``, the bundled trainer (``orch_trainer``'s own ``main()``, tiny preset, one
  thread) with each step paced to at least ``--step-s`` (50 ms: the model computes ~15 ms of it) and ``--save-s``
  (0.5 s) added to every checkpoint save, blocking (``--no-background-save``): a save the loop visibly waits for,
  as a bigger model's would. ``--save-interval auto`` is handed M = 1/λ (``--mtbf-s``, which replaces the
  ``ORCH_MTBF_S`` orch set: orch's own estimate starts at its 24 h prior and would need days of such kills to come
  down to seconds; the trainer's log keeps what orch handed);
* the kills: for each attempt, from when its program process appears (/proc), the bench draws an exponential time
  with mean M = 1/λ and sends SIGKILL to the program then, unless it has ended: a Poisson process in held time,
  startup and saves included (memoryless, so a fresh draw per attempt is the same process). The draws come from
  one seeded generator per strategy with the same seed, so attempt k of every strategy dies at the same age;
* the recovery: orch alone. ``orch reconcile --watch 0.5`` runs beside it; each kill is classified ``killed`` and
  requeued from the newest committed checkpoint. ``orch.toml`` sets ``crash_backoff_s = 0`` (the default 30 s
  back-off per kill would be most of the run), ``max_attempts = 1000``, ``[policy.caps] killed = 1000`` and
  ``no_progress_attempts = 0`` (a kill before the next save is this bench's normal case, not a stuck job);
* the strategies: ``auto``; every 10 steps (the trainer's default); every N steps with N = Daly's τ for the save
  cost auto measured (its ``save_cost_s``) and M, in steps; every 4·N steps (too long).

Measured per strategy, from orch's own accounting (``orch show NAME --json``: the goodput split of every attempt):
goodput (useful / held), lost work and steps redone per kill, save stall, startup; the interval auto chose (its
heartbeats' ``save_interval_s``). Cross-checked by the bench's own count: steps logged again in the next
attempt's ``stderr.log`` (``--log-interval 1``) per kill, and useful steps × step time / the held time the bench
saw (program start -> end in /proc). Lost work per kill is compared with half the interval in compute seconds
(auto: the ``save_interval_s`` in force at the kill; fixed: N × step time).

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
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common as C  # noqa: E402

from orchestrator import protocol  # noqa: E402
from orchestrator.kit.interval import daly_interval  # noqa: E402

TITLE = "Checkpoint interval chosen by orch, real run with injected kills (P7d, measured)"
AFTER = "Checkpoint interval chosen by orch (P7d)"
JOB = Path(__file__).resolve().parent / "_interval_job.py"
STEP_RE = re.compile(r"\[trainer\] step (\d+)/")
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
    age_s: float  # the attempt's age (since its program appeared) when it was killed


@dataclass
class Outcome:
    name: str
    fixed: int | None  # steps between saves; None: auto
    kills: list[Kill] = field(default_factory=list)
    held_seen: float = 0.0  # program start -> end, summed over attempts, as the bench saw it in /proc
    wall: float = 0.0
    show: dict = field(default_factory=dict)
    run_dir: Path = Path()


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


def attempt_of(pid: int) -> int | None:
    try:
        env_ = (Path(f"/proc/{pid}") / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    key = f"{protocol.ENV_ATTEMPT}=".encode()
    return next((int(v[len(key):]) for v in env_ if v.startswith(key)), None)


def alive(pid: int, attempt: int) -> bool:
    """The program of ``attempt`` still runs (a reaped pid reused by another process is not it)."""
    return attempt_of(pid) == attempt


def drive(home: Path, name: str, run_dir: Path, rate: float, seed: int, max_kills: int, limit_s: float,
          out: Outcome) -> None:
    """Kill each attempt's program at an exponential age until the job's marker verifies; orch recovers it."""
    rng = random.Random(seed)
    t0, seen = time.monotonic(), 0
    while not protocol.verify_done_marker(run_dir).verified:
        if time.monotonic() - t0 > limit_s:
            raise RuntimeError(f"{name} not verified within {limit_s:.0f} s:\n{orch(home, 'show', name)}")
        pid = C.program_pid(run_dir, JOB.name)
        n = attempt_of(pid) if pid else None
        if pid is None or n is None or n <= seen:
            time.sleep(0.05)
            continue
        seen, start = n, time.monotonic()
        age = rng.expovariate(rate) if len(out.kills) < max_kills else math.inf
        while alive(pid, n) and time.monotonic() - start < age:
            time.sleep(min(0.02, max(0.0, age - (time.monotonic() - start))))
        if alive(pid, n):
            os.kill(pid, signal.SIGKILL)
            out.kills.append(Kill(n, time.monotonic() - start))
            print(f"    killed attempt {n} at age {out.kills[-1].age_s:.2f} s", flush=True)
        out.held_seen += time.monotonic() - start
    deadline = time.monotonic() + 60
    while (show := json.loads(orch(home, "show", name, "--json")))["state"] != "done_marker_verified":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: the marker verifies but orch says {show['state']}")
        time.sleep(0.3)
    out.show = show


def run_strategy(home: Path, label: str, fixed: int | None, a: argparse.Namespace) -> Outcome:
    name = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    interval = ["--save-interval", "auto" if fixed is None else str(fixed)]
    cmd = [C.PY, str(JOB), "--save-s", str(a.save_s), "--step-s", str(a.step_s), "--mtbf-s", f"{a.mtbf_s:g}", "--",
           "--preset", "tiny", "--threads", "1", "--max-steps", str(a.max_steps), *interval, "--no-background-save",
           "--keep-last-k", "2", "--log-interval", "1", "--heartbeat-interval", "0.1"]
    out = Outcome(label, fixed, run_dir=home / "runs" / name)
    print(f"  {label}: {a.max_steps} steps, kills at rate 1/{a.mtbf_s:g} s", flush=True)
    t0 = time.monotonic()
    orch(home, "submit", "--name", name, "--", *cmd)
    drive(home, name, out.run_dir, 1 / a.mtbf_s, a.seed, a.max_kills, a.limit_s, out)
    out.wall = time.monotonic() - t0
    return out


# ------------------------------------------------------------------------------------------------ reading
def logged_steps(run_dir: Path, n: int) -> list[int]:
    try:
        text = (protocol.attempt_dir(run_dir, n) / "stderr.log").read_text(errors="replace")
    except OSError:
        return []
    return [int(m.group(1)) for m in STEP_RE.finditer(text)]


def beats(run_dir: Path, n: int) -> list[dict]:
    return protocol.read_progress_history(run_dir, n)


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


def per_kill(o: Outcome, step_s: float) -> list[PerKill]:
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
            iv = next((b["save_interval_s"] for b in reversed(hb) if "save_interval_s" in b), None)
            iv = iv if iv is not None else next((b["save_interval_s"] for m in range(k.attempt - 1, 0, -1)
                                                 for b in reversed(beats(o.run_dir, m)) if "save_interval_s" in b), 0)
            half, bound = iv / 2, math.ceil(iv / step_s) + 1  # every step takes >= step_s (the pacing)
        saved = max([b["saved_step"] for b in hb if "saved_step" in b] + [resumed_from(o.run_dir, k.attempt) or 0])
        rows.append(PerKill(k.attempt, bool(steps), int(g.get("steps_redone") or 0),
                            max(0, (max(steps) if steps else 0) - nxt), float(g.get("seconds", {}).get("lost_work", 0)),
                            half, bound, nxt >= saved))
    return rows


def mm(xs: list[float], d: int = 1, unit: str = "") -> str:
    if not xs:
        return "–"
    return f"{statistics.mean(xs):.{d}f} ({min(xs):.{d}f}–{max(xs):.{d}f}){unit}"


def summarize(o: Outcome, a: argparse.Namespace) -> tuple[list[object], dict]:
    g = o.show["goodput"]
    sec, held = g["seconds"], g["held_s"]
    ks = per_kill(o, a.step_s)
    trained = [k for k in ks if k.in_training]
    step_t = statistics.median(x["step_time_s"] for x in g["attempts"] if x.get("step_time_s"))
    if o.fixed is None:
        ivs = [b["save_interval_s"] for n in range(1, len(g["attempts"]) + 1) for b in beats(o.run_dir, n)
               if "saved_step" in b and "save_interval_s" in b]
        costs = [b["save_cost_s"] for n in range(1, len(g["attempts"]) + 1) for b in beats(o.run_dir, n)
                 if "saved_step" in b and "save_cost_s" in b]
        interval = f"auto: {statistics.median(ivs):.2f} s ≈ {statistics.median(ivs) / step_t:.0f} steps"
    else:
        ivs, costs = [o.fixed * step_t], []
        interval = f"{o.fixed} steps = {o.fixed * step_t:.2f} s"
    own = a.max_steps * step_t / o.held_seen if o.held_seen else float("nan")
    lost = [k.lost_s for k in trained]
    half = [k.half_interval_s for k in trained]
    dep = (sec["lost_work"] + sec["save_stall"]) / held  # the part of the badput the interval decides
    row = [o.name, interval, f"{len(o.kills)} ({len(trained)})",
           mm([k.redone_orch for k in trained]), mm([k.redone_seen for k in trained]),
           f"{statistics.mean(lost):.2f} s vs {statistics.mean(half):.2f} s" if trained else "–",
           f"{100 * g['goodput']:.1f} %", f"{100 * own:.1f} %",
           f"{sec['lost_work']:.1f} + {sec['save_stall']:.1f} s = {100 * dep:.1f} %",
           f"{sec['startup'] + sec.get('failed_attempt', 0):.1f} s", f"{held:.1f} s", f"{o.wall:.0f} s"]
    facts = {"goodput": g["goodput"], "own": own, "dep": dep, "lost": lost, "half": half, "kills": len(o.kills),
             "trained": len(trained), "interval_s": statistics.median(ivs), "step_s": step_t,
             "cost_s": statistics.median(costs) if costs else None,
             "ok": (all(k.resumed_ok and k.redone_orch <= k.bound_steps for k in ks)
                    and all(x.get("failure_class") == "killed" for x in o.show["attempts"][:-1])
                    and len(o.show["attempts"]) == len(o.kills) + 1
                    and protocol.verify_done_marker(o.run_dir).verified),
             "classes": [x.get("failure_class") for x in o.show["attempts"]]}
    return row, facts


HEADERS = ["strategy", "interval (compute between saves)", "kills (in training)",
           "steps redone per kill in training (orch), mean (min–max)", "the same, counted in stderr.log",
           "lost work per kill in training (orch) vs half the interval", "goodput (orch)",
           "goodput (bench's cross-check)", "lost work + save stall (orch), share of held",
           "startup + failed starts (orch)", "held (orch)", "wall"]


def start_reconciler(home: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([C.PY, "-m", "orchestrator.cli", "reconcile", "--watch", "0.5"], env=env(home),
                            cwd=str(C.ROOT), stdout=log.open("w"), stderr=subprocess.STDOUT)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=500)
    ap.add_argument("--mtbf-s", type=float, default=15.0, help="M = 1/λ: mean held seconds between kills")
    ap.add_argument("--save-s", type=float, default=0.5, help="seconds added to every save")
    ap.add_argument("--step-s", type=float, default=0.05, help="every step takes at least this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-kills", type=int, default=40, help="no more kills after this many (a bound on the run)")
    ap.add_argument("--limit-s", type=float, default=400, help="give up on a strategy after this long")
    ap.add_argument("--no-write", action="store_true")
    C.add_quick(ap)
    a = ap.parse_args()
    if a.quick:  # CI: every code path, tiny sizes, one kill per strategy, nothing written
        a.max_steps, a.mtbf_s, a.seed, a.max_kills, a.limit_s, a.no_write = 60, 6.0, 5, 1, 120, True
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="orch-bench-interval-"))
    home = work / "home"
    home.mkdir()
    (home / "orch.toml").write_text(ORCH_TOML)
    rec = start_reconciler(home, work / "reconcile.log")
    results: list[tuple[list[object], dict]] = []
    try:
        auto = run_strategy(home, "auto", None, a)
        results.append(summarize(auto, a))
        f = results[0][1]
        tau = daly_interval(f["cost_s"], a.mtbf_s)
        n_daly = max(1, round(tau / f["step_s"]))
        fixed = [10] if a.quick else [10, n_daly, 4 * n_daly]
        for n in fixed:
            label = f"every {n} steps" + (" (default)" if n == 10 else " (Daly τ)" if n == n_daly else " (4 τ)")
            results.append(summarize(run_strategy(home, label, n, a), a))
    finally:
        rec.send_signal(signal.SIGTERM)
        try:
            rec.wait(30)
        except subprocess.TimeoutExpired:
            rec.kill()
            rec.wait(10)
        load_after = os.getloadavg()[0]
        shutil.rmtree(work, ignore_errors=True)
    tab = C.table(HEADERS, [r for r, _ in results])
    print(tab)
    ok = all(f["ok"] for _, f in results)
    for (r, f) in results:
        if not f["ok"]:
            print(f"NOT OK: {r[0]}: classes {f['classes']}", flush=True)
    if not a.no_write:
        C.replace_section(TITLE, C.preamble("bench_interval_real.py", notes(a, results, load_before, load_after))
                          + "\n" + tab + "\n\n" + textwrap.fill(result_text(a, results, tau), 115) + "\n",
                          after=AFTER)
    return 0 if ok else 1


def notes(a: argparse.Namespace, results: list[tuple[list[object], dict]], lb: float, la: float) -> str:
    return (f"Measured (model in bench/bench_interval_real.py's docstring): the bundled trainer under orch on the "
            f"local backend, {a.max_steps} steps paced to ≥ {a.step_s * 1e3:.0f} ms, every save made {a.save_s:g} s "
            f"slower and blocking; SIGKILL of the program at exponential ages with mean M = {a.mtbf_s:g} s of held "
            f"time (seed {a.seed}, the same ages attempt by attempt for every strategy); orch alone recovers each "
            "kill (`orch reconcile --watch 0.5`, class `killed`, `crash_backoff_s = 0`). `auto` is given "
            f"M = 1/λ = {a.mtbf_s:g} s (as the simulation's oracle column). One run per strategy, 1-min load "
            f"average {lb:.1f} before, {la:.1f} after (2 cores, shared). Goodput, lost work, save stall, startup "
            "and held time are orch's own (`orch show --json`'s goodput split); the cross-check is the bench's: "
            "steps logged again after each kill, and useful steps × step time / the held time it saw in /proc.")


def result_text(a: argparse.Namespace, results: list[tuple[list[object], dict]], tau: float) -> str:
    f = {r[0]: x for r, x in results}
    auto = f["auto"]
    lost = [v for x in f.values() for v in x["lost"]]
    half = [v for x in f.values() for v in x["half"]]
    ratios = ", ".join(f"{r[0]} {statistics.mean(x['lost']) / statistics.mean(x['half']):.2f}"
                       for r, x in results if x["lost"])
    best = max(results, key=lambda rx: rx[1]["goodput"])
    others = ", ".join(f"{100 * x['goodput']:.1f} % ({r[0]})" for r, x in results[1:])
    return (f"**Result, plainly:** auto measured C = {auto['cost_s']:.2f} s and saved every "
            f"{auto['interval_s']:.2f} s of compute (Daly's τ for C and M = {a.mtbf_s:g} s: {tau:.2f} s); its goodput "
            f"was {100 * auto['goodput']:.1f} % against {others}; "
            f"the best here was {best[0][0]}. Lost work per kill in training over half the interval, mean over "
            f"mean: {ratios}; pooled, {sum(lost) / max(1, len(lost)):.2f} s per kill against "
            f"{sum(half) / max(1, len(half)):.2f} s. A kill during a save loses the whole interval (that save never "
            "committed), so the expected loss is a little above half the interval: τ(τ/2 + C)/(τ + C) for a kill "
            "uniform in the cycle. Kills during startup lose no steps (they are counted, not in the per-kill mean). "
            f"With {sum(x['kills'] for x in f.values())} kills in all, one run per strategy, these are few samples: "
            "a difference of a few percentage points between strategies is within the noise of one run.")


if __name__ == "__main__":
    sys.exit(main())
