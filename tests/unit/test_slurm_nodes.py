"""The Slurm side of suspect nodes, faked at the subprocess boundary (``slurm._run``): sacct's
NodeList reaches the Outcome, --exclude reaches sbatch (one attempt and an array), sinfo's usable nodes. The
lines are as Slurm 22.05.8 on the dev cluster prints them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.backends.base import AttemptRef, Phase, Resources, SubmitSpec
from orchestrator.backends.slurm import backend as slurm
from orchestrator.backends.slurm import states as st


def _spec(tmp_path: Path, **kw) -> SubmitSpec:
    base = dict(job="j", attempt=1, token="tok1", run_dir=tmp_path / "runs" / "j", command=("true",),
                resources=Resources(extras={"partition": "gpu"}), task=0)
    base.update(kw)
    return SubmitSpec(**base)


def test_sacct_nodelist_is_the_outcomes_node_list_and_none_assigned_is_none():
    text = ("7|orch-a|NODE_FAIL|0:0|3|None|7|gpu[01-02]\n"
            "8|orch-b|CANCELLED by 0|0:0|4|None|8|None assigned\n"  # cancelled while pending
            "9|orch-c|FAILED|1:0|5|None|9\n")  # a line from before NodeList was asked
    recs = st.parse_sacct(text)
    assert st.outcome_from_records(recs["7"]).nodes == "gpu[01-02]"
    assert st.outcome_from_records(recs["8"]).nodes is None
    assert st.outcome_from_records(recs["9"]).phase is Phase.EXITED and st.outcome_from_records(recs["9"]).nodes is None
    assert "NodeList" in st.SACCT_FIELDS


def test_poll_reports_where_an_attempt_ran(monkeypatch, tmp_path):
    def run(argv, timeout_s, env=None):
        out = "7|orch-a|NODE_FAIL|0:0|3|None|7|vm\n" if argv[0] == "sacct" else ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(slurm, "_run", run)
    out = slurm.SlurmBackend().poll([AttemptRef("7", "a", tmp_path / "run", 1)])
    assert out["a"].nodes == "vm"


def test_exclude_nodes_reach_sbatch(tmp_path):
    b = slurm.SlurmBackend()
    argv = b.sbatch_argv(_spec(tmp_path, exclude_nodes=("gpu01", "gpu07")), tmp_path / "s")
    assert "--exclude=gpu01,gpu07" in argv and argv[-1] == str(tmp_path / "s")
    assert not any(a.startswith("--exclude") for a in b.sbatch_argv(_spec(tmp_path), tmp_path / "s"))


@pytest.mark.parametrize("own", ["--exclude=gpu09", "--nodelist=gpu01", "--excl=gpu09"])
def test_the_users_own_exclude_or_nodelist_wins(tmp_path, own):
    r = Resources(extras={"partition": "gpu", "extra_sbatch": [own]})
    argv = slurm.SlurmBackend().sbatch_argv(_spec(tmp_path, resources=r, exclude_nodes=("gpu01",)), tmp_path / "s")
    assert [a for a in argv if a.startswith(("--excl", "--nodel"))] == [own]


def test_a_node_name_that_is_not_plain_is_refused(tmp_path):
    with pytest.raises(slurm.SlurmSubmitRefused):
        slurm.SlurmBackend().sbatch_argv(_spec(tmp_path, exclude_nodes=("gpu01\n#SBATCH",)), tmp_path / "s")


def test_an_array_excludes_too(monkeypatch, tmp_path):
    calls = []

    def run(argv, timeout_s, env=None):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "55\n", "")

    monkeypatch.setattr(slurm, "_run", run)
    slurm.SlurmBackend().submit_group([_spec(tmp_path, exclude_nodes=("gpu02",))], "b0123456789abcdef", None)
    assert "--exclude=gpu02" in calls[0]


SINFO = ("gpu01|gpu*|idle\ngpu02|gpu*|mix\ngpu03|gpu*|drain\ngpu04|gpu*|down*\ngpu05|gpu*|alloc\ngpu06|gpu*|idle*\n"
         "cpu01|cpu|idle\ngpu01|debug|idle\n")


@pytest.mark.parametrize("extras, want", [
    ({"partition": "gpu"}, {"gpu01", "gpu02", "gpu05"}),
    ({}, {"gpu01", "gpu02", "gpu05"}),  # no partition: the default one (the '*')
    ({"partition": "cpu"}, {"cpu01"}),
    ({"partition": "none"}, set()),
])
def test_usable_nodes_are_the_partitions_nodes_that_can_run_a_job(monkeypatch, extras, want):
    monkeypatch.setattr(slurm, "_run", lambda argv, t, env=None: subprocess.CompletedProcess(argv, 0, SINFO, ""))
    assert slurm.SlurmBackend().usable_nodes(Resources(extras=extras)) == frozenset(want)


def test_usable_nodes_is_none_when_sinfo_cannot_answer(monkeypatch):
    monkeypatch.setattr(slurm, "_run", lambda argv, t, env=None: subprocess.CompletedProcess(argv, 1, "", "down"))
    assert slurm.SlurmBackend().usable_nodes(Resources()) is None

    def timeout(argv, t, env=None):
        raise subprocess.TimeoutExpired(argv, t)

    monkeypatch.setattr(slurm, "_run", timeout)
    assert slurm.SlurmBackend().usable_nodes(Resources()) is None


def test_the_slurm_backend_declares_node_exclusion_and_the_local_one_does_not():
    from orchestrator.backends.local import LocalBackend

    assert slurm.SlurmBackend.capabilities.node_exclusion and not LocalBackend.capabilities.node_exclusion


@pytest.mark.parametrize("extra_sbatch, hosts, want", [
    (["--nodelist=gpu[01-02]"], "gpu01\ngpu02\n", {"gpu01", "gpu02"}),
    (["--nodel=gpu05"], "gpu05\n", {"gpu05"}),  # getopt's prefix: sbatch takes it as --nodelist
    (["--nodelist=gpu01", "--nodelist=gpu02"], "gpu02\n", {"gpu02"}),  # the last one, as sbatch
    (["--nodelist=gpu03"], "gpu03\n", set()),  # pinned to a drained node: none usable
    (["--nodes=2"], None, {"gpu01", "gpu02", "gpu05"}),  # not a pin
])
def test_a_job_pinned_to_nodes_can_use_only_those(monkeypatch, extra_sbatch, hosts, want):
    """A job whose own --nodelist names a suspect can run only there: its usable nodes are its pin's, so the rule
    keeps the suspect and says so (the exclusion was computed, then dropped unsaid by exclude_options)."""
    def run(argv, t, env=None):
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            assert hosts is not None and argv[3] == extra_sbatch[-1].split("=", 1)[1]
            return subprocess.CompletedProcess(argv, 0, hosts, "")
        return subprocess.CompletedProcess(argv, 0, SINFO, "")

    monkeypatch.setattr(slurm, "_run", run)
    res = Resources(extras={"partition": "gpu", "extra_sbatch": extra_sbatch})
    assert slurm.SlurmBackend().usable_nodes(res) == frozenset(want)


def test_a_pin_read_from_a_file_or_unreadable_excludes_nothing(monkeypatch):
    monkeypatch.setattr(slurm, "_run", lambda argv, t, env=None: subprocess.CompletedProcess(
        argv, 1 if argv[0] == "scontrol" else 0, SINFO, ""))
    assert slurm.SlurmBackend().usable_nodes(Resources(extras={"extra_sbatch": ["--nodelist=./nodes.txt"]})) is None
    assert slurm.SlurmBackend().usable_nodes(Resources(extras={"extra_sbatch": ["--nodelist=gpu01"]})) is None


@pytest.mark.parametrize("extra_sbatch, want", [
    ([], None),
    (["--nodes=2", "--comment=x"], None),
    (["--nodelist=gpu[01-02]"], "--nodelist=gpu[01-02]"),
    (["--exclude=gpu03"], "--exclude=gpu03"),
    (["--exc=gpu03", "--nodel=gpu01"], "--nodel=gpu01"),  # getopt prefixes, the last one
])
def test_a_jobs_own_node_choice_is_the_option_sbatch_takes_and_orch_adds_no_exclusion_beside_it(extra_sbatch, want):
    from orchestrator.backends.slurm.sbatch import exclude_options

    res = Resources(extras={"extra_sbatch": extra_sbatch})
    assert slurm.SlurmBackend().own_node_choice(res) == want
    assert exclude_options(["gpu02"], res) == ([] if want else ["--exclude=gpu02"])
