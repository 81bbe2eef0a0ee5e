"""Suspect nodes on the real dev cluster: one node, ``vm``, in every partition.

* ``--exclude`` reaches sbatch: sbatch refuses a job that excludes ``vm`` outright (no node left: a permanent
  refusal, what orch must never cause), and the same argv held shows ``ExcNodeList=vm`` in ``scontrol show job``.
* After three different jobs crashed on ``vm``, ``orch nodes`` names it with its evidence, and a new job is
  still submitted without an exclusion (the partition's only node), runs, and is verified; the warning says why.
* On the 3-node ``multi`` partition: a new job excludes a suspect and runs elsewhere; a job pinned there stays;
  and a job's own retry, after its failure there made the node suspect, is steered off it.
"""

from __future__ import annotations

import re

from orchkit import wait_for
from slurmkit import SlurmKit, node_idle, run


def _scontrol(job_id: str) -> str:
    p = run("scontrol", "show", "job", job_id)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_exclude_nodes_reach_sbatch_and_excluding_the_only_node_is_refused_for_good(slurm: SlurmKit) -> None:
    import dataclasses

    import pytest

    from orchestrator.backends.slurm.sbatch import SlurmSubmitRefused

    spec = dataclasses.replace(slurm.spec("excl", ["true"]), exclude_nodes=("vm",))
    # Measured on 22.05: sbatch refuses a job whose exclusion leaves no node ("Requested node configuration is not
    # available"), which orch takes as permanent (the job would end invalid): why orch never excludes them all.
    with pytest.raises(SlurmSubmitRefused, match="Requested node configuration is not available"):
        slurm.backend.submit(spec)
    # The same argv, held (a held job is accepted and stays inspectable): the exclusion is in the job.
    argv = slurm.backend.sbatch_argv(spec, spec.attempt_dir / "slurm" / "job.sbatch")
    assert "--exclude=vm" in argv
    script = spec.attempt_dir / "slurm" / "job.sbatch"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("#!/bin/sh\ntrue\n")
    p = run(*argv[:2], "--hold", *argv[2:])
    assert p.returncode == 0, p.stderr
    job_id = p.stdout.strip().split(";")[0]
    slurm.job_ids.append(job_id)
    out = _scontrol(job_id)
    assert re.search(r"\bExcNodeList=vm\b", out), out


def test_a_job_whose_only_node_is_suspect_still_runs(orch) -> None:
    node_idle()
    orch.write_config("[policy]\nmax_attempts = 1\n")
    ids: list[str] = []
    try:
        for n in ("c1", "c2", "c3"):
            p = orch("submit", "--backend", "slurm", "--name", n, "--cpus-per-task", "1", "--", "false")
            assert p.returncode == 0, p.stdout + p.stderr
        for n in ("c1", "c2", "c3"):
            assert orch.wait(n, {"failed"}, timeout=180) == "failed"
            (a,) = orch.show(n)["attempts"]
            assert (a["failure_class"], a["nodes"]) == ("crash", "vm"), a
        rows = orch.json("nodes")
        assert [(r["node"], r["jobs"]) for r in rows] == [("vm", ["c1", "c2", "c3"])], rows

        p = orch("submit", "--backend", "slurm", "--name", "ok", "--cpus-per-task", "1", "--outputs", "o.txt", "--",
                 "sh", "-c", "echo x > o.txt")
        assert p.returncode == 0, p.stdout + p.stderr
        assert "not excluding suspect node(s) vm: the partition has 1 node and the job needs 1" in p.stderr
        ext = orch.show("ok")["attempts"][0]["external_id"]
        ids.append(ext)
        assert re.search(r"\bExcNodeList=\(null\)", _scontrol(ext))
        assert orch.wait("ok", {"done_marker_verified", "failed"}, timeout=180) == "done_marker_verified"

        p = orch("nodes", "--clear", "vm")
        assert (p.returncode, p.stdout) == (0, "cleared vm (its exclusion ends now)\n")
        assert orch.json("nodes") == []
    finally:
        for row in orch.json("status"):
            ids += [a["external_id"] for a in orch.show(row["name"])["attempts"] if a.get("external_id")]
        if ids:
            run("scancel", *ids)


