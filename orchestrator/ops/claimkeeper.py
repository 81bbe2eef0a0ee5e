"""The renewal of a launcher's claims while it prepares: stdlib only, so that ``orch submit``'s quick path
(``orchestrator/ops/quicksubmit.py``, no SQLAlchemy) and ``launch`` keep claims alike."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable


def launch_grace_s() -> float:
    """How long a launcher's claim holds (longer than sbatch's own timeout)."""
    try:
        return max(0.0, float(os.environ.get("ORCH_LAUNCH_GRACE_S", "120")))
    except ValueError:
        return 120.0


class ClaimKeeper:
    """Renews this launcher's claims (``claimed_at``, compare-and-set on the fence) from a small
    thread while it prepares, so a healthy but slow launcher (hashing a multi-GB checkpoint) keeps
    them; a stopped or dead one stops renewing and loses them after the launch grace.

    ``renew(claims)``: claimed_at = now for each (attempt id, fence) still ``launching`` under that fence,
    in one transaction; returns the ids still held (it runs in the keeper's thread)."""

    def __init__(self, renew: Callable[[list[tuple[int, int]]], set[int]]) -> None:
        self._renew = renew
        self._claims: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ClaimKeeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add(self, attempt_id: int, fence: int) -> None:
        with self._lock:
            self._claims[attempt_id] = fence
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="orch claim keeper", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        interval = max(0.05, launch_grace_s() / 4)
        while not self._stop.wait(interval):
            self.renew()

    def renew(self) -> None:
        with self._lock:
            claims = list(self._claims.items())
        try:
            held = self._renew(claims)  # one transaction for all (a sweep holds 1,000 claims)
        except Exception:  # a busy DB now: the next renewal tries again
            return
        with self._lock:
            for attempt_id, _fence in claims:
                if attempt_id not in held:
                    self._claims.pop(attempt_id, None)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
