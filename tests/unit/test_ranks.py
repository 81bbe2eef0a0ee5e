"""Multi-rank launch: the options' refusals, the sbatch options, and the torchrun/srun command the
wrapper composes, for one node and for ``--nodes 2`` (which cannot run on the one-node dev cluster: its
composition and rendezvous endpoint are checked here against ``scontrol show hostnames`` output instead).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_cli import assert_nothing_created

from orchestrator.backends import get_backend
from orchestrator.backends.base import Resources, SubmitSpec
from orchestrator.backends.slurm import SlurmBackend
from orchestrator.cli import main
from orchestrator.jobside import ranklaunch as ranks

CMD = ("/venv/bin/python", "train.py", "--lr", "0.1")

BAD = [
    ("nproc 0", ["--nproc-per-node", "0"], "Invalid value for '--nproc-per-node'"),
    ("nproc -1", ["--nproc-per-node", "-1"], "Invalid value for '--nproc-per-node'"),
    ("nodes 0", ["--backend", "slurm", "--nproc-per-node", "1", "--nodes", "0"], "Invalid value for '--nodes'"),
    ("nodes on local", ["--nproc-per-node", "2", "--nodes", "2"],
     "--nodes: the local backend runs a job on this machine only"),
    ("nodes 1 on local", ["--nproc-per-node", "2", "--nodes", "1"],
     "--nodes: the local backend runs a job on this machine only"),
    ("nodes without nproc", ["--backend", "slurm", "--nodes", "2"], "--nodes needs --nproc-per-node"),
    ("gpus and gpus-per-node", ["--backend", "slurm", "--gpus", "1", "--gpus-per-node", "1"],
     "--gpus and --gpus-per-node"),
    ("sbatch-arg --nodes with ranks", ["--backend", "slurm", "--nproc-per-node", "2", "--sbatch-arg", "--nodes=2"],
     "orch sets --nodes itself"),
    ("sbatch-arg getopt prefix --ntasks-per with ranks", ["--backend", "slurm", "--nproc-per-node", "2",
     "--sbatch-arg", "--ntasks-per=4"], "orch sets --ntasks-per itself"),
    ("gpus-per-node 0", ["--backend", "slurm", "--gpus-per-node", "0"], "Invalid value for '--gpus-per-node'"),
    ("rank-restarts without nproc", ["--rank-restarts", "2"], "--rank-restarts needs --nproc-per-node"),
    ("rank-restarts -1", ["--nproc-per-node", "2", "--rank-restarts", "-1"], "Invalid value for '--rank-restarts'"),
    ("rank-restarts 101", ["--nproc-per-node", "2", "--rank-restarts", "101"], "Invalid value for '--rank-restarts'"),
    ("spare-nodes without nodes", ["--backend", "slurm", "--nproc-per-node", "2", "--rank-restarts", "1",
                                   "--spare-nodes", "1"], "--spare-nodes needs --nodes and --rank-restarts"),
    ("spare-nodes without rank-restarts", ["--backend", "slurm", "--nproc-per-node", "2", "--nodes", "2",
                                           "--spare-nodes", "1"], "--spare-nodes needs --nodes and --rank-restarts"),
    ("min-nodes without rank-restarts", ["--backend", "slurm", "--nproc-per-node", "2", "--nodes", "2",
                                         "--min-nodes", "1"], "--min-nodes needs --nodes and --rank-restarts"),
    ("min-nodes without nodes", ["--backend", "slurm", "--nproc-per-node", "2", "--rank-restarts", "1",
                                 "--min-nodes", "1"], "--min-nodes needs --nodes and --rank-restarts"),
    ("min-nodes not below nodes", ["--backend", "slurm", "--nproc-per-node", "2", "--nodes", "2", "--rank-restarts",
                                   "1", "--min-nodes", "2"], "--min-nodes 2 must be below --nodes 2"),
    ("min-nodes 0", ["--backend", "slurm", "--nproc-per-node", "2", "--nodes", "2", "--rank-restarts", "1",
                     "--min-nodes", "0"], "Invalid value for '--min-nodes'"),
]


@pytest.mark.parametrize("args,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
@pytest.mark.parametrize("command", ["submit", "sweep"])
def test_rank_options_refused_with_exit_2_before_anything_exists(orch, monkeypatch, command, args, message):
    monkeypatch.setenv("ORCH_HOME", str(orch.home))
    monkeypatch.delenv("ORCH_DB_URL", raising=False)
    extra = ["--grid", "x=1,2"] if command == "sweep" else []
    r = CliRunner().invoke(main, [command, "--name", "ok-name", *extra, *args, "--", "bash", "-c", "exit 0"])
    assert r.exit_code == 2, (r.stdout, r.stderr, r.exception)
    assert message in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""
    assert not orch.home.exists()
    assert_nothing_created(orch)


def test_multi_node_is_asked_of_the_backend_capability_not_its_name(monkeypatch, orch):
    """A backend that says it runs several nodes gets --nodes, whatever its name."""
    from orchestrator.backends.base import Capabilities
    from orchestrator.backends.local import LocalBackend
    from orchestrator.cli.args import job_settings

    assert get_backend("slurm").capabilities.multi_node and not get_backend("local").capabilities.multi_node
    monkeypatch.setattr(LocalBackend, "capabilities", Capabilities(host_liveness=True, multi_node=True))
    opts = {"backend": "local", "mem": None, "time_": None, "partition": None, "account": None, "gpus": None,
            "cpus_per_task": None, "sbatch_args": (), "warning_signal": None, "spot_notice": None, "keep": (),
            "max_attempts": None, "outputs": (), "nproc_per_node": 2, "nodes": 3, "gpus_per_node": None}
    _backend, res, _m, _o = job_settings(opts)
    assert (res["nproc_per_node"], res["nodes"]) == (2, 3)


def test_submit_stores_the_ranks_with_the_job_resources(orch):
    p = orch("submit", "--name", "r2", "--backend", "slurm", "--partition", "nope-no-such", "--nproc-per-node", "2",
             "--nodes", "2", "--gpus-per-node", "1", "--", "true")
    # The partition does not exist: sbatch refuses, but the job row (and what it asked for) exists.
    show = orch.show("r2")
    assert show["resources"]["nproc_per_node"] == 2 and show["resources"]["nodes"] == 2, (p.stderr, show)
    assert show["resources"]["gpus_per_node"] == 1


def _spec(**res: object) -> SubmitSpec:
    return SubmitSpec(job="j", attempt=1, token="tok1", run_dir=Path("/runs/j"), command=CMD,
                      resources=Resources(**res), grace_s=90.0)  # type: ignore[arg-type]


def test_spare_nodes_are_held_beside_the_ranks_nodes_and_a_nodes_death_does_not_end_the_job():
    argv = SlurmBackend().sbatch_argv(_spec(nodes=2, nproc_per_node=4, rank_restarts=1, spare_nodes=1),
                                      Path("/runs/j/s.sbatch"))
    assert "--nodes=3" in argv and "--no-kill" in argv
    wrapper = _spec(nodes=2, nproc_per_node=4, rank_restarts=1, spare_nodes=1).wrapper_argv("/py")
    assert wrapper[wrapper.index("--spare-nodes") + 1] == "1" and wrapper[wrapper.index("--nodes") + 1] == "2"
    assert "--no-kill" not in SlurmBackend().sbatch_argv(_spec(nodes=2, nproc_per_node=4), Path("/runs/j/s.sbatch"))


def test_min_nodes_keeps_the_allocation_alive_when_a_node_dies_and_reaches_the_wrapper():
    spec = _spec(nodes=3, nproc_per_node=4, rank_restarts=1, min_nodes=2)
    argv = SlurmBackend().sbatch_argv(spec, Path("/runs/j/s.sbatch"))
    assert "--nodes=3" in argv and "--no-kill" in argv  # no node held beyond the ranks'
    wrapper = spec.wrapper_argv("/py")
    assert wrapper[wrapper.index("--min-nodes") + 1] == "2"
    from orchestrator.core.resources import reshaped

    # `orch requeue --nodes 2` of that job: never fewer than it now asks for
    assert "min_nodes" not in reshaped({"nodes": 3, "nproc_per_node": 4, "min_nodes": 2}, 2, None)
    assert reshaped({"nodes": 3, "nproc_per_node": 4, "min_nodes": 2}, 4, None)["min_nodes"] == 2


def test_lost_nodes_are_those_sinfo_says_cannot_run_a_step(monkeypatch):
    import subprocess

    out = "n1|alloc\nn2|down*\nn3|alloc*\nn4|drain\nn5|mix\n"
    monkeypatch.setattr(ranks.subprocess, "run", lambda argv, **_kw: subprocess.CompletedProcess(argv, 0, out, ""))
    assert ranks.lost_nodes(["n1", "n2", "n3", "n4", "n5"]) == ["n2", "n3", "n4"]
    monkeypatch.setattr(ranks.subprocess, "run", lambda argv, **_kw: subprocess.CompletedProcess(argv, 1, "", "x"))
    assert ranks.lost_nodes(["n1"]) is None


def test_sbatch_gets_one_task_per_node_and_gpus_per_node():
    argv = SlurmBackend().sbatch_argv(_spec(nodes=2, nproc_per_node=4, gpus_per_node=4), Path("/runs/j/s.sbatch"))
    assert "--nodes=2" in argv and "--ntasks-per-node=1" in argv and "--gpus-per-node=4" in argv
    plain = SlurmBackend().sbatch_argv(_spec(), Path("/runs/j/s.sbatch"))
    assert not [a for a in plain if a.startswith(("--nodes", "--ntasks", "--gpus-per-node"))]


def test_wrapper_argv_carries_the_ranks_and_the_grace_only_when_asked():
    argv = _spec(nodes=2, nproc_per_node=4).wrapper_argv("/py")
    cut = argv.index("--")
    assert argv[cut + 1:] == list(CMD)  # the user's command is unchanged: the wrapper composes torchrun
    head = argv[:cut]
    assert head[head.index("--nproc-per-node") + 1] == "4" and head[head.index("--nodes") + 1] == "2"
    assert head[head.index("--grace") + 1] == "90"
    plain = _spec().wrapper_argv("/py")
    assert "--nproc-per-node" not in plain and "--grace" not in plain  # `orch submit -- torchrun ...`: as before
    assert "--rank-restarts" not in argv  # not asked for
    asked = _spec(nproc_per_node=2, rank_restarts=3).wrapper_argv("/py")
    assert asked[asked.index("--rank-restarts") + 1] == "3"


def test_submit_stores_rank_restarts_with_the_ranks(orch):
    orch("submit", "--name", "rr", "--nproc-per-node", "2", "--rank-restarts", "2", "--", "true", check=True)
    assert orch.show("rr")["resources"]["rank_restarts"] == 2


def test_local_torchrun_is_standalone_with_the_job_grace_as_shutdown_timeout():
    argv = ranks.torchrun_argv("/py", ranks.RankLayout(nodes=1, nproc_per_node=2, grace_s=90), CMD)
    assert argv[:3] == ["/py", "-m", "torch.distributed.run"]
    assert "--standalone" in argv and "--rdzv-endpoint" not in argv
    assert argv[argv.index("--nproc-per-node") + 1] == "2" and argv[argv.index("--nnodes") + 1] == "1"
    # torchrun's SIGTERM -> SIGKILL of its workers is 30 s unless told: the job's grace instead (> 30 s here)
    assert argv[argv.index("--shutdown-timeout") + 1] == "90"
    assert "SIGUSR2" in argv[argv.index("--signals-to-handle") + 1].split(",")  # the warning signal is forwarded
    assert argv[-len(CMD) - 2:] == ["--no-python", "--", *CMD]


HOSTNAMES_2 = "gpu-a17\ngpu-a18\n"  # `scontrol show hostnames gpu-a[17-18]`


def test_two_nodes_one_torchrun_per_node_through_srun_rendezvous_on_the_first_node(monkeypatch):
    calls: list[list[str]] = []

    def fake_run(argv, **_kw):  # stands in for scontrol on a 2-node allocation
        calls.append(list(argv))
        import subprocess

        return subprocess.CompletedProcess(argv, 0, HOSTNAMES_2, "")

    monkeypatch.setattr(ranks.subprocess, "run", fake_run)
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu-a[17-18]", "SLURM_CPUS_PER_TASK": "8"}
    argv, layout = ranks.slurm_step_argv("/py", ranks.RankLayout(nodes=2, nproc_per_node=4, grace_s=75), CMD, env)
    assert layout.world_size == 8
    assert calls == [["scontrol", "show", "hostnames", "gpu-a[17-18]"]]
    cut = argv.index("/py")
    srun, torchrun = argv[:cut], argv[cut:]
    assert srun[0] == "srun"
    assert {"--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=8"} <= set(srun)
    port = ranks.rdzv_port("4242")
    assert 20000 <= port < 30000 and port == ranks.rdzv_port("4242") != ranks.rdzv_port("4243")
    assert torchrun[torchrun.index("--rdzv-endpoint") + 1] == f"gpu-a17:{port}"
    assert torchrun[torchrun.index("--rdzv-backend") + 1] == "c10d"
    assert torchrun[torchrun.index("--rdzv-id") + 1] == "4242"
    assert torchrun[torchrun.index("--nnodes") + 1] == "2" and torchrun[torchrun.index("--nproc-per-node") + 1] == "4"
    assert torchrun[torchrun.index("--shutdown-timeout") + 1] == "75"
    assert not [x for x in srun if x.startswith("--nodelist")]  # no spare nodes: srun takes the allocation's
    # with spare nodes the step names its nodes: the allocation's first not lost, the rendezvous on the first of them
    spare = ranks.slurm_step_argv("/py", ranks.RankLayout(nodes=1, nproc_per_node=4, grace_s=75), CMD, env,
                                  relaunch=1, avoid=("gpu-a17",), spare=1)[0]
    assert "--nodelist=gpu-a18" in spare and spare[spare.index("--rdzv-endpoint") + 1].startswith("gpu-a18:")
    assert "--overlap" in spare and "--overlap" not in argv  # a relaunch shares what the failed step still holds
    with pytest.raises(ranks.RankLaunchError, match="1 usable node"):
        ranks.slurm_step_argv("/py", ranks.RankLayout(nodes=2, nproc_per_node=4, grace_s=75), CMD, env,
                              avoid=("gpu-a17",), spare=1)
    # a rank restart in the allocation rendezvous under an id and port of its own, never the failed launch's
    again = ranks.slurm_step_argv("/py", ranks.RankLayout(nodes=2, nproc_per_node=4, grace_s=75), CMD, env,
                                  relaunch=1)[0]
    assert again[again.index("--rdzv-id") + 1] == "4242-r1"
    assert again[again.index("--rdzv-endpoint") + 1] == f"gpu-a17:{ranks.rdzv_port('4242-r1')}"
    assert "--standalone" not in torchrun and torchrun[-len(CMD):] == list(CMD)


def test_with_min_nodes_a_lost_node_leaves_the_ranks_on_the_nodes_left_down_to_that_many(monkeypatch):
    """``--min-nodes``: no spare left, the relaunch goes on with the usable nodes (a smaller world size), never
    below the minimum; without it the ranks need every node."""
    import subprocess

    hosts = "gpu-a17\ngpu-a18\ngpu-a19\n"
    monkeypatch.setattr(ranks.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 0, hosts, ""))
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu-a[17-19]"}
    three = ranks.RankLayout(nodes=3, nproc_per_node=4, grace_s=75)
    argv, layout = ranks.slurm_step_argv("/py", three, CMD, env, relaunch=1, avoid=("gpu-a18",), min_nodes=1)
    assert (layout.nodes, layout.world_size) == (2, 8)
    assert {"--nodes=2", "--ntasks=2", "--nodelist=gpu-a17,gpu-a19"} <= set(argv)
    assert argv[argv.index("--nnodes") + 1] == "2"
    _argv, layout = ranks.slurm_step_argv("/py", three, CMD, env, relaunch=2, avoid=("gpu-a17", "gpu-a18"),
                                          min_nodes=1)
    assert (layout.nodes, _argv[_argv.index("--rdzv-endpoint") + 1].split(":")[0]) == (1, "gpu-a19")
    with pytest.raises(ranks.RankLaunchError, match="1 usable node.*the ranks need 2"):
        ranks.slurm_step_argv("/py", three, CMD, env, relaunch=2, avoid=("gpu-a17", "gpu-a18"), min_nodes=2)
    with pytest.raises(ranks.RankLaunchError, match="2 usable node.*the ranks need 3"):
        ranks.slurm_step_argv("/py", three, CMD, env, relaunch=1, avoid=("gpu-a18",))


def test_slurm_step_refuses_an_allocation_it_cannot_read(monkeypatch):
    import subprocess

    monkeypatch.setattr(ranks.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", "boom"))
    with pytest.raises(ranks.RankLaunchError, match="scontrol show hostnames"):
        ranks.slurm_step_argv("/py", ranks.RankLayout(2, 1, 60), CMD,
                              {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a[1-2]"})


def test_torchrun_parses_the_composed_command():
    """The composed argv is what the installed torchrun (torch 2.13) accepts, the user's argv intact."""
    from torch.distributed.run import get_args_parser

    argv = ranks.torchrun_argv(sys.executable, ranks.RankLayout(1, 2, 90), CMD)
    args = get_args_parser().parse_args(argv[3:])
    assert (args.nproc_per_node, args.standalone, args.no_python, args.shutdown_timeout) == ("2", True, True, 90)
    assert [args.training_script, *args.training_script_args] == list(CMD)


