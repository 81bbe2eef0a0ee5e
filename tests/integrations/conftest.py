"""The integration tests run the examples (real Lightning / transformers / torch, tiny models) through
orch's local backend; jobs get fast heartbeats, W&B offline and no model hub."""

from __future__ import annotations

import os

import pytest
from intkit import quiet_env


@pytest.fixture(autouse=True)
def _environ_restored():
    """What an in-process test's callbacks set in os.environ (HF's OrchCallback sets TENSORBOARD_LOGGING_DIR, the kit
    ORCH_RESUME_STEP) never reaches a later test's jobs: a job then logged TensorBoard into an earlier test's run dir
    (CI, test_tracker_curves after test_hf_stop)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def orch(orch):  # extends the root fixture of the same name
    keep = {k: v for k, v in orch.env.items() if k in ("ORCH_HOME",)}
    orch.env.clear()
    orch.env.update(quiet_env(keep))
    return orch
