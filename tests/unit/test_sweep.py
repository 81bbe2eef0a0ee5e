"""Sweep argument sets and array ids: pure functions, checked before anything is written."""

from __future__ import annotations

import pytest

from orchestrator.backends.slurm import states as st
from orchestrator.errors import UsageError
from orchestrator.ops.sweep import load_params, parse_grid, render, task_name


def test_grid_is_the_cartesian_product_first_axis_slowest():
    assert parse_grid(["lr=1e-3,1e-4", "seed=1,2"]) == [
        {"lr": "1e-3", "seed": "1"}, {"lr": "1e-3", "seed": "2"},
        {"lr": "1e-4", "seed": "1"}, {"lr": "1e-4", "seed": "2"}]


@pytest.mark.parametrize("axes,why", [
    (["lr"], "KEY=V1"), (["=1,2"], "KEY=V1"), (["lr="], "KEY=V1"), (["a b=1"], "KEY=V1"),
    (["lr=1", "lr=2"], "given twice"), (["a=" + ",".join(map(str, range(400))), "b=" + ",".join(map(str, range(300)))],
                                        "at most"),
])
def test_bad_grids_are_usage_errors(axes, why):
    with pytest.raises(UsageError, match=why):
        parse_grid(axes)


def test_json_lines_keep_types_and_skip_blank_lines():
    assert load_params('{"lr": 0.001, "seed": 1}\n\n{"lr": 0.01, "name": "x", "ok": true}\n', "f") == [
        {"lr": 0.001, "seed": 1}, {"lr": 0.01, "name": "x", "ok": True}]


@pytest.mark.parametrize("text,why", [
    ("[1, 2]\n", "JSON object"), ('{"lr": NaN}\n', "not a JSON object"), ("{oops\n", "not a JSON object"),
    ('{"lr": 1e400}\n', "not a finite JSON number"),
    ('{"a b": 1}\n', "keys are words"), ('{"a": [1]}\n', "values must be"), ("\n\n", "no argument sets"),
])
def test_bad_json_lines_name_the_line(text, why):
    with pytest.raises(UsageError, match=why):
        load_params(text, "params.jsonl")


def test_render_substitutes_and_escapes_braces():
    assert render(["train", "--lr", "{lr}", "--tag={name}-{{literal}}", "{ok}"],
                  {"lr": 0.5, "name": "x", "ok": True}) == ["train", "--lr", "0.5", "--tag=x-{literal}", "true"]


def test_render_refuses_a_placeholder_the_argument_set_lacks():
    with pytest.raises(UsageError, match="no 'seed'"):
        render(["t", "{seed}"], {"lr": 1})


def test_task_names_sort_in_index_order():
    assert [task_name("s", i, 12) for i in (0, 11)] == ["s.0000", "s.0011"]
    assert task_name("s", 12345, 20000) == "s.12345"


@pytest.mark.parametrize("spec,tasks", [
    ("2-4%2", [2, 3, 4]), ("1,5,7-9", [1, 5, 7, 8, 9]), ("0-10:5", [0, 5, 10]), ("3", [3]),
    ("x", []), ("4-2", []), ("0-999999999", []),
])
def test_collapsed_pending_array_ranges_expand(spec, tasks):
    assert st.expand_array_ranges(spec) == tasks


def test_sacct_array_records_are_keyed_by_task():
    text = "\n".join([
        "48|orch-b1|COMPLETED|0:0|88|None|47_0",
        "47|orch-b1|PENDING|0:0|90|None|47_[2-3%2]",  # tasks not started yet share one record
        "49|orch-b1|PREEMPTED|0:15|89|None|47_1",
        "52|orch-b1|RUNNING|0:0|95|None|47_1",  # task 1's rerun after an in-place requeue
        "7|orch-t1|RUNNING|0:0|3|None|7",
    ])
    recs = st.parse_sacct(text)
    assert sorted(recs) == ["47_0", "47_1", "47_2", "47_3", "7"]
    oc = st.outcome_from_records(recs["47_1"])
    assert (oc.phase.value, oc.restart_count) == ("running", 1)
    assert recs["47_3"][0].state == "PENDING"


def test_squeue_array_lines():
    live = st.parse_squeue("47_2|orch-b1|PENDING|JobArrayTaskLimit\n47_0|orch-b1|RUNNING|None\n"
                           "47_[5-6]|orch-b1|PENDING|None\n")
    assert sorted(live) == ["47_0", "47_2", "47_5", "47_6"]
    assert st.array_of("47_2") == "47" and st.array_of("7") == "7"
    assert st.is_job_id("47_2") and st.is_job_id("7") and not st.is_job_id("47_[1-2]") and not st.is_job_id("x")
