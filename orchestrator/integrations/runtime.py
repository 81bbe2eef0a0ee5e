"""What the integrations share: where the run lives, committing a directory as a checkpoint, RNG, the end.

Framework-free (stdlib + ``orchestrator.protocol``; torch only inside the functions that need it), so
the Lightning and Hugging Face callbacks and the plain-loop context manager behave alike:

* a checkpoint the framework wrote (a Lightning ``.ckpt``, an HF ``checkpoint-N`` dir) is committed in
  orch's format by :func:`commit_checkpoint`: files moved or written into ``step-<8 digits>.tmp-*``,
  each fsynced and hashed, ``manifest.json`` last, the dir renamed into place, ``checkpoints/`` fsynced.
  Neither Lightning nor HF fsyncs; both write in place, so a kill -9 mid-save leaves a newest checkpoint
  that loads half (seed 002). Resume only ever picks a checkpoint whose manifest verifies.
* a stop after a signal is reported with :func:`preempted` (``failure.json`` class ``preempted``, exit
  143) and never writes ``done.json``; a normal end writes ``result/`` and then the marker (:func:`finish`).

Who may call: every rank may construct a :class:`Run`; only ``is_writer`` (global rank 0) writes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import protocol

ENV_HEARTBEAT_S = "ORCH_HEARTBEAT_S"  # how often progress.json is rewritten (seconds, default 2)
DEFAULT_HEARTBEAT_S = 2.0


def log(msg: str) -> None:
    print(f"[orch] {msg}", file=sys.stderr, flush=True)


class RunDirError(ValueError):
    """No usable run dir: neither ``ORCH_RUN_DIR`` nor a ``run_dir`` argument, or an unsafe one."""


@dataclass
class Run:
    """One attempt of one run, as the job's environment describes it (or a ``run_dir`` without orch)."""

    run_dir: Path
    job: str
    attempt: int
    overrides: dict[str, Any] = field(default_factory=dict)
    is_writer: bool = True

    @classmethod
    def from_env(cls, run_dir: str | os.PathLike[str] | None = None) -> Run:
        """``run_dir`` argument > ``$ORCH_RUN_DIR``; attempt from ``$ORCH_ATTEMPT`` (1 without orch)."""
        raw = run_dir if run_dir is not None else os.environ.get(protocol.ENV_RUN_DIR)
        if not raw:
            raise RunDirError(f"no run dir: run under orch (it sets {protocol.ENV_RUN_DIR}) or pass run_dir=...")
        path = Path(raw).absolute()
        # orch refuses a symlinked run dir (it could point anywhere); so do its integrations.
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise RunDirError(f"run dir {path} is a symlink or not a directory")
        raw_attempt = os.environ.get(protocol.ENV_ATTEMPT, "1")
        if not raw_attempt.isdigit() or int(raw_attempt) < 1:
            raise RunDirError(f"{protocol.ENV_ATTEMPT}={raw_attempt!r}: attempts are numbered from 1")
        try:
            overrides = json.loads(os.environ.get(protocol.ENV_OVERRIDES) or "{}")
        except ValueError:
            overrides = {}
        return cls(run_dir=path, job=os.environ.get(protocol.ENV_JOB_NAME) or path.name, attempt=int(raw_attempt),
                   overrides=overrides if isinstance(overrides, dict) else {}, is_writer=_global_rank() == 0)

    # --- paths and ids ----------------------------------------------------------------------------
    @property
    def result_dir(self) -> Path:
        return self.run_dir / protocol.RESULT_DIR

    @property
    def tensorboard_dir(self) -> Path:
        """One TensorBoard log dir for every attempt: steps continue in it instead of a new version dir."""
        return Path(os.environ.get(protocol.ENV_TENSORBOARD_DIR) or self.run_dir / protocol.TENSORBOARD_DIR)

    @property
    def run_id(self) -> str:
        """The tracker run id orch gives every attempt (``WANDB_RUN_ID`` unless the user set their own)."""
        return (os.environ.get("WANDB_RUN_ID") or os.environ.get(protocol.ENV_RUN_ID)
                or protocol.stable_run_id(self.run_dir, self.job))

    @property
    def heartbeat_s(self) -> float:
        try:
            return max(0.05, float(os.environ.get(ENV_HEARTBEAT_S, DEFAULT_HEARTBEAT_S)))
        except ValueError:
            return DEFAULT_HEARTBEAT_S

    # --- the start of an attempt -------------------------------------------------------------------
    def already_complete(self) -> bool:
        """THE completion predicate: a verified run is never trained or touched again (seed 000)."""
        v = protocol.verify_done_marker(self.run_dir)
        if v.verified:
            log(f"already complete: {self.run_dir} (verified done.json); nothing written")
        return v.verified

    def begin(self) -> None:
        """Create the attempt dir; keep (renamed) a failure.json an earlier run of this attempt left.

        A Slurm in-place requeue reruns the same attempt number: its first run's ``preempted`` report
        must not be read as this run's outcome (nor lost).
        """
        if not self.is_writer:
            return
        adir = protocol.attempt_dir(self.run_dir, self.attempt)
        adir.mkdir(parents=True, exist_ok=True)
        stale = protocol.set_aside(adir / protocol.FAILURE_FILE)
        if stale is not None:
            log(f"attempt {self.attempt} restarted in place: previous failure.json kept as {stale.name}")

    def resume_checkpoint(self) -> tuple[int, Path] | None:
        """(step, dir) to resume from: the policy's ``resume`` override, else the newest verified one.

        ``ORCH_OVERRIDES`` ``{"resume": PATH}`` is a rollback (e.g. after a NaN): the checkpoints after
        it belong to the abandoned timeline and are renamed aside, since their names will be written
        again. ``{"resume": "none"}`` starts fresh.
        """
        wanted = self.overrides.get("resume")
        if wanted == "none":
            self._set_aside_newer_than(-1)
            return None
        if isinstance(wanted, str) and wanted:
            path = Path(wanted) if Path(wanted).is_absolute() else self.run_dir / wanted
            problem = protocol.verify_checkpoint(path)
            if problem is not None:
                # An explicit resume point that does not verify is never silently replaced by another.
                raise RunDirError(f"resume override {wanted}: {problem}")
            step = protocol.checkpoint_step(path) or 0
            self._set_aside_newer_than(step)
            return step, path
        for path in protocol.iter_checkpoint_dirs(self.run_dir):
            problem = protocol.verify_checkpoint(path)
            if problem is None:
                return protocol.checkpoint_step(path) or 0, path
            log(f"skipping checkpoint that does not verify: {problem}")
        return None

    def _set_aside_newer_than(self, step: int) -> None:
        if not self.is_writer:
            return
        for path in protocol.iter_checkpoint_dirs(self.run_dir):
            if (protocol.checkpoint_step(path) or 0) > step:
                dest = path.with_name(f"{path.name}.abandoned-{os.urandom(4).hex()}")
                os.rename(path, dest)
                protocol.fsync_dir(path.parent)
                log(f"{path.name} is newer than the resume point: moved aside to {dest.name}")

    # --- the end of an attempt ---------------------------------------------------------------------
    def preempted(self, step: int | None, reason: str, checkpoint: Path | None) -> SystemExit:
        """Report a stop on a signal; return the ``SystemExit(143)`` for the caller to raise.

        Never writes done.json: an attempt that got a termination signal is not a finished run, whatever
        the framework would have exited with (Lightning's own SIGTERM path exits 0).
        """
        if self.is_writer:
            rel = str(checkpoint.relative_to(self.run_dir)) if checkpoint is not None else None
            protocol.write_failure(self.run_dir, self.attempt, "preempted", step,
                                   f"{reason}: checkpoint of step {step} saved, exiting",
                                   checkpoint=rel)
            log(f"preempted ({reason}) at step {step}; checkpoint {rel}; exit {protocol.EXIT_PREEMPTED}")
        return SystemExit(protocol.EXIT_PREEMPTED)

    def finish(self, metrics: dict[str, Any]) -> dict | None:
        """``result/metrics.json``, then ``done.json`` over every file under ``result/``: the LAST write."""
        if not self.is_writer:
            return None
        self.result_dir.mkdir(parents=True, exist_ok=True)
        protocol.atomic_write_json(self.result_dir / "metrics.json", metrics)
        files = sorted(str(p.relative_to(self.run_dir)) for p in self.result_dir.rglob("*")
                       if p.is_file() and not p.is_symlink())
        marker = protocol.write_done_marker(self.run_dir, self.job, self.attempt, files)
        log(f"done: {protocol.DONE_MARKER} lists {len(files)} file(s) under {protocol.RESULT_DIR}/")
        return marker


