"""Fault and delay injection at named sites of orch's own code, for the crash and race tests.

``ORCH_FAULT=<site>`` makes this process die there (``os._exit(99)``, as a crash or kill -9 would);
``ORCH_PAUSE_AT=<site>`` (with ``ORCH_PAUSE_S``, default 3) makes it sleep there, so a test can
race another command against, e.g., a launch that is between its claim and its backend call.
Sites: ``after_attempt_row``, ``before_backend_submit``, ``after_backend_submit``. Unset, both cost
one environment lookup.
"""

from __future__ import annotations

import os
import time


def site(name: str) -> None:
    if os.environ.get("ORCH_PAUSE_AT") == name:
        try:
            time.sleep(max(0.0, min(600.0, float(os.environ.get("ORCH_PAUSE_S", "3")))))
        except ValueError:
            time.sleep(3.0)
    if os.environ.get("ORCH_FAULT") == name:
        os._exit(99)
