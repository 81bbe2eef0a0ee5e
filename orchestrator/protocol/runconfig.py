"""``run_config.json``: the effective configuration a job records (informative, never a guard).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.protocol.durable import (
    read_json_bounded,
)
from orchestrator.protocol.layout import (
    RUN_CONFIG,
)

RUN_CONFIG_LIMIT = 1 << 20

def read_run_config(run_dir: Path | str) -> dict[str, Any]:
    """``run_config.json`` as a dict, or {} when absent or unreadable (informative, never a guard).

    Values are the job's: readers take numbers through ``finite_number``/``is_int``.
    """
    try:
        r = read_json_bounded(Path(run_dir) / RUN_CONFIG, limit=RUN_CONFIG_LIMIT)
    except (OSError, ValueError):
        return {}
    return r if isinstance(r, dict) else {}
