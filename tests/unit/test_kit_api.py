"""The in-job kit's public API (``orchestrator.kit.__all__``): every name resolves to what its module defines, and
naming one imports only its own module, so the job wrapper (which imports the kit for the heartbeat) and a script
that uses no checkpoint never import torch, and nothing of the kit imports the controller's SQLAlchemy."""

from __future__ import annotations

import importlib
import subprocess
import sys

import orchestrator.kit as kit


def test_every_public_name_is_its_modules_own() -> None:
    assert {"Run", "CheckpointManager", "PreemptionFlag", "Heartbeat", "ShardedCheckpointer"} <= set(kit.__all__)
    for name in kit.__all__:
        obj = getattr(kit, name)
        assert obj is getattr(importlib.import_module(f"orchestrator.kit.{kit._PUBLIC[name]}"), name), name
        assert obj.__module__ == f"orchestrator.kit.{kit._PUBLIC[name]}", name  # defined there, not re-exported


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        kit.NoSuchThing  # noqa: B018
    except AttributeError as e:
        assert "NoSuchThing" in str(e)
    else:
        raise AssertionError("no AttributeError")


def test_naming_the_heartbeat_imports_neither_torch_nor_sqlalchemy() -> None:
    code = ("import sys; from orchestrator.kit import Heartbeat, PreemptionFlag, Run; "
            "print(sorted(m for m in ('torch', 'sqlalchemy', 'click', 'rich') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert p.stdout.strip() == "[]", p.stdout + p.stderr
