"""Helpers shared by the unit tests (a uniquely named module: test folders have no __init__.py)."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator import protocol


def make_checkpoint(run_dir: Path, step: int, files: dict[str, bytes] | None = None,
                    final_name: str | None = None) -> Path:
    """Commit a checkpoint the documented way: write into a tmp dir, manifest, rename into place."""
    files = files if files is not None else {"model.pt": b"w" * 100 + bytes([step % 256]), "opt.pt": b"o" * 50}
    root = run_dir / protocol.CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    name = final_name or protocol.checkpoint_name(step)
    tmp = root / protocol.tmp_name(name)
    tmp.mkdir()
    listing = {rel: protocol.write_file_synced(tmp / rel, [data]) for rel, data in files.items()}
    protocol.atomic_write_json(tmp / protocol.MANIFEST, {"step": step, "files": listing})
    os.rename(tmp, root / name)
    protocol.fsync_dir(root)
    return root / name
