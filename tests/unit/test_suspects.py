"""Suspect nodes: the exclusion rule as pure functions, against node lists as sacct and
SLURM_JOB_NODELIST print them (Slurm 22.05's compressed hostlist form: ``gpu[01-03,07]``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.decide.suspects import Failure, Rule, choose_exclusion, expand_hostlist, find_suspects
from orchestrator.protocol import FailureClass as F

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RULE = Rule(failures=3, window_s=3600, exclusion_s=7200)


def fail(job: str, nodes: str, minutes: float, cls: F = F.CRASH, group: str | None = None, attempt: int = 1) -> Failure:
    return Failure(job=job, group=group or job, attempt=attempt, cls=cls, at=T0 + timedelta(minutes=minutes),
                   nodes=nodes)


# ------------------------------------------------------------------------------------------
# hostlist expansion (sacct NodeList / SLURM_JOB_NODELIST as recorded)
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, want", [
    ("vm", ["vm"]),
    ("gpu07", ["gpu07"]),
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("gpu[01-02],cpu5", ["gpu01", "gpu02", "cpu5"]),
    ("a[1-2]-b[08-09]", ["a1-b08", "a1-b09", "a2-b08", "a2-b09"]),
    ("node[9-11]", ["node9", "node10", "node11"]),
    ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
    ("c1,c2", ["c1", "c2"]),
])
def test_expand_hostlist_reads_slurms_compressed_form(spec, want):
    assert expand_hostlist(spec) == want


@pytest.mark.parametrize("spec", ["", "None assigned", "gpu[01-", "gpu[3-1]", "gpu[a-b]", "gpu]", "x[0-999999999]",
                                  "bad name"])
def test_expand_hostlist_refuses_what_is_not_a_node_list(spec):
    with pytest.raises(ValueError):
        expand_hostlist(spec)


# ------------------------------------------------------------------------------------------
# the rule: >= K failures of suspect classes, from K different jobs, within the window
# ------------------------------------------------------------------------------------------
def test_three_crashes_of_three_jobs_on_one_node_make_it_a_suspect_until_the_exclusion_ends():
    fs = [fail("a", "gpu[01-02]", 0), fail("b", "gpu02", 10, F.NODE_FAIL), fail("c", "gpu[02-03]", 20, F.HANG)]
    s = find_suspects(fs, RULE, T0 + timedelta(minutes=30))
    assert set(s) == {"gpu02"}
    assert s["gpu02"].until == T0 + timedelta(minutes=20, seconds=7200)
    assert [(f.job, f.cls) for f in s["gpu02"].evidence] == [("a", F.CRASH), ("b", F.NODE_FAIL), ("c", F.HANG)]
    # the exclusion expires exclusion_s after the failure that made the node a suspect
    assert find_suspects(fs, RULE, T0 + timedelta(minutes=20, seconds=7199))
    assert not find_suspects(fs, RULE, T0 + timedelta(minutes=20, seconds=7200))


def test_failures_of_one_job_count_once():
    # one job's bug crashing three times on the same node says nothing about the node
    fs = [fail("a", "gpu01", m, attempt=i) for i, m in enumerate((0, 5, 10), 1)] + [fail("b", "gpu01", 15)]
    assert not find_suspects(fs, RULE, T0 + timedelta(minutes=20))


def test_the_tasks_of_one_sweep_count_as_one_job():
    fs = [fail(f"sw-{i}", "gpu01", i, group="sweep:sw") for i in range(5)]
    assert not find_suspects(fs, RULE, T0 + timedelta(minutes=10))


def test_preemptions_timeouts_oom_and_invalid_input_never_count():
    fs = [fail(j, "gpu01", m, c) for j, m, c in (("a", 0, F.PREEMPTED), ("b", 1, F.INVALID), ("c", 2, F.OOM),
                                                   ("d", 3, F.TIMEOUT), ("e", 4, F.CANCELLED), ("f", 5, F.NAN))]
    assert not find_suspects(fs, RULE, T0 + timedelta(minutes=10))


def test_failures_further_apart_than_the_window_do_not_add_up():
    fs = [fail("a", "gpu01", 0), fail("b", "gpu01", 40), fail("c", "gpu01", 61)]
    assert not find_suspects(fs, RULE, T0 + timedelta(minutes=62))
    fs.append(fail("d", "gpu01", 70))  # b, c, d within one hour
    assert set(find_suspects(fs, RULE, T0 + timedelta(minutes=71))) == {"gpu01"}


def test_a_clear_forgets_the_evidence_before_it():
    fs = [fail("a", "gpu01", 0), fail("b", "gpu01", 1), fail("c", "gpu01", 2)]
    now = T0 + timedelta(minutes=5)
    assert find_suspects(fs, RULE, now)
    assert not find_suspects(fs, RULE, now, clears={"gpu01": T0 + timedelta(minutes=3)})
    fs += [fail("d", "gpu01", 6), fail("e", "gpu01", 7), fail("f", "gpu01", 8)]  # failing again after the clear
    assert set(find_suspects(fs, RULE, T0 + timedelta(minutes=9), clears={"gpu01": T0 + timedelta(minutes=3)}))


def test_k_zero_turns_the_rule_off_and_an_unreadable_node_list_is_skipped():
    fs = [fail(j, "gpu01", m) for j, m in (("a", 0), ("b", 1), ("c", 2))] + [fail("d", "gpu[01-", 3)]
    assert not find_suspects(fs, Rule(0, 3600, 7200), T0 + timedelta(minutes=5))
    assert set(find_suspects(fs, RULE, T0 + timedelta(minutes=5))) == {"gpu01"}


# ------------------------------------------------------------------------------------------
# never unschedulable: what the job may be excluded from
# ------------------------------------------------------------------------------------------
def test_suspects_are_excluded_when_enough_nodes_remain():
    ex, warning = choose_exclusion({"gpu02"}, frozenset({"gpu01", "gpu02", "gpu03"}), needed=2)
    assert ex == ["gpu02"] and warning is None


def test_suspects_outside_the_partition_are_not_named():
    ex, _ = choose_exclusion({"gpu02", "cpu9"}, frozenset({"gpu01", "gpu02"}), needed=1)
    assert ex == ["gpu02"]


def test_the_only_node_of_a_one_node_partition_is_never_excluded():
    ex, warning = choose_exclusion({"vm"}, frozenset({"vm"}), needed=1)
    assert ex == [] and "vm" in warning and "1 node" in warning


def test_no_exclusion_when_fewer_than_the_jobs_nodes_would_remain():
    ex, warning = choose_exclusion({"gpu01"}, frozenset({"gpu01", "gpu02"}), needed=2)
    assert ex == [] and warning


def test_no_exclusion_when_the_partitions_nodes_are_unknown():
    ex, warning = choose_exclusion({"gpu01"}, None, needed=1)
    assert ex == [] and "cannot" in warning


def test_a_job_that_chooses_its_own_nodes_is_excluded_from_none_and_told_which_suspects_it_keeps():
    """A job pinned to 2 nodes, one a suspect: 1 of 2 nodes left would pass the count, but sbatch gets no orch
    --exclude beside the user's own choice, so none is claimed and the warning names the kept suspect."""
    ex, warning = choose_exclusion({"gpu02", "gpu09"}, frozenset({"gpu01", "gpu02"}), needed=1,
                                   own="--nodelist=gpu[01-02]")
    assert ex == []
    assert warning == "not excluding suspect node(s) gpu02: the job chooses its own nodes (--nodelist=gpu[01-02])"
    assert choose_exclusion({"gpu09"}, frozenset({"gpu01", "gpu02"}), needed=1, own="--nodelist=gpu[01-02]") == \
        ([], None)  # a suspect the pin never reaches: nothing to say


