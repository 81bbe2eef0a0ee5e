"""Helpers of the integration tests: run an example through orch, find its process, preempt it, measure.

Measurements, as the tests and bench/bench_integrations.py use them:

* steps redone: each example appends ``<attempt> <step>`` to a step log once the optimizer step is
  complete; a step that appears twice was computed twice (``repeats``).
* exactness: final weights compared with a run of the same script that was never interrupted.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from orchkit import wait_for

from orchestrator import protocol

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PY = sys.executable
DONE = "done_marker_verified"


def example(name: str, *args: str) -> list[str]:
    return [PY, str(EXAMPLES / name), *args]


def quiet_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """What every example run gets: fast heartbeats, W&B offline, no hub access, this checkout first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "SLURM_", "WANDB_"))}
    env.update(ORCH_HEARTBEAT_S="0.1", WANDB_MODE="offline", WANDB_SILENT="true", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra or {})
    return env


def run_direct(argv: list[str], run_dir: Path, timeout: float = 300,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run an example to the end without orch (the reference: never interrupted), in ``env`` (``quiet_env()``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(argv + ["--run-dir", str(run_dir)], cwd=run_dir, env=env or quiet_env(), capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert protocol.verify_done_marker(run_dir).verified
    return p


def program_pids(run_dir: Path, script: str, attempt: int | None = None) -> list[int]:
    """Pids of processes running ``script`` whose environment says ORCH_RUN_DIR=<run_dir> (and, given
    ``attempt``, ORCH_ATTEMPT=<attempt>).

    Found by a /proc scan (the wrapper's child is the program; its own children, e.g. W&B's service,
    share the environment but not the script in their command line).
    """
    needles = [f"{protocol.ENV_RUN_DIR}={run_dir}".encode()]
    if attempt is not None:
        needles.append(f"{protocol.ENV_ATTEMPT}={attempt}".encode())
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            if any(n not in env for n in needles):
                continue
            if script.encode() in (d / "cmdline").read_bytes():
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def rank_pid(run_dir: Path, rank: int, script: str) -> int | None:
    """The pid of rank ``rank``'s program running ``script`` for ``run_dir`` (``orch submit --nproc-per-node``),
    not orch's per-rank parent (``orchestrator.jobside.rankend``), whose command line names the script too."""
    want = {f"{protocol.ENV_RUN_DIR}={run_dir}".encode(), f"RANK={rank}".encode()}
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and want <= set((d / "environ").read_bytes().split(b"\0")):
                cmd = (d / "cmdline").read_bytes()
                if script.encode() in cmd and b"orchestrator.jobside.rankend" not in cmd:
                    return int(d.name)
        except OSError:
            continue
    return None


def rank_step_log(path: Path) -> list[tuple[int, int, int]]:
    """(attempt, rank, step) per line of a step log written under torchrun (``<attempt> <step> <rank>``)."""
    return [(int(a), int(r), int(s)) for a, s, r in (ln.split() for ln in path.read_text().splitlines())] \
        if path.exists() else []


def progress_step(run_dir: Path, attempt: int) -> int:
    return int((protocol.read_progress(run_dir, attempt) or {}).get("step") or 0)


def preempt(orch, name: str, script: str, attempt: int, past_step: int, timeout: float = 180,
            as_slurm: bool = False) -> int:
    """SIGTERM the program of ``attempt`` once it posted progress past ``past_step``; reconcile until it runs.
    ``as_slurm``: and every other process of the attempt but orch's wrapper at once, as Slurm's preemption and
    ``scancel`` do (W&B's service process among them).

    Returns the pid it signalled. Reconciling while waiting is what requeues the previous attempt; once the
    attempt's program runs, only its heartbeat is polled: a reconcile per poll took seconds on a loaded
    machine, and the program ran to its last step before the signal came (attempt 3 then redid attempt
    2's steps, and a program that finished left no stop.json).
    """
    run_dir = orch.runs / name

    def ready() -> list[int] | None:
        if not (pids := program_pids(run_dir, script, attempt)):
            orch.reconcile_paced()
            return None
        return pids if progress_step(run_dir, attempt) > past_step else None

    (pid,) = wait_for(ready, timeout, f"{name} attempt {attempt} past step {past_step}", interval=0.05)
    if as_slurm:
        _signal_the_program_last(pid, [p for p in program_pids(run_dir, "", attempt)
                                       if p != pid and not _is_wrapper(p)])
    else:
        os.kill(pid, signal.SIGTERM)
    return pid


def _signal_the_program_last(pid: int, others: list[int]) -> None:
    """Slurm's SIGTERM reaches every process of the job at once; here in the order that loses the tracker with
    certainty: the program is held (SIGSTOP), the others are signalled and gone, then the program gets its
    SIGTERM with the SIGCONT Slurm sends too. Its handler runs before its next tracker call can fail."""
    os.kill(pid, signal.SIGSTOP)
    for p in others:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGTERM)
    wait_for(lambda: not any(_alive(p) for p in others), 30, "the program's other processes to end")
    os.kill(pid, signal.SIGTERM)
    os.kill(pid, signal.SIGCONT)


def _alive(pid: int) -> bool:
    """Running or stopped; a zombie (ended, not yet reaped) is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def _is_wrapper(pid: int) -> bool:
    try:
        return b"orchestrator.jobside.wrapper" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def step_log(path: Path) -> list[tuple[int, int]]:
    return [(int(a), int(s)) for a, s in (line.split() for line in path.read_text().splitlines() if line.strip())]


def repeats(log: list[tuple[int, int]]) -> int:
    """Optimizer steps that were computed more than once."""
    return sum(n - 1 for n in collections.Counter(s for _, s in log).values() if n > 1)


def attempts(orch, name: str) -> list[dict]:
    return orch.show(name)["attempts"]


def failure(run_dir: Path, attempt: int) -> dict:
    return json.loads((protocol.attempt_dir(run_dir, attempt) / protocol.FAILURE_FILE).read_text())


def state_dicts_equal(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
