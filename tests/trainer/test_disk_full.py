"""A REAL full disk: a small tmpfs mounted for the test (root only: a failure under CI, a skip elsewhere)."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from orchkit import unavailable, wait_for
from trainerkit import committed, failure, run_config, run_trainer, spawn_trainer, tmp_entries

from orch_trainer.model import PRESETS, TinyGPT
from orchestrator import protocol
from orchestrator.kit.checkpoint import CheckpointManager

ARGS = ("--batch-size", "8", "--micro-batch-size", "8", "--keep-last-k", "1", "--heartbeat-interval", "0.1",
        "--log-interval", "1000")


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        unavailable("mounting a tmpfs needs root")
    where.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if p.returncode:
        unavailable(f"running as root but mount -t tmpfs failed: {p.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(path: Path, leave: int) -> None:
    """Fill the filesystem of ``path`` until ENOSPC, then give back ``leave`` bytes."""
    with open(path, "wb") as f:
        chunk = b"\0" * (64 << 10)
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
        size = f.tell()
    os.truncate(path, max(0, size - leave))


def test_real_enospc_mid_run_keeps_previous_checkpoint_and_the_retry_finishes(tmp_path):
    with tmpfs(tmp_path / "mnt", "16m") as mnt:
        rd = mnt / "run"
        proc = spawn_trainer(rd, *ARGS, "--max-steps", "5000", "--save-interval", "20")
        try:
            wait_for(lambda: committed(rd), what="a first checkpoint")
            # Freeze the trainer while no save is in flight, so the space left is exactly what we leave.
            while True:
                os.kill(proc.pid, signal.SIGSTOP)
                if not tmp_entries(rd):
                    break
                os.kill(proc.pid, signal.SIGCONT)
            before = committed(rd)[-1]
            fill(mnt / "filler", leave=300 << 10)  # a checkpoint is ~1.4 MB; failure.json still fits
            os.kill(proc.pid, signal.SIGCONT)
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == protocol.EXIT_FAILURE_REPORTED, err
        f = failure(rd)
        assert f["class"] == "enospc", f
        assert f["bytes_needed"] > 1_000_000 and f["bytes_free"] < 1_000_000
        survivors = committed(rd)
        assert survivors and survivors[-1] >= before
        newest = rd / "checkpoints" / survivors[-1]
        assert protocol.verify_checkpoint(newest) is None
        TinyGPT(PRESETS["tiny"]).load_state_dict(CheckpointManager.load(newest)["model.pt"])
        assert tmp_entries(rd) == []
        assert not (rd / protocol.DONE_MARKER).exists()
        # Space freed (what the enospc policy does by pruning): the same run resumes and finishes.
        (mnt / "filler").unlink()
        resume_step = protocol.checkpoint_step(newest)
        p = run_trainer(rd, *ARGS, "--max-steps", str(resume_step + 10), "--save-interval", "20", attempt=2)
        assert p.returncode == 0, p.stderr
        assert run_config(rd)["resumed_from_step"] == resume_step
        assert protocol.verify_done_marker(rd).verified


def test_free_space_is_checked_before_the_model_loads(tmp_path):
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        rd = mnt / "run"
        p = run_trainer(rd, *ARGS, "--max-steps", "10")
        assert p.returncode == protocol.EXIT_FAILURE_REPORTED, p.stderr
        f = failure(rd)
        assert f["class"] == "enospc"
        assert f["bytes_needed"] > f["bytes_free"]
        assert not (rd / protocol.RUN_CONFIG).exists()  # refused before loading, not after
        assert committed(rd) == []


def test_when_even_failure_json_does_not_fit_the_class_goes_to_stderr(tmp_path, capsys):
    from orch_trainer.runfiles import report_failure
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        rd = mnt / "run"
        protocol.attempt_dir(rd, 1).mkdir(parents=True)
        fill(mnt / "filler", leave=0)
        assert report_failure(rd, 1, "enospc", 12, "checkpoint did not fit", bytes_needed=10) is False
        assert "FAILURE CLASS enospc" in capsys.readouterr().err
        assert not (protocol.attempt_dir(rd, 1) / protocol.FAILURE_FILE).exists()
        assert list(protocol.attempt_dir(rd, 1).iterdir()) == []  # and no tmp file left behind
