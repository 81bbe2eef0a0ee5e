#!/usr/bin/env python3
"""P3 checkpoint cost and P5 trainer overhead, measured on this machine (not timed tests).

(a) Verified save: ``CheckpointManager.save`` of a ~100 MB state (tmp dir, sha256 computed while
    writing, every file fsynced, manifest, rename, directory fsyncs) vs ``torch.save`` + fsync of the
    same state to the same disk. Goal: ratio <= 1.10. The inline-hash variant (protocol.HashingWriter,
    hash in the writing thread) is shown for context: it is why the hash runs in a helper thread.
(b) Training-visible stall per checkpoint: a 48-step loop on a ~84 MB MLP saving 6 times, with the
    background save vs a blocking ``torch.save`` + fsync. The stall is the time the training thread is
    blocked in the save call (goal: ratio <= 0.5); for context, also the extra loop time of the steps
    that called a save or overlapped its background write, against the loop's own median step (CPU
    contention from the writer included; noisy on a shared machine).
(c) Trainer step overhead: ``trainer.loop.Trainer`` on the tiny preset vs a plain torch loop doing
    the same compute (same model, data, AdamW, LR schedule, clipping; it reads no loss at all).
    Goal: <= 3 %.

Each figure is the median of ``--runs`` (>= 5) interleaved repetitions, with the min-max range.
Usage: ``.venv/bin/python bench/bench_trainer.py [--runs N] [--dir DIR] [--no-write] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import _common as C  # noqa: E402
import torch  # noqa: E402

from orchestrator import protocol  # noqa: E402
from orchestrator.kit.checkpoint import CheckpointManager  # noqa: E402

TITLE = "Trainer (P3, P5)"


def _fsynced_torch_save(obj: object, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _inline_hash_save(obj: object, path: Path) -> None:
    with open(path, "xb") as f:
        w = protocol.HashingWriter(f)
        torch.save(obj, w)
        f.flush()
        os.fsync(f.fileno())


def bench_save(work: Path, runs: int) -> dict[str, list[float]]:
    state = {f"layer{i}.weight": torch.randn(1024, 1024) for i in range(25)}  # 104.9 MB
    out: dict[str, list[float]] = {"torch.save + fsync": [], "verified save (CheckpointManager)": [],
                                   "verified save, torch CRC32 kept": [],
                                   "inline hash (protocol.HashingWriter) + fsync": []}
    for i in range(runs + 1):  # the first round warms the page cache and allocator; not recorded
        for name in out:
            d = work / f"save-{i}-{len(name)}"
            d.mkdir()
            os.sync()
            t0 = time.perf_counter()
            if name.startswith("torch.save"):
                _fsynced_torch_save(state, d / "model.pt")
            elif name.startswith("verified"):
                CheckpointManager(d, keep_last_k=1, torch_crc32="CRC32" in name).save(1, {"model.pt": state})
            else:
                _inline_hash_save(state, d / "model.pt")
            dt = time.perf_counter() - t0
            shutil.rmtree(d)
            if i:
                out[name].append(dt)
    return out


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(5)])  # 21M params, 84 MB


def _loop(model: torch.nn.Module, mode: str, work: Path, steps: int, save_at: tuple[int, ...]
          ) -> tuple[list[float], list[float]]:
    """(stall of each save, seconds the training thread spent inside each save call).

    A save's stall = the extra time of the step that called it and of every later step that started
    while it was still in flight (background), over the median of this loop's other steps, plus any
    wait for it at the end. Measured within one loop, per save, so that a burst of load from other
    processes moves the baseline too and spoils one sample rather than the figure.
    """
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(16, 2048)
    mgr = CheckpointManager(work / f"bg-{mode}", keep_last_k=1)
    calls: list[float] = []
    durations: list[float] = []
    owner: list[int | None] = []  # which save a step's extra time belongs to
    for s in range(1, steps + 1):
        busy = mgr.in_flight
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        if s in save_at:
            tc = time.perf_counter()
            if mode == "background":
                mgr.save(s, {"model.pt": model.state_dict()}, background=True)
            else:
                _fsynced_torch_save(model.state_dict(), work / f"blocking-{s}.pt")
            calls.append(time.perf_counter() - tc)
        durations.append(time.perf_counter() - t0)
        owner.append(len(calls) - 1 if (s in save_at or busy) else None)
    t0 = time.perf_counter()
    mgr.wait()  # the loop cannot end before its last save committed: counted
    tail = time.perf_counter() - t0
    shutil.rmtree(work / f"bg-{mode}", ignore_errors=True)
    for p in work.glob("blocking-*.pt"):
        p.unlink()
    med = statistics.median(d for d, o in zip(durations, owner, strict=True) if o is None)
    stalls = [0.0] * len(save_at)
    for d, o in zip(durations, owner, strict=True):
        if o is not None:
            stalls[o] += d - med
    stalls[-1] += tail
    return stalls, calls


def bench_stall(work: Path, runs: int) -> dict[str, list[float]]:
    model, steps, save_at = _mlp(), 48, (4, 12, 20, 28, 36, 44)
    out: dict[str, list[float]] = {k: [] for k in ("background", "blocking")}
    out.update({"background call": [], "blocking call": []})
    _loop(model, "blocking", work, 6, (5,))
    for _ in range(runs):
        for mode in ("background", "blocking"):
            os.sync()
            stalls, calls = _loop(model, mode, work, steps, save_at)
            out[mode].extend(stalls)
            out[f"{mode} call"].extend(calls)
    return out


def _trainer(work: Path, steps: int) -> tuple[object, float]:
    """Set up a real Trainer (no saves during the measured steps) and time its loop."""
    from orch_trainer.config import parse_args
    from orch_trainer.loop import Trainer
    from orchestrator.kit.preemption import PreemptionFlag
    rd = Path(tempfile.mkdtemp(dir=work))
    args = parse_args(["--run-dir", str(rd), "--max-steps", str(steps), "--batch-size", "8",
                       "--micro-batch-size", "4", "--save-interval", "1000000", "--log-interval", "1000000"])
    from orch_trainer.load import load, record_run_config
    from orch_trainer.preflight import preflight

    t = Trainer(args, rd, 1, "bench", PreemptionFlag())
    t.heartbeat.start()
    try:
        # The phases Trainer.run() runs, with only the step loop timed (what a user's loop would do).
        pre = preflight(args, t.this_attempt, t.ckpts)
        loaded = load(args, t.this_attempt, t.ckpts, pre)
        loop = t.train_loop(pre, loaded, record_run_config(args, t.this_attempt, pre, loaded))
        t0 = time.perf_counter()
        loop.run()
        dt = time.perf_counter() - t0
    finally:
        t.heartbeat.stop()
        shutil.rmtree(rd)
    return t, dt


def _plain(steps: int) -> float:
    """The same compute as the trainer, written as the plain loop a user would write."""
    import math

    from orch_trainer import data as D
    from orch_trainer.model import PRESETS, TinyGPT
    torch.manual_seed(0)
    cfg = PRESETS["tiny"]
    corpus = D.encode_corpus(D.generated_corpus(), "generated")
    sampler = D.BatchSampler(D.split(corpus)[0], cfg.block_size, 0)
    model = TinyGPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    def lr_factor(s: int) -> float:  # the trainer's schedule: 5 warmup steps, cosine to 10 %
        return (s + 1) / 5 if s < 5 else 0.1 + 0.45 * (1 + math.cos(math.pi * min(1, (s - 5) / (steps - 5))))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    model.train()
    t0 = time.perf_counter()
    for s in range(1, steps + 1):
        starts = sampler.step_starts(s - 1, 8)
        for j in range(2):
            x, y = sampler.micro_batch(starts, j, 4)
            (model(x, y) / 2).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def bench_overhead(work: Path, runs: int, steps: int = 400) -> dict[str, list[float]]:
    torch.set_num_threads(1)
    out: dict[str, list[float]] = {"plain": [], "trainer": []}
    _plain(20)
    _trainer(work, 20)
    for _ in range(runs):
        out["plain"].append(_plain(steps) / steps)
        out["trainer"].append(_trainer(work, steps)[1] / steps)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--dir", default=None, help="where to write (default: a tmp dir on the repo's disk)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    C.add_quick(ap)
    a = ap.parse_args()
    if a.quick:  # CI: every code path once, tiny sizes, nothing written (a smoke test, not a measurement)
        a.runs, a.no_write = 1, True
    elif a.runs < 5:
        ap.error("--runs must be >= 5 (medians of fewer runs are noise)")
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-trainer-", dir=a.dir or str(C.ROOT)))
    try:
        print("(a) save of a 105 MB state ...", flush=True)
        save = bench_save(work, a.runs)
        print("(b) stall per checkpoint, 84 MB MLP ...", flush=True)
        stall = bench_stall(work, a.runs)
        print("(c) step overhead, tiny preset ...", flush=True)
        over = bench_overhead(work, a.runs, steps=40 if a.quick else 400)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def per_round(name: str) -> float:  # median of per-round ratios: both sides saw the same load
        return statistics.median(v / b for v, b in zip(save[name], save["torch.save + fsync"], strict=True))
    r_save = per_round("verified save (CheckpointManager)")
    r_crc = per_round("verified save, torch CRC32 kept")
    r_inline = per_round("inline hash (protocol.HashingWriter) + fsync")
    r_stall = statistics.median(stall["background"]) / statistics.median(stall["blocking"])
    r_call = statistics.median(stall["background call"]) / statistics.median(stall["blocking call"])
    r_over = statistics.median(t / p for t, p in zip(over["trainer"], over["plain"], strict=True)) - 1
    rows = [
        ["(a) torch.save + fsync, 105 MB", C.fmt(save["torch.save + fsync"]), "baseline", ""],
        ["(a) verified save: tmp dir, sha256 while writing, fsyncs, manifest, rename",
         C.fmt(save["verified save (CheckpointManager)"]), f"{r_save:.2f}x", "<= 1.10" + C.mark(r_save <= 1.10)],
        ["(a) for context: the same, torch.save's own CRC32 kept",
         C.fmt(save["verified save, torch CRC32 kept"]), f"{r_crc:.2f}x", ""],
        ["(a) for context: hash inline in the writing thread (protocol.HashingWriter)",
         C.fmt(save["inline hash (protocol.HashingWriter) + fsync"]), f"{r_inline:.2f}x", ""],
        ["(b) training thread blocked per checkpoint: blocking torch.save + fsync",
         C.fmt(stall["blocking call"]), "baseline", ""],
        ["(b) training thread blocked per checkpoint: background save (snapshot to CPU memory)",
         C.fmt(stall["background call"]), f"{r_call:.2f}x", "<= 0.5" + C.mark(r_call <= 0.5)],
        ["(b) for context: extra loop time per checkpoint, blocking (call + neighbouring-step noise)",
         C.fmt(stall["blocking"]), "baseline", ""],
        ["(b) for context: extra loop time per checkpoint, background (+ contention while writing)",
         C.fmt(stall["background"]), f"{r_stall:.2f}x", ""],
        ["(c) plain torch loop, tiny preset, per step", C.fmt(over["plain"], digits=2), "baseline", ""],
        ["(c) trainer loop (checks, RNG capture, heartbeat), per step", C.fmt(over["trainer"], digits=2),
         f"{r_over * 100:+.1f} %", "<= 3 %" + C.mark(r_over <= 0.03)],
    ]
    tab = C.table(["measurement", "median (min–max)", "ratio", "goal"], rows)
    print(tab)
    if not a.no_write:
        notes = (
            f"torch {torch.__version__}, CPU only, torch threads 1, medians of {a.runs} interleaved runs, "
            f"niceness {os.nice(0)}. Writes go to a tmp dir in the repository (the disk a run dir would be "
            "on); `os.sync()` before each timed save. (a) and (c): ratio = median of the per-round "
            "ratios. The verified save skips torch.save's per-record CRC32 (every file's sha256 is checked "
            "before any load), which pays for the hash. (b) a 48-step loop saving 6 times. Blocked = time "
            "inside the save call. Extra loop time of a save = extra time of the step that saved and of "
            "every step that overlapped its background write, over the median of the loop's other steps "
            "(plus the final wait): it adds CPU contention from the writer thread (which runs niced) and "
            "whatever other processes did during those steps; medians over all saves of "
            f"all runs. 1-min load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after: "
            "other processes on this 2-core machine compete for the core the writer thread would use.")
        C.replace_section(TITLE, C.preamble("bench_trainer.py", notes) + "\n" + tab + "\n")
        print(f"wrote section '{TITLE}' of {C.BENCHMARKS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
