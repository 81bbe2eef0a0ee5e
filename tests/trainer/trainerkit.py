"""Shared helpers of the trainer tests: run `python -m orch_trainer` for real (subprocess) or in-process.

In-process runs drive the same ``main()`` with a preemption flag the test can set at any micro-batch
boundary (fast: no interpreter or torch start-up); subprocess runs are used wherever a real signal,
a real kill or the exit code of the real entry point is the claim.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from orch_trainer.__main__ import main as trainer_main
from orchestrator import protocol
from orchestrator.kit.preemption import PreemptionFlag

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

# Small but with gradient accumulation (2 micro-batches per step) and frequent saves.
BASE_ARGS = ["--preset", "tiny", "--batch-size", "8", "--micro-batch-size", "4", "--save-interval", "4",
             "--keep-last-k", "2", "--seed", "3", "--heartbeat-interval", "0.1", "--log-interval", "1000"]


def trainer_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "SLURM_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_trainer(run_dir: Path, *args: str, attempt: int = 1, timeout: float = 120,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m orch_trainer --run-dir RUN_DIR ARGS` in a subprocess, as the orchestrator runs it."""
    return subprocess.run([PY, "-m", "orch_trainer", "--run-dir", str(run_dir), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=str(ROOT),
                          env=env or trainer_env(ORCH_ATTEMPT=str(attempt)))


def spawn_trainer(run_dir: Path, *args: str, attempt: int = 1) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "orch_trainer", "--run-dir", str(run_dir), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(ROOT),
                            env=trainer_env(ORCH_ATTEMPT=str(attempt)))


def run_inproc(run_dir: Path, *args: str, attempt: int = 1,
               stop_at: tuple[int, int] | None = None,
               hook: Callable[[Any, int, int], None] | None = None) -> int:
    """main() in this process; ``stop_at=(step, micro)`` sets the preemption flag at that boundary."""
    flag = PreemptionFlag()

    def boundary(trainer: Any, step: int, micro: int) -> None:
        if hook is not None:
            hook(trainer, step, micro)
        if stop_at == (step, micro):
            trainer.preemption.set(f"test: stop at step {step} micro-batch {micro}")

    old = os.environ.get(protocol.ENV_ATTEMPT)
    os.environ[protocol.ENV_ATTEMPT] = str(attempt)
    try:
        return trainer_main(["--run-dir", str(run_dir), *args], preemption=flag, boundary_hook=boundary)
    finally:
        if old is None:
            os.environ.pop(protocol.ENV_ATTEMPT, None)
        else:
            os.environ[protocol.ENV_ATTEMPT] = old


def failure(run_dir: Path, attempt: int = 1) -> dict:
    return json.loads((protocol.attempt_dir(run_dir, attempt) / protocol.FAILURE_FILE).read_text())


def run_config(run_dir: Path) -> dict:
    return json.loads((run_dir / protocol.RUN_CONFIG).read_text())


def result_state(run_dir: Path) -> dict[str, torch.Tensor]:
    assert protocol.verify_done_marker(run_dir).verified, protocol.verify_done_marker(run_dir)
    return torch.load(run_dir / "result" / "model.pt", weights_only=True)


def assert_bit_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    diff = [k for k in a if not torch.equal(a[k], b[k])]
    assert not diff, f"tensors differ: {diff[:5]}"


def committed(run_dir: Path) -> list[str]:
    return sorted(p.name for p in protocol.iter_checkpoint_dirs(run_dir))


def tmp_entries(run_dir: Path) -> list[str]:
    root = run_dir / protocol.CHECKPOINTS_DIR
    return sorted(p.name for p in root.iterdir() if protocol.TMP_INFIX in p.name) if root.is_dir() else []


def tree_state(root: Path) -> str:
    """Hash of every path with its content AND mtime: proves a run wrote nothing, not even the same bytes."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "-"
        h.update(f"{p.relative_to(root)} {st.st_mtime_ns} {digest}\n".encode())
    return h.hexdigest()


def progress_step(run_dir: Path, attempt: int = 1) -> int:
    p = protocol.read_progress(run_dir, attempt)
    return int(p["step"]) if p and isinstance(p.get("step"), int) else -1