def signal_name(signum: int | None) -> str:
    return signal.Signals(signum).name if signum else "stop requested"


def _global_rank() -> int:
    """torchrun / Lightning DDP set RANK; srun sets SLURM_PROCID (0 for a batch script)."""
    raw = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
    return int(raw) if raw.isdigit() else 0


# =========================================================================================
# committing a framework's checkpoint in orch's format
# =========================================================================================
def _fsync_and_list(root: Path) -> dict[str, dict[str, Any]]:
    """{relpath: {size, sha256}} of every regular file below ``root``, each fsynced first."""
    listing: dict[str, dict[str, Any]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_symlink():
                # A manifest may only list real files inside the checkpoint (protocol.resolve_inside).
                raise ValueError(f"checkpoint file {p} is a symlink")
            rel = p.relative_to(root).as_posix()
            if rel == protocol.MANIFEST:
                continue
            with open(p, "rb") as f:
                os.fsync(f.fileno())
            size, digest = protocol.sha256_file(p)
            listing[rel] = {"size": size, "sha256": digest}
        protocol.fsync_dir(dirpath)
    return listing


def commit_checkpoint(run_dir: Path, step: int, *, write: Callable[[Path], None] | None = None,
                      move_from: Path | None = None, keep_last_k: int | None = None) -> Path:
    """Commit a framework's checkpoint as ``checkpoints/step-<step>``; return its path. Rank 0 only.

    Either ``write(tmp_dir)`` writes the files (Lightning's ``trainer.save_checkpoint``), or
    ``move_from`` is a directory the framework already wrote (HF's ``checkpoint-N``), renamed (or, across
    filesystems, copied) into the tmp dir. Then: every file fsynced and hashed, ``manifest.json`` last,
    rename into place, ``checkpoints/`` fsynced, older ones beyond ``keep_last_k`` pruned (after the
    commit: pruning first could leave none after a crash). An already committed, verifying ``step-N``
    is kept as it is (a periodic save and a preemption save of the same step).
    """
    root = run_dir / protocol.CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / protocol.checkpoint_name(step)
    if final.exists() or final.is_symlink():
        if protocol.verify_checkpoint(final) is None:
            if move_from is not None:
                shutil.rmtree(move_from, ignore_errors=True)
            return final
        # A corrupt step-N (a torn copy, bit rot) would block the name forever; keep it for forensics.
        aside = final.with_name(f"{final.name}.corrupt-{os.urandom(4).hex()}")
        os.rename(final, aside)
        log(f"{final.name} does not verify: moved aside to {aside.name}")
    tmp = root / protocol.tmp_name(final.name)
    try:
        if move_from is not None:
            try:
                os.rename(move_from, tmp)
            except OSError:  # another filesystem (EXDEV): copy, the source goes after the commit
                shutil.copytree(move_from, tmp, symlinks=True)
        else:
            tmp.mkdir()
            assert write is not None, "commit_checkpoint needs write= or move_from="
            write(tmp)
        listing = _fsync_and_list(tmp)
        if not listing:
            raise ValueError(f"checkpoint of step {step} holds no file")
        protocol.atomic_write_json(tmp / protocol.MANIFEST, {"step": int(step), "files": listing})
        protocol.fsync_dir(tmp)
        os.rename(tmp, final)
        protocol.fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if move_from is not None and move_from.exists():
        shutil.rmtree(move_from, ignore_errors=True)
    if keep_last_k:
        prune(run_dir, keep_last_k)
    return final


def prune(run_dir: Path, keep_last_k: int) -> list[str]:
    """Remove committed checkpoints beyond the newest ``keep_last_k``.

    As ``trainer.checkpoint.CheckpointManager.prune`` does, without importing torch (the submitit runner
    runs any Python callable): each is renamed aside to a ``.tmp-del-`` name first, the rename fsynced,
    so no reader sees a half-deleted dir under a committed name.
    """
    removed = []
    for path in list(protocol.iter_checkpoint_dirs(run_dir))[max(1, keep_last_k):]:
        aside = path.with_name(f"{path.name}{protocol.TMP_INFIX}del-{os.urandom(4).hex()}")
        os.rename(path, aside)
        protocol.fsync_dir(path.parent)
        shutil.rmtree(aside, ignore_errors=True)
        removed.append(path.name)
    return removed


def clean_stale(run_dir: Path) -> list[str]:
    """Remove ``checkpoints/*.tmp-*`` left by a writer that died mid-commit. Call at start, rank 0."""
    root = run_dir / protocol.CHECKPOINTS_DIR
    removed = []
    if root.is_dir():
        for p in root.iterdir():
            if protocol.TMP_INFIX in p.name and protocol.CHECKPOINT_RE.match(p.name.split(protocol.TMP_INFIX)[0]):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink()
                removed.append(p.name)
    if removed:
        log(f"removed unfinished checkpoint writes: {', '.join(sorted(removed))}")
    return removed


# =========================================================================================
# RNG: what makes a resumed run draw the same dropout masks and shuffles as an uninterrupted one
# =========================================================================================
def capture_rng() -> dict[str, Any]:
    """Python, torch (CPU, CUDA) and, if already imported, numpy's global RNG states.

    Plain types and tensors only, so a ``torch.load(weights_only=True)`` reads them back.
    """
    import random

    import torch

    version, state, gauss = random.getstate()
    rng: dict[str, Any] = {"python": [version, list(state), gauss], "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        rng["numpy"] = [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    import random

    import torch

    version, state, gauss = rng["python"]
    random.setstate((version, tuple(state), gauss))
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    if "numpy" in rng:
        import numpy as np

        kind, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def any_rank(flag: bool) -> bool:
    """True if ``flag`` is true on any rank (no-op without torch.distributed).

    Under ``torchrun`` a signal can reach the ranks at different steps; a checkpoint save is collective,
    so every rank must decide to stop at the same step or the save deadlocks.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    t = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