def test_on_several_nodes_a_suspect_node_is_excluded_and_the_next_attempts_run_elsewhere(orch) -> None:
    """The multi partition has three nodes: after two jobs crashed on n3 (suspect_failures = 2 here), a new job's sbatch
    excludes n3 and it ran on another node. A job pinned to n3 (its own --nodelist) is still run there when requeued,
    with a warning that says so (an exclusion of its only node would leave sbatch nothing to run it on)."""
    node_idle()
    orch.write_config("[policy]\nmax_attempts = 1\ncrash_backoff_s = 0\n[nodes]\nsuspect_failures = 2\n")
    ids: list[str] = []
    try:
        for n in ("d1", "d2"):  # pinned to n3, and failing there
            p = orch("submit", "--backend", "slurm", "--partition", "multi", "--name", n, "--cpus-per-task", "1",
                     "--sbatch-arg=--nodelist=n3", "--", "false")
            assert p.returncode == 0, p.stdout + p.stderr
        for n in ("d1", "d2"):
            assert orch.wait(n, {"failed"}, timeout=180) == "failed"
            (a,) = orch.show(n)["attempts"]
            assert (a["failure_class"], a["nodes"]) == ("crash", "n3"), a
        assert [(r["node"], r["jobs"]) for r in orch.json("nodes")] == [("n3", ["d1", "d2"])]

        p = orch("submit", "--backend", "slurm", "--partition", "multi", "--name", "e1", "--cpus-per-task", "1",
                 "--outputs", "o.txt", "--", "sh", "-c", 'echo "$SLURMD_NODENAME" > o.txt')
        assert p.returncode == 0, p.stdout + p.stderr
        assert orch.wait("e1", {"done_marker_verified", "failed"}, timeout=180) == "done_marker_verified"
        (a,) = orch.show("e1")["attempts"]
        sbatch = (orch.runs / "e1" / "attempts" / "1" / "slurm" / "submitted.json").read_text()
        assert "--exclude=n3" in sbatch, sbatch
        ran_on = (orch.runs / "e1" / "o.txt").read_text().strip()
        assert ran_on != "n3" and a["nodes"] == ran_on, (ran_on, a)
        ids.append(a["external_id"])
        assert re.search(r"\bExcNodeList=n3\b", _scontrol(a["external_id"]))

        r = orch("requeue", "d1")  # pinned to n3: its only usable node, kept
        assert r.returncode == 0, r.stdout + r.stderr
        assert "not excluding suspect node(s) n3" in r.stderr, r.stderr
        assert orch.wait("d1", {"failed", "invalid"}, timeout=180) == "failed"
        a2 = orch.show("d1")["attempts"][1]
        assert (a2["failure_class"], a2["nodes"]) == ("crash", "n3"), a2
        assert "--exclude" not in (orch.runs / "d1" / "attempts" / "2" / "slurm" / "submitted.json").read_text()
    finally:
        for row in orch.json("status"):
            ids += [a["external_id"] for a in orch.show(row["name"])["attempts"] if a.get("external_id")]
        if ids:
            run("scancel", *ids)


def test_a_jobs_own_retry_is_steered_off_the_node_its_crash_made_suspect(orch) -> None:
    """A bad node kills whatever lands on it. A job not pinned anywhere lands on n3 (the other nodes are busy),
    is killed there, and n3 becomes suspect (suspect_failures = 1 here); the policy's retry of that same job (class
    killed: requeued without a person) is submitted with ``--exclude=n3``, waits for a healthy node, runs there and
    is verified."""
    node_idle()
    orch.write_config("[policy]\ncrash_backoff_s = 0\n[nodes]\nsuspect_failures = 1\n")
    blockers = [run("sbatch", "--parsable", "-p", "multi", "-w", node, "-c", "2", "-o", "/dev/null",
                    "--wrap", "sleep 600").stdout.strip()
                for node in ("vm", "n2")]
    ids: list[str] = list(blockers)
    try:
        wait_for(lambda: len(run("squeue", "-h", "-j", ",".join(blockers), "-t", "R", "-o", "%i").stdout.split()) == 2,
                 60, "the blockers running on vm and n2")
        # what runs on n3 is SIGKILLed (its ECC errors, say): class killed, requeued without a person by default
        bad_node = 'test "$SLURMD_NODENAME" = n3 && kill -9 $$; echo "$SLURMD_NODENAME" > o.txt'
        p = orch("submit", "--backend", "slurm", "--partition", "multi", "--name", "f1", "--cpus-per-task", "1",
                 "--max-attempts", "2", "--outputs", "o.txt", "--", "sh", "-c", bad_node)
        assert p.returncode == 0, p.stdout + p.stderr

        def retried() -> bool:
            orch("reconcile")
            return len(orch.show("f1")["attempts"]) == 2

        wait_for(retried, 180, "the retry of f1", interval=1)
        first = orch.show("f1")["attempts"][0]
        assert (first["failure_class"], first["nodes"]) == ("killed", "n3"), first
        sbatch = (orch.runs / "f1" / "attempts" / "2" / "slurm" / "submitted.json").read_text()
        assert "--exclude=n3" in sbatch, sbatch
        run("scancel", *blockers)
        assert orch.wait("f1", {"done_marker_verified", "failed"}, timeout=180) == "done_marker_verified"
        second = orch.show("f1")["attempts"][1]
        ran_on = (orch.runs / "f1" / "o.txt").read_text().strip()
        assert ran_on in ("vm", "n2") and second["nodes"] == ran_on, (ran_on, second)
        ids.append(second["external_id"])
    finally:
        for row in orch.json("status"):
            ids += [a["external_id"] for a in orch.show(row["name"])["attempts"] if a.get("external_id")]
        run("scancel", *ids)
