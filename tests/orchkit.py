"""Helpers every test folder shares. A plain module with a unique name (pytest puts tests/ on
sys.path for the root conftest); ``from conftest import ...`` is not reliable because each folder's
conftest is imported under that same module name."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from orchestrator import protocol

# THE one reading of CI=true for every test kit (issue 18: two kits compared it exactly, two lower-cased it).
IN_CI = os.environ.get("CI", "").strip().lower() == "true"


def unavailable(msg: str) -> None:
    """A facility a test needs is missing: a failure under CI (a skip there would hide the test), a skip
    elsewhere."""
    if IN_CI:
        pytest.fail(msg)
    pytest.skip(msg)


def tree_hash(root: Path) -> str:
    """Hash of every path, file content and symlink target below root (order-independent)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            h.update(f"L {rel} {os.readlink(p)}\n".encode())
        elif p.is_file():
            h.update(f"F {rel} {hashlib.sha256(p.read_bytes()).hexdigest()}\n".encode())
        else:
            h.update(f"D {rel}\n".encode())
    return h.hexdigest()


def make_checkpoint(run_dir: Path, step: int, files: dict[str, bytes], final_name: str | None = None,
                    manifest: bool = True) -> Path:
    """Commit a checkpoint the documented way: files + manifest in a tmp dir, renamed into place."""
    root = run_dir / protocol.CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    name = final_name or protocol.checkpoint_name(step)
    tmp = root / protocol.tmp_name(name)
    tmp.mkdir()
    listing = {rel: protocol.write_file_synced(tmp / rel, [data]) for rel, data in files.items()}
    if manifest:
        protocol.atomic_write_json(tmp / protocol.MANIFEST, {"step": step, "files": listing})
    os.rename(tmp, root / name)
    protocol.fsync_dir(root)
    return root / name


def use_backend(monkeypatch, backend) -> None:  # noqa: ANN001
    """Make every orch service that looks a backend up by name get ``backend`` (a fake at the
    scheduler boundary, for in-process tests)."""
    import orchestrator.launch
    import orchestrator.liveness
    import orchestrator.requeue
    import orchestrator.stop
    import orchestrator.submit

    for mod in (orchestrator.launch, orchestrator.liveness, orchestrator.requeue, orchestrator.stop,
                orchestrator.submit):
        monkeypatch.setattr(mod, "get_backend", lambda _name: backend)
