"""submitit code under orch, one import for both sides (see ``orchestrator.ops.executor`` for what it does):

* ``safe_point``: in the job, where a requested stop takes the callable's ``checkpoint()``
  (``orchestrator.integrations.submitit_runner``);
* ``OrchExecutor`` / ``OrchJob``: submitit's Executor/Job API on the submitting host. They are the controller's
  (``orchestrator.ops.executor``, with SQLAlchemy), imported only when a script names them: the job side of the same
  script, run on a node that has only the in-job kit, imports this module without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.integrations.submitit_runner import safe_point

if TYPE_CHECKING:  # for readers and type checkers; at run time __getattr__ below imports them when named
    from orchestrator.ops.executor import OrchExecutor, OrchJob

__all__ = ["OrchExecutor", "OrchJob", "safe_point"]


def __getattr__(name: str) -> Any:
    if name in ("OrchExecutor", "OrchJob"):
        try:
            from orchestrator.ops import executor
        except ImportError as e:
            raise ImportError(f"{name} submits jobs: it needs orch's controller installed (pip install orch); "
                              f"the job side (safe_point) does not ({e})") from None
        return getattr(executor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
