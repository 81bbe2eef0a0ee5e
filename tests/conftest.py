"""Fixtures shared by all test folders: a private ORCH_HOME per test, and `orch` run as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from orchkit import tree_hash  # noqa: F401 - re-exported for tests that use it

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


@dataclass
class Orch:
    """Runs `python -m orchestrator.cli` in a subprocess with this test's ORCH_HOME."""

    home: Path
    env: dict

    @property
    def runs(self) -> Path:
        return self.home / "runs"

    def __call__(self, *args: str, timeout: float = 120, env: dict | None = None,
                 check: bool = False) -> subprocess.CompletedProcess:
        p = subprocess.run([PY, "-m", "orchestrator.cli", *map(str, args)], capture_output=True, text=True,
                           timeout=timeout, env={**self.env, **(env or {})}, cwd=str(ROOT))
        if check and p.returncode != 0:
            raise AssertionError(f"orch {' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        return p

    def json(self, *args: str, **kw) -> object:
        p = self(*args, "--json", check=True, **kw)
        return json.loads(p.stdout)

    def show(self, name: str) -> dict:
        return self.json("show", name)

    def state(self, name: str) -> str:
        return self.show(name)["state"]

    def wait(self, name: str, states: set[str], timeout: float = 120, reconcile: bool = True) -> str:
        """Reconcile until the job reaches one of `states`; fail with its history otherwise."""
        t0 = time.time()
        st = None
        while time.time() - t0 < timeout:
            if reconcile:
                self("reconcile", check=True)
            st = self.state(name)
            if st in states:
                return st
            time.sleep(0.5)
        raise AssertionError(f"{name} still {st} after {timeout}s; wanted {states}: {self.show(name)}")

    def write_config(self, text: str) -> None:
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.home / "orch.toml").write_text(text)


@pytest.fixture
def orch(tmp_path: Path) -> Orch:
    home = tmp_path / "orch-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "SLURM_"))}
    env.update(ORCH_HOME=str(home), PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    return Orch(home=home, env=env)