def _fake_tool(bin_dir: Path, name: str, stdout: str, log: Path) -> None:
    """A stand-in for a Slurm command on PATH that records its argv (unit tests only)."""
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\necho \"{name} $*\" >> {log}\ncat <<'OUT'\n{stdout}\nOUT\n")
    tool.chmod(0o755)


def test_wrapper_stops_of_its_own_go_to_the_job_steps_never_to_srun(tmp_path, monkeypatch):
    """Under Slurm the ranks run in a job step: the warning (and a spot notice) reach them as
    ``scancel --signal=<SIG> <job>`` (every step, every node); a SIGTERM sent to srun would SIGKILL the step."""
    import signal
    import subprocess

    from orchestrator.jobside import supervisor

    log = tmp_path / "calls.log"
    _fake_tool(tmp_path / "bin", "scancel", "", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    child = subprocess.Popen(["sleep", "30"])
    try:
        sup = supervisor.Supervisor(child, "USR2", under_slurm=True, step_job="4242")
        sup.on_signal(signal.SIGUSR2, None)  # the scheduler's warning to the batch process
        notice = supervisor.Supervisor(child, "TERM", under_slurm=True, step_job="4242")
        notice.on_notice("aws: terminate")  # a cloud's spot notice
        sup.reap_signallers()
        notice.reap_signallers()
        assert child.poll() is None  # srun itself got nothing
        # Each signaller runs on its own (never blocking the wrapper): the two calls land in either order.
        assert sorted(log.read_text().splitlines()) == ["scancel --signal=TERM 4242", "scancel --signal=USR2 4242"]
        assert (sup.stop_signal, sup.stop_source, notice.stop_source) == ("USR2", "warning", "spot_notice")
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("preempt_time,expected", [("2026-12-01T17:53:32", True), ("None", False)])
def test_preemption_is_read_from_scontrol(tmp_path, monkeypatch, preempt_time, expected):
    from orchestrator.jobside import supervisor

    log = tmp_path / "calls.log"
    line = (f"JobId=318 JobState=RUNNING Requeue=1 Restarts=0 PreemptEligibleTime=2026-12-01T17:53:28 "
            f"PreemptTime={preempt_time} SuspendTime=None NodeList=vm")
    _fake_tool(tmp_path / "bin", "scontrol", line, log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert supervisor.being_preempted("318") is expected
    assert log.read_text().splitlines() == ["scontrol show job -o 318"]


def test_without_nproc_the_command_runs_as_given_even_a_users_own_torchrun(monkeypatch):
    from orchestrator.jobside import wrapper

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)

    own = ["torchrun", "--standalone", "--nproc-per-node", "2", "train.py"]
    a = wrapper._parse(["--run-dir", "/r", "--job", "j", "--attempt", "1", "--token", "t", "--", *own])
    assert wrapper._program(a, "L1") == (own, None, None)
    a = wrapper._parse(["--run-dir", "/r", "--job", "j", "--attempt", "1", "--token", "t", "--nproc-per-node", "2",
                        "--grace", "90", "--", "python", "train.py"])
    argv, world, step_job = wrapper._program(a, "L1")
    assert world == 2 and step_job is None and argv[-3:] == ["--", "python", "train.py"]
    # each rank's program under the parent that records its own end (orchestrator/jobside/rankend.py)
    rec = argv[argv.index("--no-python") + 2:]
    assert rec[1:7] == ["-m", "orchestrator.jobside.rankend", "--dir", "/r/attempts/1/torchrun", "--launch", "L1"], rec
    assert argv[argv.index("--shutdown-timeout") + 1] == "90"


def test_wrapper_refuses_several_nodes_outside_slurm(monkeypatch):
    from orchestrator.jobside import wrapper

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    a = wrapper._parse(["--run-dir", "/r", "--job", "j", "--attempt", "1", "--token", "t", "--nproc-per-node", "2",
                        "--nodes", "2", "--", "python", "train.py"])
    with pytest.raises(ranks.RankLaunchError, match="needs a Slurm allocation"):
        wrapper._program(a, "L1")  # torchrun --standalone would wait for a second node for ever
