"""Backends declare what they can do (``Backend.capabilities``) and core code asks that, never a backend's name
(submit, sweep and reconcile compared names, so a third backend would silently have taken the Slurm or
the local path)."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator.backends import BACKENDS, get_backend
from orchestrator.backends.base import AttemptRef, Backend, Capabilities, Outcome, Phase, SubmitSpec
from orchestrator.core.lifecycle import utcnow
from orchestrator.core.models import Attempt, Job, Sweep
from orchestrator.ops import liveness
from orchestrator.ops.reconcile import reconcile_pass
from orchestrator.ops.sweep import SweepRequest, submit_sweep

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "orchestrator"


# --- no core module compares a backend's name -------------------------------------------------------------
def _names_compared(tree: ast.AST, names: Sequence[str]) -> list[int]:
    """Lines where a backend name is compared: ``x == "slurm"``, ``x != "local"``, ``x in ("local", ...)``."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            parts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            if any(isinstance(p, ast.Constant) and p.value in names for p in parts):
                lines.append(node.lineno)
    return lines


def backend_name_comparisons(root: Path) -> dict[str, list[int]]:
    """Core modules (all but the backends themselves) that compare a backend name, with the lines."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        if "backends" in path.relative_to(root).parts or "migrations" in path.parts:
            continue
        if lines := _names_compared(ast.parse(path.read_text()), BACKENDS):
            out[str(path.relative_to(root.parent))] = lines
    return out


def test_no_core_module_compares_a_backend_name() -> None:
    assert backend_name_comparisons(CORE) == {}


def test_the_name_check_sees_each_kind_of_comparison() -> None:
    code = 'a == "slurm"\nb != "local"\nc in ("local", "slurm")\nd == "other"\ne.backend == k\n'
    assert _names_compared(ast.parse(code), BACKENDS) == [1, 2, 3]


# --- what each backend declares -----------------------------------------------------------------------------
def test_each_backend_declares_its_capabilities() -> None:
    local, slurm = get_backend("local").capabilities, get_backend("slurm").capabilities
    # Local: orch keeps a sweep's queue, liveness is this host's process table, no backend-specific options.
    assert local == Capabilities(group_queue=False, host_liveness=True, extras=frozenset())
    # Slurm: a sweep is one array that Slurm queues and throttles; liveness is a squeue round trip; a job may
    # span nodes (one torchrun per node through srun); suspect nodes are kept out with --exclude.
    assert slurm == Capabilities(group_queue=True, host_liveness=False,
                                 extras=frozenset({"partition", "account", "extra_sbatch"}), multi_node=True,
                                 node_exclusion=True)


def test_a_backend_that_declares_nothing_gets_the_conservative_answers() -> None:
    assert Capabilities() == Capabilities(group_queue=False, host_liveness=False, extras=frozenset())
    assert Backend.capabilities == Capabilities()


# --- the capabilities decide what core code does ------------------------------------------------------------
class Fake(Backend):
    """Records what core code asked of it; every submission is accepted."""

    name = "fake"

    def __init__(self, caps: Capabilities) -> None:
        self.capabilities = caps
        self.submits: list[str] = []
        self.groups: list[list[str]] = []
        self.asked: list[Path] = []

    def submit(self, spec: SubmitSpec) -> str:
        self.submits.append(spec.token)
        return f"ext-{len(self.submits)}"

    def submit_group(self, specs: Sequence[SubmitSpec], batch_token: str, throttle: int | None) -> dict[str, str]:
        self.groups.append([s.job for s in specs])
        return {s.token: f"arr_{s.task}" for s in specs}

    def poll(self, refs: Sequence[AttemptRef]) -> dict[str, Outcome]:
        return {r.token: Outcome(Phase.PENDING) for r in refs}

    def cancel(self, refs: Sequence[AttemptRef]) -> None:
        pass

    def find_by_token(self, refs: Sequence[AttemptRef]) -> dict[str, str]:
        return {}

    def live_in_run_dirs(self, run_dirs: Sequence[Path]) -> dict[Path, list[str]]:
        self.asked += run_dirs
        return {d: [] for d in run_dirs}


def test_liveness_asks_a_host_backend_about_every_dir_and_a_scheduler_only_where_attempts_ran(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host, sched = Fake(Capabilities(host_liveness=True)), Fake(Capabilities(host_liveness=False))
    monkeypatch.setattr(liveness, "BACKENDS", ("host", "sched"))
    monkeypatch.setattr(liveness, "get_backend", {"host": host, "sched": sched}.__getitem__)
    fresh, submitted = tmp_path / "fresh", tmp_path / "submitted"
    (submitted / "attempts").mkdir(parents=True)
    assert liveness.live_processes([fresh, submitted]) == {fresh: [], submitted: []}
    assert (host.asked, sched.asked) == ([fresh, submitted], [submitted])


def test_a_requeue_scans_only_backends_whose_liveness_is_this_hosts(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # requeue's check before clearing a run dir reads this host's process table, not a scheduler.
    host, sched = Fake(Capabilities(host_liveness=True)), Fake(Capabilities(host_liveness=False))
    monkeypatch.setattr(liveness, "BACKENDS", ("host", "sched"))
    monkeypatch.setattr(liveness, "get_backend", {"host": host, "sched": sched}.__getitem__)
    assert liveness.host_processes([tmp_path]) == {tmp_path: []}
    assert (host.asked, sched.asked) == ([tmp_path], [])


@pytest.mark.parametrize("group_queue", [True, False])
def test_a_sweep_is_one_group_submission_only_where_the_scheduler_keeps_the_queue(
        db, cfg, monkeypatch: pytest.MonkeyPatch, group_queue: bool) -> None:
    fake = Fake(Capabilities(group_queue=group_queue))
    monkeypatch.setattr("orchestrator.ops.sweep.get_backend", lambda _name: fake)
    submit_sweep(db, cfg, SweepRequest(name="sw", command=["true", "{x}"], params=[{"x": 1}, {"x": 2}, {"x": 3}],
                                       backend="fake", throttle=2))
    if group_queue:  # the scheduler queues all three and keeps the throttle
        assert (fake.groups, fake.submits) == ([["sw.0000", "sw.0001", "sw.0002"]], [])
    else:  # orch keeps the queue: two now, the third when a slot frees
        assert (fake.groups, len(fake.submits)) == ([], 2)


def _pending_sweep_task(db, backend: str) -> None:
    with db.write() as s:
        sweep = Sweep(name="sw", backend=backend, throttle=None, params=[{}])
        s.add(sweep)
        s.flush()
        job = Job(name="sw.1", state="pending", backend=backend, run_dir=str(db.cfg.runs_root / "sw.1"),
                  command=["true"], sweep_id=sweep.id, task_index=0)
        s.add(job)
        s.flush()
        s.add(Attempt(job_id=job.id, n=1, token="tok-sw1", state="pending", backend=backend, created_at=utcnow()))


@pytest.mark.parametrize("group_queue", [True, False])
def test_reconcile_launches_a_fresh_queued_task_only_where_orch_keeps_the_queue(
        db, cfg, monkeypatch: pytest.MonkeyPatch, group_queue: bool) -> None:
    # A group-queue sweep's task this young is its submitter's to launch (the array is on its way).
    monkeypatch.setenv("ORCH_LAUNCH_GRACE_S", "600")
    _pending_sweep_task(db, "fake")
    fake = Fake(Capabilities(group_queue=group_queue))
    reconcile_pass(db, cfg, backend_for=lambda _n: fake)
    assert (fake.groups, fake.submits) == (([], []) if group_queue else ([], ["tok-sw1"]))


def test_a_process_is_found_in_the_run_dir_its_cwd_or_any_open_file_lies_under() -> None:
    """The process scan looks each path's ancestors up among the run dirs (it compared every open
    file with every one of a sweep's 1,000 run dirs); what it finds is what the prefix comparison found."""
    from orchestrator.backends.local import _root_of

    roots = {"/r/a", "/r/ab", "/r/n", "/r/n/inner"}
    assert _root_of(roots, ["/r/ab/attempts/1/stdout"]) == "/r/ab"  # an open file deep under it
    assert _root_of(roots, ["/r/a"]) == "/r/a"  # its cwd, the run dir itself
    assert _root_of(roots, ["/r/abc/x", "/tmp/y", "/r"]) is None  # a name that only starts the same is another dir
    assert _root_of(roots, ["/elsewhere", "/r/a/x"]) == "/r/a"  # the first path that lies in one decides
    assert _root_of(roots, ["/r/n/inner/f"]) == "/r/n"  # nested: the first root in sorted order, as before
    assert _root_of({"/"}, ["/any/thing"]) == "/"
