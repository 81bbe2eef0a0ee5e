"""The documentation site: it builds in strict mode (a broken link, a missing anchor or a page left out of the nav
fails), and its generated reference pages say what the code says."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import reference

ROOT = Path(__file__).resolve().parents[2]


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(site)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_docs_site_builds_in_strict_mode(tmp_path):
    p = _build(ROOT, tmp_path / "site")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


@pytest.mark.parametrize("breakage", ["a link to a missing page", "a link to a missing anchor", "a page not in nav"])
def test_a_broken_link_or_a_page_outside_the_nav_fails_the_build(tmp_path, breakage):
    copy = tmp_path / "tree"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    if breakage == "a page not in nav":
        (copy / "docs" / "orphan.md").write_text("# Orphan\n")
    else:
        target = "guides/nowhere.md" if breakage == "a link to a missing page" else "guides/sweeps.md#nowhere"
        with (copy / "docs" / "index.md").open("a") as f:
            f.write(f"\nSee [this]({target}).\n")
    p = _build(copy, tmp_path / "site")
    assert p.returncode != 0, p.stdout[-2000:] + p.stderr[-2000:]
    said = p.stdout + p.stderr
    assert ("orphan.md" if breakage == "a page not in nav" else "nowhere") in said, said[-2000:]


def test_the_cli_reference_is_each_commands_own_help():
    """docs/reference/cli.md is generated (python -m orchestrator.cli.reference --write): stale, this fails."""
    assert reference.TARGET.read_text() == reference.generate()
    text = reference.TARGET.read_text()
    assert [line[len("## orch "):] for line in text.splitlines() if line.startswith("## orch ")] == \
        reference.commands()
    assert len(reference.commands()) >= 15
