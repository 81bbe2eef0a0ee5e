"""Helpers shared by the reliability tests (importable as ``relkit`` from their modules)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LONG = os.environ.get("ORCH_LONG") == "1"


def _root_conftest():  # noqa: ANN202
    # tests/ is not a package; load the shared conftest by path so its tree_hash is the one every suite uses.
    spec = importlib.util.spec_from_file_location("_orch_tests_conftest", ROOT / "tests" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


_conftest = _root_conftest()
tree_hash = _conftest.tree_hash
Orch = _conftest.Orch


def sentinel(root: Path) -> Path:
    """A tree outside the runs root, trash and DB, with content a wrong write or delete would change."""
    s = root / "outside"
    (s / "sub").mkdir(parents=True)
    (s / "secret.txt").write_text("must never change\n")
    (s / "sub" / "data.bin").write_bytes(os.urandom(4096))
    return s
