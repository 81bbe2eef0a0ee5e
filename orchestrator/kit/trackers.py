"""A tracker never costs a checkpoint: once a stop is underway, a logger's or a tracker callback's failure is
recorded and skipped, so that the stop reaches its save.

On Slurm a preemption's SIGTERM reaches every process of the job (``scancel`` too), W&B's service
process among them. ``wandb-core`` is a Go program in its own session; it exits on SIGTERM, and Go lets no parent
make it ignore or block that signal. The script's next ``wandb.log`` raised ``ConnectionResetError`` inside HF's
``WandbCallback.on_log``, which HF calls before its save (and Lightning's loggers run between a signal and the
ranks' agreement to stop): no checkpoint, every step since the last periodic save redone, under a time limit on
every attempt. Outside a stop a failure is the user's to see, and is raised as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from orchestrator.kit.log import log

_KEPT = 5  # failures named in the stop's report; the rest are counted


class StopTolerance:
    """Wraps tracker calls: while ``stopping()`` is true, an ``Exception`` they raise is noted and the call
    returns None; otherwise it propagates unchanged. ``failures`` names what failed, for the stop's report."""

    def __init__(self, stopping: Callable[[], bool]) -> None:
        self.stopping = stopping
        self.failures: list[str] = []
        self.count = 0

    def wrap(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        """``fn``, whose failure during a stop is noted (as ``name``) and skipped; at any other time it raises."""
        if getattr(fn, "orch_stop_tolerant", False):
            return fn  # wrapped once already (a second fit on the same trainer)

        @functools.wraps(fn)
        def tolerant(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                if not self.stopping():
                    raise
                self._note(name, e)
                return None

        tolerant.orch_stop_tolerant = True  # type: ignore[attr-defined]
        return tolerant

    def wrap_methods(self, obj: Any, names: tuple[str, ...]) -> None:
        """Shadow each of ``obj``'s methods in ``names`` (those it has) with its stop-tolerant version, on the
        instance: ``isinstance`` checks and the class stay as they were."""
        for attr in names:
            fn = getattr(obj, attr, None)
            if callable(fn):
                setattr(obj, attr, self.wrap(fn, f"{type(obj).__name__}.{attr}"))

    def report(self) -> str:
        """'' or '; ignored during the stop: ...', for the stop's failure report."""
        if not self.failures:
            return ""
        more = f" (+{self.count - len(self.failures)} more)" if self.count > len(self.failures) else ""
        return "; ignored during the stop: " + "; ".join(self.failures) + more

    def _note(self, name: str, e: Exception) -> None:
        self.count += 1
        what = f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}".rstrip(": ")
        if len(self.failures) < _KEPT:
            self.failures.append(what)
        if self.count == 1:
            log(f"{what}, during the stop: ignored, the checkpoint goes on (a tracker's helper process may have "
                "been sent the same signal)")