# ------------------------------------------------------------------------------------------
# through the services: evidence from the attempts table, --exclude in the submission, clears
# ------------------------------------------------------------------------------------------
def _node_scheduler(monkeypatch, usable, exclusion=True):
    """The shared fake, reporting the node list as sacct's NodeList does (no exit record: a node that died
    takes the wrapper with it), able to exclude nodes, with ``usable`` as the partition's nodes."""
    import dataclasses

    from orchkit import fake_scheduler, use_backend

    from orchestrator.backends.base import Capabilities

    s = fake_scheduler("fakeslurm")
    s.capabilities = Capabilities(node_exclusion=exclusion)
    s.specs = []
    s.usable_nodes = lambda _resources: usable
    plain_submit, plain_poll = s.submit, s.poll
    s.submit = lambda spec: (s.specs.append(spec), plain_submit(spec))[1]
    s.poll = lambda refs: {t: dataclasses.replace(o, nodes="gpu[01-02]") for t, o in plain_poll(refs).items()}
    use_backend(monkeypatch, s)
    return s


def _three_jobs_crash(db, cfg, sched) -> None:
    from orchestrator.ops.reconcile import reconcile_pass
    from orchestrator.ops.submit import SubmitRequest, submit

    for n in ("a", "b", "c"):
        submit(db, cfg, SubmitRequest(name=n, command=["true"], backend="fakeslurm"))
    sched.ended.update(a=1, b=1, c=1)
    reconcile_pass(db, cfg, backend_for=lambda _n: sched)


