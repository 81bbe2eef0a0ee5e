"""orchestrator.core.retryplan: the policy's decision as one frozen, typed value (``RetryPlan``), stored as JSON on
the ended attempt and copied onto the next one; its JSON form is ``orch show``'s ``action``."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime

import pytest

from orchestrator.core.models import JSONType, PlanType
from orchestrator.core.retryplan import ACTIONS, RetryPlan

FULL = RetryPlan.make("rollback", why="nan at step 40", auto=True, not_before=datetime(2026, 12, 1, 18, 0, 5),
                      resume="checkpoints/step-00000030", overrides={"lr": 0.5, "skip_batches": 2},
                      resources={"mem_mb": 4096}, quarantine=["checkpoints/step-00000040"],
                      prune=["checkpoints/step-00000035"], empty_trash=True, details={"resume_step": 30})


def test_a_plan_survives_its_json_form_field_for_field():
    d = FULL.as_dict()
    assert json.loads(json.dumps(d)) == d  # plain JSON: what attempts.action_json and `orch show --json` hold
    assert d["not_before"] == "2026-12-01T18:00:05" and d["overrides"] == {"lr": 0.5, "skip_batches": 2}
    assert d["quarantine"] == ["checkpoints/step-00000040"] and d["resources"] == {"mem_mb": 4096}
    assert RetryPlan.from_dict(d) == FULL
    assert RetryPlan.from_dict(RetryPlan.make("give_up").as_dict()) == RetryPlan.make("give_up")


def test_the_column_type_stores_json_and_reads_the_same_plan_back():
    t = PlanType()
    text = t.process_bind_param(FULL, None)
    assert json.loads(text) == FULL.as_dict()
    assert t.process_result_value(text, None) == FULL
    assert t.process_bind_param(None, None) is None and t.process_result_value(None, None) is None
    j = JSONType()
    assert j.process_result_value(j.process_bind_param({"b": [1, 2], "a": None}, None), None) == {"a": None,
                                                                                                   "b": [1, 2]}
    assert j.process_bind_param(None, None) is None


def test_an_unknown_action_is_refused_at_construction():
    with pytest.raises(ValueError, match="unknown action 'retry'"):
        RetryPlan.make("retry")
    with pytest.raises(ValueError, match="unknown action"):
        RetryPlan.from_dict({"action": "rm -rf"})
    assert {RetryPlan.make(a).action for a in ACTIONS} == set(ACTIONS)


def test_a_plan_is_immutable_and_with_returns_a_new_one_with_frozen_mappings():
    with pytest.raises(dataclasses.FrozenInstanceError):
        FULL.auto = False  # type: ignore[misc]
    later = FULL.with_(overrides={"lr": 0.25}, auto=False)
    assert later.overrides == (("lr", 0.25),) and later.overrides_dict == {"lr": 0.25} and later.auto is False
    assert FULL.overrides_dict == {"lr": 0.5, "skip_batches": 2} and FULL.auto is True  # the original is unchanged
    hash(later)  # frozen all the way down: usable as a key
    assert RetryPlan.make("resume", details={"b": 1, "a": 2}).details == (("a", 2), ("b", 1))  # order-independent
