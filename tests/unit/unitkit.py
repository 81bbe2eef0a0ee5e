"""Helpers shared by the unit tests (a uniquely named module: test folders have no __init__.py)."""

from __future__ import annotations

from pathlib import Path

import orchkit


def make_checkpoint(run_dir: Path, step: int, files: dict[str, bytes] | None = None,
                    final_name: str | None = None) -> Path:
    files = files if files is not None else {"model.pt": b"w" * 100 + bytes([step % 256]), "opt.pt": b"o" * 50}
    return orchkit.make_checkpoint(run_dir, step, files, final_name)
