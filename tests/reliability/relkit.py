"""Helpers shared by the reliability tests (importable as ``relkit`` from their modules); the shared
ones (tree_hash, Orch, ROOT) come from tests/orchkit.py."""

from __future__ import annotations

import os
from pathlib import Path

from orchkit import ROOT, Orch, tree_hash  # noqa: F401 - re-exported for the reliability tests

LONG = os.environ.get("ORCH_LONG") == "1"


def sentinel(root: Path) -> Path:
    """A tree outside the runs root, trash and DB, with content a wrong write or delete would change."""
    s = root / "outside"
    (s / "sub").mkdir(parents=True)
    (s / "secret.txt").write_text("must never change\n")
    (s / "sub" / "data.bin").write_bytes(os.urandom(4096))
    return s