def _submit_d(db, cfg, sched, **kw):
    from orchestrator.ops.submit import SubmitRequest, submit

    submit(db, cfg, SubmitRequest(name="d", command=["true"], backend="fakeslurm", **kw))
    return next(sp for sp in sched.specs if sp.job == "d").exclude_nodes


def test_a_node_list_from_the_scheduler_is_recorded_when_no_exit_record_says_where(db, cfg, monkeypatch):
    from orchestrator.core.jobqueries import get_job

    sched = _node_scheduler(monkeypatch, frozenset({"gpu01", "gpu02", "gpu03"}))
    _three_jobs_crash(db, cfg, sched)
    with db.read() as s:
        a = get_job(s, "a").attempts[0]
        assert (a.failure_class, a.nodes) == (F.CRASH, "gpu[01-02]")


def test_new_attempts_exclude_the_suspects_and_a_clear_ends_it(db, cfg, monkeypatch):
    from orchestrator.core.models import NodeClear
    from orchestrator.decide.suspects import clear, current_suspects
    from orchestrator.errors import UsageError

    sched = _node_scheduler(monkeypatch, frozenset({"gpu01", "gpu02", "gpu03"}))
    _three_jobs_crash(db, cfg, sched)
    assert set(current_suspects(db, cfg, "fakeslurm")) == {"gpu01", "gpu02"}
    assert _submit_d(db, cfg, sched) == ("gpu01", "gpu02")
    for bad in ("gpu03", "gpu01;rm", ""):  # not a suspect / not a node name: refused, nothing written
        with pytest.raises(UsageError, match="--clear"):
            clear(db, cfg, "fakeslurm", bad)
    with db.read() as s:
        assert s.query(NodeClear).count() == 0
    clear(db, cfg, "fakeslurm", "gpu01")
    assert set(current_suspects(db, cfg, "fakeslurm")) == {"gpu02"}


def test_a_sweeps_group_submission_excludes_the_suspects_too(db, cfg, monkeypatch):
    import dataclasses

    from orchestrator.ops.sweep import SweepRequest, submit_sweep

    sched = _node_scheduler(monkeypatch, frozenset({"gpu01", "gpu02", "gpu03"}))
    _three_jobs_crash(db, cfg, sched)
    sched.capabilities = dataclasses.replace(sched.capabilities, group_queue=True)  # launch_group's path
    monkeypatch.setattr("orchestrator.ops.sweep.get_backend", lambda _name: sched)
    submit_sweep(db, cfg, SweepRequest(name="sw", command=["echo", "{x}"], params=[{"x": 1}, {"x": 2}],
                                       backend="fakeslurm"))
    tasks = [sp for sp in sched.specs if sp.job.startswith("sw")]
    assert len(tasks) == 2 and {sp.exclude_nodes for sp in tasks} == {("gpu01", "gpu02")}


def test_a_job_is_never_left_without_enough_nodes(db, cfg, monkeypatch, capfd):
    sched = _node_scheduler(monkeypatch, frozenset({"gpu01", "gpu02"}))  # both nodes are suspects
    _three_jobs_crash(db, cfg, sched)
    assert _submit_d(db, cfg, sched) == ()
    assert "not excluding suspect node(s) gpu01,gpu02: the partition has 2 nodes" in capfd.readouterr().err


