"""A venv that holds orch-kit alone, as a compute node or a user's training venv installs it.

``kit_venv`` builds orch-kit's wheel from a copy of the tree (packaging/orch-kit) and installs it with
``--no-index`` into a venv made ``--without-pip``: nothing else is there, so SQLAlchemy, Alembic, click and rich
are not importable. ``give_users_torch`` adds the dev venv's torch and the distributions it requires, linked one by
one into a folder of their own (the user's torch, as a node has it; nothing of the controller comes along).
Used by tests/packaging (the install and the entry points) and tests/slurm (a job run by that Python).
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTROLLER_DEPENDENCIES = frozenset({"sqlalchemy", "alembic", "click", "rich"})  # also tests/unit/test_layers.py's


def build_wheel(out: Path, source: Path, project: str) -> Path:
    """The wheel of ``project`` (a folder holding a pyproject.toml), built from ``source``, a copy of the tree."""
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        str(source / project), "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


def copy_tree(dest: Path) -> Path:
    """The parts of the checkout that the two distributions build from, without caches or build output."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for part in ("orchestrator", "orch_trainer", "trainer", "packaging", "alembic"):
        shutil.copytree(ROOT / part, dest / part, ignore=ignore, symlinks=True)
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / f, dest / f)
    return dest


def kit_venv(work: Path, tree: Path | None = None) -> Path:
    """A fresh venv under ``work`` holding orch-kit's wheel and nothing else; returns its python."""
    tree = tree or copy_tree(work / "src")
    wheel = build_wheel(work / "wheel", tree, "packaging/orch-kit")
    venv = work / "kit-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index",
                        str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return python


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    return Path(out)


def distribution_closure(name: str) -> set[str]:
    """``name`` and every distribution it requires (extras aside), as installed in the dev venv."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
    return seen


def link_distributions(names: set[str], into: Path) -> Path:
    """A folder that holds (as links) the top-level files of these dev-venv distributions and nothing else."""
    into.mkdir(parents=True, exist_ok=True)
    for name in names:
        dist = importlib.metadata.distribution(name)
        for f in dist.files or []:
            top = f.parts[0]
            source = Path(dist.locate_file(top))
            if top.endswith((".dist-info", ".pth")) or top == ".." or not source.exists():
                continue
            if not (into / top).exists():
                (into / top).symlink_to(source)
    return into


USERS_TORCH_PTH = "users-torch.pth"


def give_users_torch(python: Path, folder: Path) -> Path:
    """Make the dev venv's torch (and only what it requires) importable by ``python``; returns the .pth written
    (unlink it to take torch away again)."""
    torch_only = link_distributions(distribution_closure("torch"), folder)
    assert not set(CONTROLLER_DEPENDENCIES) & {p.name for p in torch_only.iterdir()}
    pth = site_packages(python) / USERS_TORCH_PTH
    pth.write_text(f"{torch_only}\n")
    return pth
