"""The environment a job is submitted from, as table ``environments`` stores it: once per distinct content, keyed by
its sha256. Stdlib only: ``orch submit``'s quick path computes it without SQLAlchemy.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping


def environment_record(environ: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """(sha256, vars) of the environment a job is submitted from, as table ``environments`` stores it once per
    distinct content (every attempt runs with it, whoever launches it)."""
    data = dict(sorted(environ.items()))
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest(), data
