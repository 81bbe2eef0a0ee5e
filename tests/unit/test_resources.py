"""``Resources``: generic fields plus per-backend extras. Each backend declares the extras it takes and
refuses any other before a row is written; resources JSON written by an older orch (Slurm's options at the top
level) still reads back as the same request."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from sqlalchemy import text

from orchestrator.backends import get_backend
from orchestrator.backends.base import BackendError, Resources, SubmitSpec
from orchestrator.cli.args import job_settings
from orchestrator.core.jobqueries import get_job
from orchestrator.core.resources import resources_dict, resources_of
from orchestrator.ops.executor import OrchExecutor


def _sbatch(resources: Resources, tmp_path: Path) -> list[str]:
    spec = SubmitSpec(job="j", attempt=1, token="tok", run_dir=tmp_path / "j", command=("true",), resources=resources)
    return get_backend("slurm").sbatch_argv(spec, tmp_path / "job.sbatch")


def test_a_row_written_in_the_old_shape_reads_back_as_the_same_request(db, tmp_path: Path) -> None:
    # An older orch's job row kept Slurm's options at the top level of resources_json.
    old = {"partition": "spot", "account": "acct", "extra_sbatch": ["--qos=high"], "mem_mb": 500, "gpus": 1,
           "keep": ["ck/*"]}
    with db.engine.begin() as conn:
        conn.execute(text("INSERT INTO jobs (name, state, backend, run_dir, command_json, resources_json, "
                          "outputs_json, max_attempts, overrides_json, created_at, updated_at) VALUES ('old', "
                          "'pending', 'slurm', '/r', '[\"true\"]', :res, '[]', 3, '{}', '2026-11-30 12:00:00', "
                          "'2026-11-30 12:00:00')"),
                     {"res": json.dumps(old)})
    with db.read() as s:
        r = resources_of(get_job(s, "old").resources)
    assert r == Resources(gpus=1, mem_mb=500,
                          extras={"partition": "spot", "account": "acct", "extra_sbatch": ("--qos=high",)})
    argv = _sbatch(r, tmp_path)
    assert {"--partition=spot", "--account=acct", "--qos=high", "--mem=500M", "--gres=gpu:1"} <= set(argv)


def test_the_new_shape_round_trips_and_stays_hashable() -> None:
    stored = {"mem_mb": 500, "time_s": 60, "extras": {"partition": "spot", "extra_sbatch": ["--qos=high"]}}
    r = resources_of(stored)
    assert resources_dict(r) == stored
    assert hash(r) == hash(resources_of(dict(stored)))  # a group submission groups tasks by it
    assert r.extra("partition") == "spot" and r.extra("account") is None


def test_each_declared_slurm_extra_reaches_sbatch(tmp_path: Path) -> None:
    # A declared extra that the backend never reads would be accepted and silently dropped.
    base = _sbatch(Resources(), tmp_path)
    value = {"partition": "spot", "account": "acct", "extra_sbatch": ("--qos=high",)}
    for key in get_backend("slurm").capabilities.extras:
        assert _sbatch(Resources(extras={key: value[key]}), tmp_path) != base, key


@pytest.mark.parametrize("backend,extras,message", [
    ("local", {"partition": "spot"}, "the local backend does not take partition (it takes: none)"),
    ("slurm", {"qos": "high"}, "the slurm backend does not take qos (it takes: account, extra_sbatch, partition)"),
])
def test_a_backend_refuses_extras_it_does_not_declare(backend: str, extras: dict, message: str) -> None:
    with pytest.raises(BackendError) as e:
        get_backend(backend).check_resources(Resources(extras=extras))
    assert str(e.value) == message


def test_the_python_api_stores_slurm_options_as_extras_and_ignores_them_locally() -> None:
    params = dict(slurm_partition="spot", slurm_qos="high", mem_gb=1)
    slurm, local = OrchExecutor(backend="slurm"), OrchExecutor(backend="local")
    assert slurm._resources(params) == {"mem_mb": 1024, "extras": {"partition": "spot", "extra_sbatch": ["--qos=high"]}}
    assert local._resources(params) == {"mem_mb": 1024}  # as submitit's AutoExecutor ignores another cluster's


def _cli(**given: object) -> dict:
    opts = dict(backend="local", mem=None, time_=None, gpus=None, cpus_per_task=None, partition=None, account=None,
                sbatch_args=(), warning_signal=None, spot_notice=None, keep=(), max_attempts=None, outputs=())
    return job_settings({**opts, **given})[1]


def test_the_cli_stores_backend_options_as_extras() -> None:
    assert _cli(backend="slurm", partition="spot", mem="100M", sbatch_args=("--qos=high",)) == \
        {"mem_mb": 100, "extras": {"partition": "spot", "extra_sbatch": ["--qos=high"]}}


def test_the_cli_refuses_an_option_the_backend_does_not_take_naming_the_ones_that_do() -> None:
    with pytest.raises(click.BadParameter) as e:
        _cli(backend="local", account="acct")
    assert e.value.message == "--partition/--account/--sbatch-arg need --backend slurm"


def test_the_partition_is_read_where_each_orch_version_wrote_it():
    # Goodput's grouping and the MTBF's history read the top level only: every job a newer orch wrote (its
    # partition under extras) was partition "-" in `orch report` over the dev cluster's real trials.
    from types import SimpleNamespace

    from orchestrator.core.resources import partition_of, resources_dict
    from orchestrator.decide.mtbf import partition_key
    from orchestrator.views.goodputview import group_of

    new = resources_dict(Resources(extras={"partition": "spot"}))
    assert partition_of(new) == "spot" and partition_of({"partition": "old"}) == "old"
    assert partition_of({}) is None and partition_of(None) is None and partition_of({"extras": "x"}) is None
    assert partition_key("slurm", new) == "slurm/spot"
    assert group_of(SimpleNamespace(resources=new, backend="slurm", sweep=None))["partition"] == "slurm/spot"


def test_a_reshape_is_refused_where_the_job_cannot_run_it_and_applied_where_it_can():
    """`orch requeue NAME --nodes N --nproc-per-node K` (issue 31): submit's rules, against what the job has."""
    from orchestrator.core.resources import layout_text, reshape_refusal, reshaped

    ranks = {"nodes": 2, "nproc_per_node": 2, "extras": {"partition": "multi"}}
    assert reshape_refusal(ranks, 1, None, multi_node=True) is None
    assert reshaped(ranks, 1, None) == {**ranks, "nodes": 1}
    assert layout_text(reshaped(ranks, 1, None)) == "1 node x 2 ranks"
    assert "one machine only" in reshape_refusal(ranks, 2, None, multi_node=False)
    assert "--nodes needs --nproc-per-node" in reshape_refusal({}, 2, None, multi_node=True)
    assert reshape_refusal({}, 2, 4, multi_node=True) is None
    assert layout_text(reshaped({}, None, 4)) == "1 node x 4 ranks" and layout_text({}) == "the program as given"
    # a job that ran as given with its own --sbatch-arg=--nodes=2: orch would then set --nodes itself as well
    own = {"extras": {"extra_sbatch": ["--nodes=2"]}}
    assert "'--nodes=2'" in reshape_refusal(own, None, 2, multi_node=True)
    assert reshape_refusal(own, None, None, multi_node=True) is None  # nothing reshaped: nothing to refuse
