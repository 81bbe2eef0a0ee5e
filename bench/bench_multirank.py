"""Multi-rank jobs (P10): the stop agreement's cost, SIGTERM to one rank against the grace, the sharded save
against DCP's own save, the controller's decision time against a full hash, and the resume on another world
size against the same one.

Real torchrun, gloo on CPU, ``OMP_NUM_THREADS=1``. The script relaunches itself under torchrun as the worker
of (a), (c) and (e) (``--worker``); (b) runs tests/integrations/scripts/mr_train.py, the multi-rank tests' program.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

import _common as C

TITLE = "Multi-rank jobs (P10)"
TRAIN = C.ROOT / "tests" / "integrations" / "scripts" / "mr_train.py"
GRACE_S = 30.0  # torchrun's SIGTERM -> SIGKILL gap, and a common Slurm GraceTime


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "SLURM_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(C.ROOT), PYTHONUNBUFFERED="1")
    return env


def _torchrun(nproc: int, *args: str) -> list[str]:
    return [C.PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]


# --- workers (under torchrun) --------------------------------------------------------------------------
def worker_agree(step_s: float, seconds: float, out: Path) -> None:
    """Steps of ``step_s`` of busy work; StopAgreement at every boundary. Rank 0 writes its measurements."""
    import torch
    import torch.distributed as dist

    from orchestrator.kit.dist import StopAgreement

    dist.init_process_group("gloo")

    class Flag:
        requested = False

    agreement = StopAgreement(Flag())
    x = torch.randn(64, 64)
    grad = torch.zeros(1024)  # stands for DDP's gradient all-reduce, which every real step has anyway
    costs: list[float] = []
    n_steps = max(10, int(seconds / step_s))  # the same on every rank: each boundary is a possible collective
    dist.barrier()
    t_start = time.perf_counter()
    steps = 0
    for _ in range(n_steps):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < step_s:
            x = torch.tanh(x @ x)
        dist.all_reduce(grad)  # ranks meet here in a real step: what is left is the agreement's own cost
        before = agreement.agreements
        t1 = time.perf_counter()
        agreement.should_stop()
        if agreement.agreements > before:
            costs.append(time.perf_counter() - t1)
        steps += 1
    elapsed = time.perf_counter() - t_start
    if dist.get_rank() == 0:
        out.write_text(json.dumps({"steps": steps, "elapsed": elapsed, "agreement_s": agreement.agreement_s,
                                   "agreements": agreement.agreements, "every": agreement.every,
                                   "cost_median": statistics.median(costs) if costs else 0.0}))
    dist.destroy_process_group()


def worker_save(mb: int, runs: int, work: Path, out: Path) -> None:
    """Each rank holds ``mb`` MB of its own tensors; DCP's save vs ShardedCheckpointer.save, interleaved."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from orchestrator.kit.sharded import ShardedCheckpointer, _hashing_filesystem

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    n = mb * (1 << 20) // 4
    state = {f"rank{rank}.w{i}": torch.randn(n // 4) for i in range(4)}
    times: dict[str, list[float]] = {"dcp": [], "orch": [], "hashing": []}
    for r in range(runs + 1):  # the first round warms up
        for kind in ("dcp", "hashing", "orch") if r % 2 else ("orch", "hashing", "dcp"):
            target = work / f"{kind}-{r}"
            dist.barrier()
            if rank == 0:
                os.sync()
            dist.barrier()
            t0 = time.perf_counter()
            if kind == "dcp":
                dcp.save(state, storage_writer=dcp.FileSystemWriter(target))
            elif kind == "hashing":  # DCP through the hashing filesystem alone: no gather, manifest, rename
                writer = dcp.FileSystemWriter(target, sync_files=False)
                writer.fs = _hashing_filesystem(None)
                dcp.save(state, storage_writer=writer)
            else:
                ShardedCheckpointer(target, keep_last_k=1).save(r + 1, sharded=state)
            took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the save ends when its slowest rank does
            if r:
                times[kind].append(float(took.item()))
            dist.barrier()
            if rank == 0:
                shutil.rmtree(target, ignore_errors=True)
    if rank == 0:
        out.write_text(json.dumps(times))
    dist.destroy_process_group()


def _resume_model(mb: int) -> tuple:
    """A DDP model of ``mb`` MB of fp32 weights (1024 x 1024 layers) with SGD momentum (as much again)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(1024, 1024, bias=False) for _ in range(max(1, mb // 4))])
    net = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    return net, opt


def worker_resume(mb: int, runs: int, work: Path, out: Path, save: bool) -> None:
    """``save``: one training step, then ShardedCheckpointer.save of model and optimizer (through DCP) at step 1.
    Else ``runs`` resumes of that step on this world size, each timed from ``resume`` (every rank hashes its
    share of the files) to the state set into the model and optimizer (DCP load, resharded), slowest rank."""
    import torch
    import torch.distributed as dist

    from orchestrator import protocol
    from orchestrator.kit.sharded import ShardedCheckpointer, dcp_state, set_dcp_state

    dist.init_process_group("gloo")
    net, opt = _resume_model(mb)
    ckpts = ShardedCheckpointer(work, keep_last_k=1)
    if save:
        net(torch.randn(4, 1024)).sum().backward()
        opt.step()
        ckpts.save(1, sharded=dcp_state(net, opt))
        _exit_without_teardown(dist)
    step_dir = work / protocol.CHECKPOINTS_DIR / protocol.checkpoint_name(1)
    times: list[float] = []
    for _ in range(runs):
        dist.barrier()
        t0 = time.perf_counter()
        found = ckpts.resume(lambda: (1, step_dir))
        assert found is not None and found[0] == 1, found
        state = dcp_state(net, opt)
        ckpts.load(found[1], sharded=state)
        set_dcp_state(net, opt, state)
        took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        times.append(float(took.item()))
    if dist.get_rank() == 0:
        out.write_text(json.dumps(times))
    _exit_without_teardown(dist)


def _exit_without_teardown(dist: Any) -> NoReturn:
    """End a worker that holds a DDP model without tearing its process group down.

    Seen in CI (quick mode, 4 ranks on 2 loaded cores): after the step committed, 2 of the 4 ranks hung for
    16 minutes in ``~ProcessGroupGloo`` (joining gloo's worker thread) when the function returned: DDP's reducer
    held the group's last reference, so the group died in a dealloc that holds the GIL, while gloo's worker
    thread waited for the GIL to free a just-finished broadcast's tensors. What the worker measured is
    written by now; the barrier lets every rank finish it first.
    """
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# --- measurements --------------------------------------------------------------------------------------
def bench_agree(ranks: int, step_s: float, seconds: float, work: Path) -> dict:
    out = work / f"agree-{ranks}-{step_s}.json"
    p = subprocess.run(_torchrun(ranks, __file__, "--worker", "agree", "--step-s", str(step_s), "--seconds",
                                 str(seconds), "--out", str(out)), env=_env(), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


def bench_sigterm(ranks: int, work: Path, steps: int) -> tuple[float, int, int, bool]:
    """(seconds from SIGTERM to rank 1 until torchrun exits, the step the ranks stopped after, the newest
    committed step, whether it holds every rank's files)."""
    from orchestrator import protocol

    run_dir = work / f"sigterm-{ranks}"
    log = work / f"sigterm-{ranks}.log"
    proc = subprocess.Popen(_torchrun(ranks, str(TRAIN), "--run-dir", str(run_dir), "--max-steps", str(steps),
                                      "--global-batch", "8", "--micro-batch", str(8 // ranks),
                                      "--sleep-per-step", "0.02", "--step-log", str(log)),
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (log.exists() and sum(1 for ln in log.read_text().splitlines() if ln.split()[1] == "1") >= 5):
        assert proc.poll() is None and time.time() < deadline, "the workers never got past step 5"
        time.sleep(0.05)
    pid = _rank_pid(run_dir, 1)
    t0 = time.perf_counter()
    os.kill(pid, signal.SIGTERM)
    proc.communicate(timeout=300)
    took = time.perf_counter() - t0
    stopped = {max(int(ln.split()[2]) for ln in log.read_text().splitlines() if ln.split()[1] == str(r))
               for r in range(ranks)}
    newest = next(protocol.iter_checkpoint_dirs(run_dir))
    m = json.loads((newest / protocol.MANIFEST).read_text())
    whole = protocol.verify_checkpoint(newest) is None and sorted(m["ranks"]) == [str(r) for r in range(ranks)]
    assert len(stopped) == 1, f"ranks stopped after different steps: {stopped}"
    return took, stopped.pop(), protocol.checkpoint_step(newest) or 0, whole


def _rank_pid(run_dir: Path, rank: int) -> int:
    needle = f"--run-dir={run_dir}"
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = set((d / "environ").read_bytes().split(b"\0"))
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and str(TRAIN) in cmd and (str(run_dir) in cmd or needle in cmd):
            return int(d.name)
    raise AssertionError(f"no rank {rank} process for {run_dir}")


def bench_save(ranks: int, mb: int, runs: int, work: Path) -> dict[str, list[float]]:
    out = work / f"save-{ranks}.json"
    p = subprocess.run(_torchrun(ranks, __file__, "--worker", "save", "--mb", str(mb), "--runs", str(runs),
                                 "--work", str(work), "--out", str(out)), env=_env(), capture_output=True,
                       text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


def bench_resume(saved_by: int, worlds: tuple[int, ...], mb: int, runs: int, work: Path) -> dict[int, list[float]]:
    """Save a step on ``saved_by`` ranks once, then resume it on each world size, ``runs`` times each."""
    run_dir = work / "resume"
    times: dict[int, list[float]] = {}
    for world, save in ((saved_by, True), *((w, False) for w in worlds)):
        out = work / f"resume-{world}.json"
        p = subprocess.run(_torchrun(world, __file__, "--worker", "resume", "--mb", str(mb), "--runs", str(runs),
                                     "--work", str(run_dir), "--out", str(out), *(["--save"] if save else [])),
                           env=_env(), capture_output=True, text=True, timeout=1800)
        assert p.returncode == 0, p.stderr[-3000:]
        if not save:
            times[world] = json.loads(out.read_text())
    shutil.rmtree(run_dir, ignore_errors=True)
    return times


def bench_controller(ranks: int, mb: int, runs: int, work: Path) -> dict[str, list[float]]:
    """A committed sharded step of ``ranks`` x ``mb`` MB: the controller's check vs a full hash of it."""
    from orchestrator import protocol

    d = work / "ctl" / protocol.CHECKPOINTS_DIR / protocol.checkpoint_name(1)
    (d / "dcp").mkdir(parents=True)
    files = {}
    chunk = os.urandom(1 << 20)
    for r in range(ranks):
        p = d / "dcp" / f"__{r}_0.distcp"
        with open(p, "wb") as f:
            for _ in range(mb):
                f.write(chunk)
        files[f"dcp/__{r}_0.distcp"] = {"size": p.stat().st_size, "sha256": protocol.sha256_file(p)[1]}
    (d / protocol.MANIFEST).write_text(json.dumps({"step": 1, "format": protocol.SHARDED_FORMAT,
                                                   "world_size": ranks, "files": files}))
    out = {"controller": C.timeit(lambda: protocol.verify_checkpoint_bounded(d), runs),
           "full hash": C.timeit(lambda: protocol.verify_checkpoint(d), runs)}
    shutil.rmtree(work / "ctl", ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=["agree", "save", "resume"])
    ap.add_argument("--save", action="store_true", help="resume worker: write the step to resume first")
    ap.add_argument("--step-s", type=float, default=0.01)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--work")
    ap.add_argument("--out")
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    C.add_quick(ap)
    a = ap.parse_args()
    if a.worker == "agree":
        worker_agree(a.step_s, a.seconds, Path(a.out))
        return 0
    if a.worker == "save":
        worker_save(a.mb, a.runs, Path(a.work), Path(a.out))
        return 0
    if a.worker == "resume":
        worker_resume(a.mb, a.runs, Path(a.work), Path(a.out), a.save)
        return 0
    if a.quick:
        a.runs, a.no_write = 1, True
    elif a.runs < 5:
        ap.error("--runs must be >= 5 (medians of fewer runs are noise)")
    seconds, save_mb, ctl_mb, steps, model_mb = (0.5, 1, 1, 12, 4) if a.quick else (a.seconds, a.mb, 512, 40, 128)
    # Quick: every code path once (each torchrun launch costs seconds of CI time on 2 cores).
    rank_counts, step_times = ((2,), (0.02,)) if a.quick else ((2, 4), (0.002, 0.02))
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-multirank-", dir=str(C.ROOT)))
    rows = []
    try:
        for ranks in rank_counts:
            for step_s in step_times:
                print(f"(a) agreement, {ranks} ranks, {step_s * 1e3:.0f} ms steps ...", flush=True)
                r = bench_agree(ranks, step_s, seconds, work)
                share = r["agreement_s"] / r["elapsed"]
                every_step = r["cost_median"] / step_s
                rows.append([f"(a) stop agreement, {ranks} ranks, {step_s * 1e3:.0f} ms steps",
                             f"{r['cost_median'] * 1e3:.2f} ms per all-reduce; every {r['every']} step(s)",
                             f"{share * 100:.2f} % of step time (every step: {every_step * 100:.1f} %)",
                             "<= 1 %" + C.mark(share <= 0.01)])
        for ranks in rank_counts:
            print(f"(b) SIGTERM to rank 1 of {ranks} ...", flush=True)
            took, stopped, newest, whole = bench_sigterm(ranks, work, steps)
            rows.append([f"(b) SIGTERM to rank 1 of {ranks}: all ranks stop, commit, exit",
                         f"{took:.1f} s; every rank stopped after step {stopped}",
                         f"committed step {newest} ({'every rank' if whole else 'INCOMPLETE'}); "
                         f"{stopped - newest} step(s) to redo",
                         f"< grace {GRACE_S:.0f} s, 0 redone" + C.mark(took < GRACE_S and whole and newest == stopped)])
        print(f"(c) save, 2 ranks x {save_mb} MB ...", flush=True)
        s = bench_save(2, save_mb, a.runs, work)
        ratio = statistics.median(o / d for o, d in zip(s["orch"], s["dcp"], strict=True))
        rows.append([f"(c) DCP's own save, 2 ranks x {save_mb} MB (slowest rank)", C.fmt(s["dcp"]), "baseline", ""])
        r_hash = statistics.median(h / d for h, d in zip(s["hashing"], s["dcp"], strict=True))
        rows.append(["(c) for context: DCP through the hashing filesystem alone (fsync while hashing back)",
                     C.fmt(s["hashing"]), f"{r_hash:.2f}x", ""])
        rows.append(["(c) ShardedCheckpointer.save: DCP + fsync while hashing back, gather, manifest, rename",
                     C.fmt(s["orch"]), f"{ratio:.2f}x", "<= 1.10" + C.mark(ratio <= 1.10)])
        print(f"(d) controller check, 4 ranks x {ctl_mb} MB ...", flush=True)
        c = bench_controller(4, ctl_mb, a.runs, work)
        rows.append([f"(d) full sha256 of a 4-rank step, 4 x {ctl_mb} MB", C.fmt(c["full hash"]), "baseline", ""])
        rows.append(["(d) the controller's check (manifest + sizes) of the same step", C.fmt(c["controller"]),
                     f"{statistics.median(c['controller']) / statistics.median(c['full hash']):.4f}x", ""])
        worlds = (4, 2) if a.quick else (4, 2, 3)
        print(f"(e) resume of a 4-rank step ({model_mb} MB model + {model_mb} MB optimizer) on {worlds} ranks ...",
              flush=True)
        res = bench_resume(4, worlds, model_mb, a.runs, work)
        same = statistics.median(res[4])
        for world in worlds:
            rows.append([f"(e) resume a step 4 ranks saved ({model_mb} MB model + {model_mb} MB momentum), on {world} "
                         f"ranks" + (" (same world size)" if world == 4 else " (resharded)"), C.fmt(res[world]),
                         "baseline" if world == 4 else f"{statistics.median(res[world]) / same:.2f}x", ""])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tab = C.table(["measurement", "median (min–max) / result", "share / ratio", "goal"], rows)
    print(tab)
    if not a.no_write:
        notes = (
            f"gloo on CPU, `OMP_NUM_THREADS=1`, torchrun --standalone; {a.runs} runs for (c) and (d). (a) steps of "
            f"busy tensor work for {seconds:.0f} s per row; the share is the time all agreements took over the "
            "elapsed time (each step ends with a small all-reduce, as DDP's gradient sync does, so the agreement "
            "does not absorb the ranks' skew), the interval is what `StopAgreement` chose (<= 1 % of the step "
            "time, never more than 1 s between checks). 4 ranks share 2 cores: each all-reduce waits for a "
            "descheduled peer. (b) "
            "tests/integrations/scripts/mr_train.py (a DDP MLP, 20 ms steps), SIGTERM to rank 1 only, timed to "
            "torchrun's exit; the newest committed step is verified (every sha256) and must hold every rank's "
            "files. (c) each rank its own 4 tensors, both writers fsync every file; ratio = median of per-round "
            "ratios, time of the slowest rank, page cache flushed (`os.sync`) before each; orch's writer hashes "
            "each file back from the page cache while its fsync runs (hashing each buffer as it was written kept "
            "both cores busy: 1.41x on 2026-12-02); the gather, manifest and rename cost next to nothing (compare "
            "the hashing filesystem alone). (d) synthetic files; "
            "the page cache holds them (a cold read is slower still). (e) a DDP model of 1024 x 1024 layers and "
            "its SGD momentum, saved once by 4 ranks through `ShardedCheckpointer`; each resume is timed from "
            "`resume` (every rank hashes its share of the step's files) to the state set into model and "
            "optimizer (DCP load, resharded to the world size), slowest rank; the page cache holds the files; "
            "the ranks share 2 cores, so more ranks are not faster here. "
            f"1-min load average {load_before:.1f} "
            f"before, {os.getloadavg()[0]:.1f} after.")
        C.replace_section(TITLE, C.preamble("bench_multirank.py", notes) + "\n" + tab + "\n")
        print(f"wrote section '{TITLE}' of {C.BENCHMARKS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
