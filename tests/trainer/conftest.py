"""Fixtures of the trainer tests (helpers live in trainerkit.py, importable from the test modules)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from trainerkit import result_state, run_inproc


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict[str, torch.Tensor]]:
    """Uninterrupted reference runs, cached per argument list (they are the slow part)."""
    cache: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}

    def get(*args: str) -> dict[str, torch.Tensor]:
        if args not in cache:
            rd = tmp_path_factory.mktemp("baseline")
            assert run_inproc(rd, *args) == 0
            cache[args] = result_state(rd)
        return cache[args]
    return get
