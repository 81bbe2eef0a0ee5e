"""Every package of the source tree is in pyproject's ``[tool.setuptools] packages``: a package left out installs
nowhere but in an editable checkout, so a user's ``pip install`` would fail on its first import (a restructure moves
modules into new packages one at a time; each must be listed as it appears)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def source_packages() -> set[str]:
    out = set()
    for top in ("orchestrator", "orch_trainer", "trainer"):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            if "__pycache__" not in rel.parts:
                out.add(".".join(rel.parts))
    return out


def test_every_source_package_is_listed_and_every_listed_one_exists() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = source_packages()
    assert "orchestrator.jobside" in found  # the walk sees the tree
    assert found - listed == set(), "packages missing from pyproject.toml"
    # orchestrator.migrations (a link to alembic/) holds data modules without an __init__.py
    assert [p for p in listed if not (ROOT / p.replace(".", "/")).is_dir()] == [], "listed packages that do not exist"
