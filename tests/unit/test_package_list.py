"""Every package of the source tree ships in exactly one distribution: orch (the controller, ``pyproject.toml``) or
orch-kit (the job side, ``packaging/orch-kit/pyproject.toml``). A package left out installs nowhere but in an
editable checkout, so a user's ``pip install`` would fail on its first import (a restructure moves modules into new
packages one at a time; each must be listed as it appears); a package in both would be two distributions' file, and
uninstalling either would break the other. orch pins orch-kit at its own version: the controller and the job side
share one run-dir protocol, and a mixed pair would read each other's files by different rules."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "packaging" / "orch-kit"


def source_packages() -> set[str]:
    out = set()
    for top in ("orchestrator", "orch_trainer", "trainer"):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            if "__pycache__" not in rel.parts:
                out.add(".".join(rel.parts))
    return out


def project(folder: Path) -> dict:
    return tomllib.loads((folder / "pyproject.toml").read_text())


def test_every_source_package_is_in_exactly_one_distribution_and_every_listed_one_exists() -> None:
    controller = set(project(ROOT)["tool"]["setuptools"]["packages"])
    kit = set(project(KIT)["tool"]["setuptools"]["packages"])
    found = source_packages()
    assert {"orchestrator.jobside", "orchestrator.core"} <= found  # the walk sees the tree
    assert found - controller - kit == set(), "packages in neither pyproject.toml"
    assert controller & kit == set(), "packages in both distributions"
    # orchestrator.migrations (a link to alembic/) holds data modules without an __init__.py
    listed = controller | kit
    assert [p for p in listed if not (ROOT / p.replace(".", "/")).is_dir()] == [], "listed packages that do not exist"


def test_the_job_side_packages_are_the_kits_and_the_kit_reads_the_one_source_tree() -> None:
    kit = project(KIT)
    assert kit["tool"]["setuptools"]["package-dir"] == {"": "../.."}
    assert {"orchestrator", "orchestrator.protocol", "orchestrator.kit", "orchestrator.integrations",
            "orchestrator.jobside", "orch_trainer"} <= set(kit["tool"]["setuptools"]["packages"])
    assert kit["project"]["dependencies"] == []  # stdlib only: torch and the frameworks are extras


def test_orch_depends_on_orch_kit_at_its_own_version() -> None:
    controller, kit = project(ROOT)["project"], project(KIT)["project"]
    assert kit["name"] == "orch-kit"
    assert kit["version"] == controller["version"]
    assert f"orch-kit=={controller['version']}" in controller["dependencies"]