def test_a_job_choosing_its_own_nodes_gets_no_exclusion_and_a_warning_naming_the_suspect_it_keeps(db, cfg, monkeypatch,
                                                                                               capfd):
    sched = _node_scheduler(monkeypatch, frozenset({"gpu01", "gpu02", "gpu03"}))  # its pin's, 2 suspects
    sched.own_node_choice = lambda _resources: "--nodelist=gpu[01-03]"
    _three_jobs_crash(db, cfg, sched)
    assert _submit_d(db, cfg, sched) == ()
    assert "not excluding suspect node(s) gpu01,gpu02: the job chooses its own nodes (--nodelist=gpu[01-03])" in \
        capfd.readouterr().err


def test_a_backend_that_cannot_exclude_nodes_is_never_asked_to(db, cfg, monkeypatch):
    sched = _node_scheduler(monkeypatch, frozenset({"gpu01", "gpu02", "gpu03"}), exclusion=False)
    _three_jobs_crash(db, cfg, sched)
    assert _submit_d(db, cfg, sched) == ()


def test_k_zero_in_orch_toml_turns_exclusion_off(db, cfg, monkeypatch):
    sched = _node_scheduler(monkeypatch, frozenset({"gpu01", "gpu02", "gpu03"}))
    _three_jobs_crash(db, cfg, sched)
    cfg.suspect_failures = 0
    assert _submit_d(db, cfg, sched) == ()


# ------------------------------------------------------------------------------------------
# orch nodes
# ------------------------------------------------------------------------------------------
def _home_with_suspects(orch, monkeypatch) -> None:
    """Three jobs crashed on gpu[01-02] under a fake named slurm, in the CLI's own ORCH_HOME."""
    from orchestrator.core.config import load_config
    from orchestrator.core.db import Database
    from orchestrator.ops.reconcile import reconcile_pass
    from orchestrator.ops.submit import SubmitRequest, submit

    sched = _node_scheduler(monkeypatch, frozenset({"gpu01", "gpu02", "gpu03"}))
    sched.name = "slurm"
    cfg = load_config(orch.home)
    db = Database(cfg)
    for n in ("a", "b", "c"):
        submit(db, cfg, SubmitRequest(name=n, command=["true"], backend="slurm"))
    sched.ended.update(a=1, b=1, c=1)
    reconcile_pass(db, cfg, backend_for=lambda _n: sched)
    db.engine.dispose()


def test_orch_nodes_lists_suspects_with_their_evidence_and_clear_ends_one(orch, monkeypatch):
    import json
    import sqlite3

    _home_with_suspects(orch, monkeypatch)
    rows = json.loads(orch.cli("nodes", "--json").stdout)
    assert [r["node"] for r in rows] == ["gpu01", "gpu02"]
    assert rows[0]["jobs"] == ["a", "b", "c"] and rows[0]["backend"] == "slurm"
    assert {(e["job"], e["attempt"], e["class"]) for e in rows[0]["evidence"]} == {
        ("a", 1, "crash"), ("b", 1, "crash"), ("c", 1, "crash")}
    text = orch.cli("nodes").stdout
    assert "gpu01" in text and "a,b,c" in text and "crash" in text
    for bad, msg in (("gpu09", "orch: --clear gpu09: not an excluded node (orch nodes lists them)\n"),
                     ("gpu01;x", "orch: --clear 'gpu01;x': not a node name\n")):
        p = orch.cli("nodes", "--clear", bad)
        assert (p.returncode, p.stderr) == (2, msg)
    with sqlite3.connect(orch.home / "orch.db") as c:
        assert c.execute("SELECT count(*) FROM node_clears").fetchone()[0] == 0
    p = orch.cli("nodes", "--clear", "gpu01")
    assert (p.returncode, p.stdout) == (0, "cleared gpu01 (its exclusion ends now)\n")
    assert [r["node"] for r in json.loads(orch.cli("nodes", "--json").stdout)] == ["gpu02"]


def test_orch_nodes_with_no_suspects_says_so(orch):
    p = orch.cli("nodes", "--clear", "a b")  # refused before ORCH_HOME or the DB is created
    assert (p.returncode, p.stderr, orch.home.exists()) == (2, "orch: --clear 'a b': not a node name\n", False)
    p = orch.cli("nodes")
    assert (p.returncode, p.stdout) == (0, "no suspect nodes\n")
    assert orch.cli("nodes", "--json").stdout.strip() == "[]"
