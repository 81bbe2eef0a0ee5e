"""Fault and delay injection at named sites of orch's own code, for the crash and race tests.

``ORCH_FAULT=<site>`` makes this process die there (``os._exit(99)``, as a crash or kill -9 would);
``ORCH_PAUSE_AT=<site>`` (with ``ORCH_PAUSE_S``, default 3) makes it sleep there, so a test can
race another command against, e.g., a launch that is between its claim and its backend call; with
``ORCH_PAUSE_UNTIL=<file>`` the pause ends as soon as that file exists (the test says when), and
``<file>.reached`` is created when it begins (the test knows when).
Sites: ``after_attempt_row``, ``before_backend_submit``, ``after_backend_submit``, ``names_checked``
(submit/sweep: inside the write transaction, the new names found free), ``recording_success`` (inside the
write transaction that records a verified attempt), ``sweep_room_counted`` (a local sweep launcher,
holding the launch lock, has counted the throttle's free slots), ``fence_checked`` (a launcher re-checked its
claim's fence, right before the backend call), ``group_claimed`` (a group launch committed the ONE transaction
that claimed all its tasks), ``group_written`` (... and wrote every task's records, not yet flushed into
place), ``tokens_looked_up`` (a reconcile pass asked the backend for
the tokens of launches in doubt, before it re-claims them), ``wrapper_marker_decided`` (the job wrapper,
its program exited, has written or refused done.json; stop signals held), ``wrapper_end_decided`` (... and
is about to write exit.json), ``rank_before_program`` (a rank's orch parent, its stop handlers set, has not
started the program yet), ``quick:<statement>`` (the quick path ran that statement of ops/statements.py, its
transaction not yet committed), ``sqlalchemy:<statement>`` (the same, run by the SQLAlchemy path's executor),
``trackerfinish_start`` (the child that marks a job's tracker runs with its end, before it takes the job's
tracker lock), ``trackerfinish_marking`` (... holding it, about to mark).
Unset, each costs one environment lookup.
``abort_at_exit(name)``: with ``ORCH_FAULT=<name>`` the process aborts (SIGABRT) during interpreter
finalization, as a C++ destructor that finds a thread still joinable does (site ``trainer_exit``).
"""

from __future__ import annotations

import atexit
import os
import time


def site(name: str) -> None:
    if os.environ.get("ORCH_PAUSE_AT") == name:
        try:
            limit = max(0.0, min(600.0, float(os.environ.get("ORCH_PAUSE_S", "3"))))
        except ValueError:
            limit = 3.0
        until = os.environ.get("ORCH_PAUSE_UNTIL")
        if not until:
            time.sleep(limit)
        else:
            with open(until + ".reached", "a"):
                pass
        deadline = time.monotonic() + limit
        while until and not os.path.exists(until) and time.monotonic() < deadline:
            time.sleep(0.02)
    if os.environ.get("ORCH_FAULT") == name:
        os._exit(99)


def abort_at_exit(name: str) -> None:
    """With ``ORCH_FAULT=<name>``, abort during interpreter finalization ("terminate called without an active
    exception": gloo's threads torn down while the interpreter finalizes, seen on a 2-rank run after it completed)."""
    if os.environ.get("ORCH_FAULT") == name:
        atexit.register(os.abort)
