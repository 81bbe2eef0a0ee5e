"""W&B rows numbered by the framework's own step, so that a job's W&B curve never goes back.

Lightning's ``WandbLogger`` and HF's ``WandbCallback`` log their step as a metric of its own (``trainer/global_step``,
``train/global_step``) and let W&B number the rows. After a kill -9, the resumed attempt trains the steps after its
checkpoint again and logged them again: W&B held two rows for each, and the chart against the framework's step went
back at every such resume. Given the step (``wandb.log(..., step=N)``, as a plain loop does), W&B keeps a step's first
values and drops a later row whose step is lower than the run's last one, with a warning: one monotone curve, whose
steps trained again show the killed attempt's values. W&B's rewind would show the resumed ones, but it is in preview,
works once per run and not offline (docs/trackers.md).

Stdlib only: the integrations call it on the objects they already hold, and nothing here imports W&B.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class StepNumberedLog:
    """A ``wandb.log`` that passes ``step=int(data[step_key])`` when its caller gave no step and the row holds one."""

    def __init__(self, log: Callable[..., Any], step_key: str) -> None:
        self._log = log
        self.step_key = step_key

    def __call__(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        if args or "step" in kwargs or not isinstance(data, dict) or not isinstance(data.get(self.step_key), int):
            return self._log(data, *args, **kwargs)
        return self._log(data, *args, step=data[self.step_key], **kwargs)


class StepNumberedModule:
    """The ``wandb`` module as HF's ``WandbCallback`` holds it (``self._wandb``), its ``log`` numbered by step."""

    def __init__(self, module: Any, step_key: str) -> None:
        self._module = module
        self.log = StepNumberedLog(module.log, step_key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)
