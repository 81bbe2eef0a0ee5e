"""orch-kit installs and runs in a fresh venv without the controller's dependencies.

A compute node, or the user's training venv, installs only the job side (packaging/orch-kit): the job wrapper, the
in-job kit, the run-dir protocol, the integrations and the bundled trainer. These tests build its wheel from a copy
of the tree, install it with ``--no-index`` into a venv that has nothing else (so it needs no dependency), and run
every entry point there from outside the checkout, under ``-I`` (no PYTHONPATH, no user site): SQLAlchemy, Alembic,
click and rich are not importable, and nothing asks for them.

torch is the user's (the kit's ``torch`` extra): where a test needs it, the venv sees the dev venv's torch and the
distributions it requires (tests/kitvenv.py), so SQLAlchemy and the rest stay out.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import zipfile
from pathlib import Path

import pytest
from kitvenv import CONTROLLER_DEPENDENCIES, build_wheel, copy_tree, give_users_torch, kit_venv

# Modules that need an optional framework the bare venv lacks: the import must fail on exactly that framework.
OPTIONAL = {"torch", "numpy", "lightning", "pytorch_lightning", "transformers", "accelerate", "submitit",
            "cloudpickle", "mlflow", "wandb", "tensorboard", "safetensors"}
# What the job side runs as a program, each as a node would start it (python -m ...).
ENTRY_POINTS = ["orchestrator.jobside.wrapper", "orchestrator.jobside.rankend", "orchestrator.wrapper",
                "orchestrator.rankend", "orchestrator.jobside.mlflowrun"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tree(tmp_path_factory.mktemp("src"))


@pytest.fixture(scope="module")
def kit_python(tmp_path_factory: pytest.TempPathFactory, tree: Path) -> Path:
    return kit_venv(tmp_path_factory.mktemp("kit"), tree)


def run_in(python: Path, code: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-I", "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


IMPORT_EVERY_MODULE = """
    import importlib, importlib.util, json, pkgutil, sys
    missing = [m for m in {deps!r} if importlib.util.find_spec(m) is not None]
    import orchestrator
    assert orchestrator.__file__.startswith(sys.prefix), orchestrator.__file__  # the wheel's, not the checkout's
    out = {{"controller_importable": missing, "ok": [], "needs": {{}}, "broken": {{}}}}
    names = ["orchestrator", "orch_trainer", "trainer"]
    for top in ("orchestrator", "orch_trainer", "trainer"):
        path = importlib.import_module(top).__path__
        names += [m.name for m in pkgutil.walk_packages(path, top + ".", onerror=lambda n: None)]
    for name in names:
        try:
            importlib.import_module(name)
            out["ok"].append(name)
        except ModuleNotFoundError as e:
            out["needs"][name] = (e.name or "").split(".")[0]
        except Exception as e:
            out["broken"][name] = repr(e)
    out["controller_loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in {deps!r})
    print(json.dumps(out))
"""


def import_every_module(python: Path, cwd: Path) -> dict:
    r = run_in(python, IMPORT_EVERY_MODULE.format(deps=CONTROLLER_DEPENDENCIES), cwd, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_the_kit_installs_alone_and_every_module_imports_or_names_its_missing_framework(
        kit_python: Path, tmp_path: Path) -> None:
    found = import_every_module(kit_python, tmp_path)
    assert found["controller_importable"] == [] and found["controller_loaded"] == []
    assert found["broken"] == {}
    assert set(found["needs"].values()) <= OPTIONAL, found["needs"]
    # the job side's own programs and the kit's torch-free parts import on a bare interpreter
    assert {*ENTRY_POINTS, "orchestrator.protocol", "orchestrator.kit.run", "orchestrator.kit.preemption",
            "orchestrator.kit.heartbeat", "orchestrator.kit.commit"} <= set(found["ok"])
    # nothing of the controller was shipped
    assert not [m for m in found["ok"] + list(found["needs"]) if m.split(".")[1:2] in (
        ["core"], ["ops"], ["decide"], ["views"], ["cli"], ["backends"])]


def test_each_entry_point_runs_as_a_program_on_the_bare_kit(kit_python: Path, tmp_path: Path) -> None:
    for module in ENTRY_POINTS[:4]:
        r = subprocess.run([str(kit_python), "-I", "-m", module, "--help"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0 and "usage" in r.stdout.lower(), (module, r.stdout, r.stderr)


def test_with_the_users_torch_the_whole_kit_and_the_bundled_trainer_work(kit_python: Path, tmp_path: Path) -> None:
    pth = give_users_torch(kit_python, tmp_path / "torch-only")
    try:
        found = import_every_module(kit_python, tmp_path)
        assert found["controller_importable"] == [] and found["controller_loaded"] == [] and found["broken"] == {}
        assert set(found["needs"].values()) <= OPTIONAL - {"torch"}, found["needs"]
        assert {"orchestrator.kit.checkpoint", "orchestrator.kit.sharded", "orch_trainer.loop",
                "orch_trainer.__main__"} <= set(found["ok"])
        public = run_in(kit_python, """
            import orchestrator.kit as kit
            print(sorted(n for n in kit.__all__ if getattr(kit, n) is None))
        """, tmp_path)
        assert public.returncode == 0 and public.stdout.strip() == "[]", public.stderr
        # the bundled trainer trains and writes its verified checkpoint and marker outside any orch
        out = tmp_path / "run"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
        r = subprocess.run([str(kit_python), "-I", "-m", "orch_trainer", "--preset", "tiny", "--max-steps", "4",
                            "--run-dir", str(out)], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        assert (out / "done.json").is_file()
    finally:
        pth.unlink()


def test_the_two_wheels_ship_every_module_once(tree: Path, tmp_path: Path) -> None:
    """orch's wheel and orch-kit's together hold every source module, and no file is in both."""
    kit = build_wheel(tmp_path / "kit", tree, "packaging/orch-kit")
    controller = build_wheel(tmp_path / "orch", tree, ".")

    def modules(wheel: Path) -> set[str]:
        return {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}

    in_kit, in_controller = modules(kit), modules(controller)
    assert in_kit & in_controller == set()
    source = {str(p.relative_to(tree)) for top in ("orchestrator", "orch_trainer", "trainer")
              for p in (tree / top).rglob("*.py") if "migrations" not in p.parts}
    assert source - in_kit - in_controller == set()
    assert "orchestrator/__init__.py" in in_kit and "orchestrator/jobside/wrapper.py" in in_kit
    assert "orchestrator/core/db.py" in in_controller and "orchestrator/migrations/env.py" in in_controller
    requires = zipfile.ZipFile(controller).read(
        next(n for n in zipfile.ZipFile(controller).namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-Dist: orch-kit==" in requires
