"""Reliability suite: crash points (R1), bad input (R4), database faults (R6).

The short form runs in CI; ``@pytest.mark.long`` variants (more random kills, more hypothesis
examples) run only with ``ORCH_LONG=1``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # crashkit, relkit

LONG = os.environ.get("ORCH_LONG") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if LONG:
        return
    skip = pytest.mark.skip(reason="long reliability variant: set ORCH_LONG=1")
    here = Path(__file__).resolve().parent
    for item in items:
        if "long" in item.keywords and Path(str(item.fspath)).resolve().is_relative_to(here):
            item.add_marker(skip)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("ORCH_", "SLURM_")) and k != "ORCH_LONG":
            monkeypatch.delenv(k, raising=False)
