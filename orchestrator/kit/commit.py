"""Committing a framework's checkpoint in orch's format, pruning, and clearing unfinished writes.

Stdlib + ``orchestrator.protocol`` only (no torch): the submitit runner commits a pickle, Lightning a
``.ckpt`` it writes itself, Hugging Face a ``checkpoint-N`` directory it already wrote. Rank 0 only.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import protocol
from orchestrator.kit.log import log
from orchestrator.kit.stall import blocked_saving


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
    with blocked_saving():  # Lightning's write and every commit block the loop: the heartbeat's save_stall_s
        return _commit(run_dir, step, write, move_from, keep_last_k)


def _commit(run_dir: Path, step: int, write: Callable[[Path], None] | None, move_from: Path | None,
            keep_last_k: int | None) -> Path:
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

    As ``orchestrator.kit.checkpoint.CheckpointManager.prune`` does, without importing torch (the submitit runner
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


