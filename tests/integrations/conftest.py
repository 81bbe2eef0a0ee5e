"""The integration tests run the examples (real Lightning / transformers / torch, tiny models) through
orch's local backend; jobs get fast heartbeats, W&B offline and no model hub."""

from __future__ import annotations

import pytest
from intkit import quiet_env


@pytest.fixture
def orch(orch):  # noqa: F811 - extends the root fixture of the same name
    keep = {k: v for k, v in orch.env.items() if k in ("ORCH_HOME",)}
    orch.env.clear()
    orch.env.update(quiet_env(keep))
    return orch
