"""kit/wandbstep.py: a framework's W&B rows carry its step as W&B's own (``step=``), so that W&B keeps one monotone
curve across a kill -9; a caller's own step, positional arguments, or a row without the step are passed as given."""

from __future__ import annotations

import types

from orchestrator.kit.wandbstep import StepNumberedLog, StepNumberedModule


def _recorder() -> tuple[list, object]:
    calls: list = []
    return calls, lambda *a, **k: calls.append((a, k))


def test_a_row_with_the_step_key_is_logged_at_that_step():
    calls, log = _recorder()
    StepNumberedLog(log, "train/global_step")({"loss": 1.0, "train/global_step": 7}, commit=True)
    assert calls == [(({"loss": 1.0, "train/global_step": 7},), {"step": 7, "commit": True})]


def test_what_the_caller_decided_is_passed_as_given():
    calls, log = _recorder()
    numbered = StepNumberedLog(log, "s")
    numbered({"s": 3}, step=9)  # the caller's own step wins
    numbered({"s": 3}, 9)  # positionally too
    numbered({"loss": 1.0})  # no step in the row: W&B numbers it
    numbered({"s": "3"})  # not an int: not a step
    assert [k.get("step") for _a, k in calls] == [9, None, None, None]
    assert calls[1][0] == ({"s": 3}, 9)


def test_the_module_proxy_numbers_log_and_forwards_the_rest():
    calls, log = _recorder()
    module = types.SimpleNamespace(log=log, run="the run", define_metric=lambda *a, **k: "defined")
    proxy = StepNumberedModule(module, "train/global_step")
    proxy.log({"train/global_step": 2})
    assert calls == [(({"train/global_step": 2},), {"step": 2})]
    assert (proxy.run, proxy.define_metric("x")) == ("the run", "defined")
