"""submitit code under orch, one import for both sides (see ``orchestrator.executor`` for what it does):

* ``OrchExecutor`` / ``OrchJob``: submitit's Executor/Job API on the submitting host (``orchestrator.executor``);
* ``safe_point``: in the job, where a requested stop takes the callable's ``checkpoint()``
  (``orchestrator.integrations.submitit_runner``).
"""

from orchestrator.executor import OrchExecutor, OrchJob
from orchestrator.integrations.submitit_runner import safe_point

__all__ = ["OrchExecutor", "OrchJob", "safe_point"]
