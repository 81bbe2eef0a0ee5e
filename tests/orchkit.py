"""THE shared test kit: helpers every test folder uses, each defined once here (before, ``wait_for``
x3, ``make_checkpoint`` x3 and the ``orch`` runner x3 lived in separate kit modules). A plain module
with a unique name (pytest puts tests/ on sys.path for the root conftest); ``from conftest import ...``
is not reliable because each folder's conftest is imported under that same module name. Folder kits
(advkit, intkit, localkit, ...) hold only what their own folder needs."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from orchzygote import run_orch

from orchestrator import protocol

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

# THE one reading of CI=true for every test kit (two kits compared it exactly, two lower-cased it).
IN_CI = os.environ.get("CI", "").strip().lower() == "true"
RECONCILE_EVERY_S = 1.5  # the wait loops' pace of reconcile passes (Orch.reconcile_paced says why)


def unavailable(msg: str) -> None:
    """A facility a test needs is missing: a failure under CI (a skip there would hide the test), a skip
    elsewhere."""
    if IN_CI:
        pytest.fail(msg)
    pytest.skip(msg)


def tree_hash(root: Path) -> str:
    """Hash of every path, file content and symlink target below root (order-independent)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            h.update(f"L {rel} {os.readlink(p)}\n".encode())
        elif p.is_file():
            h.update(f"F {rel} {hashlib.sha256(p.read_bytes()).hexdigest()}\n".encode())
        else:
            h.update(f"D {rel}\n".encode())
    return h.hexdigest()


def make_checkpoint(run_dir: Path, step: int, files: dict[str, bytes] | None = None,
                    final_name: str | None = None, manifest: bool = True) -> Path:
    """Commit a checkpoint the documented way: files + manifest in a tmp dir, renamed into place
    (default files: a model and an optimizer file, the model's last byte the step)."""
    if files is None:
        files = {"model.pt": b"w" * 100 + bytes([step % 256]), "opt.pt": b"o" * 50}
    root = run_dir / protocol.CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    name = final_name or protocol.checkpoint_name(step)
    tmp = root / protocol.tmp_name(name)
    tmp.mkdir()
    listing = {rel: protocol.write_file_synced(tmp / rel, [data]) for rel, data in files.items()}
    if manifest:
        protocol.atomic_write_json(tmp / protocol.MANIFEST, {"step": step, "files": listing})
    os.rename(tmp, root / name)
    protocol.fsync_dir(root)
    return root / name


def use_backend(monkeypatch, backend) -> None:
    """Make every orch service that looks a backend up by name get ``backend`` (a fake at the
    scheduler boundary, for in-process tests)."""
    import orchestrator.ops.cancel
    import orchestrator.ops.launch
    import orchestrator.ops.launchrecord
    import orchestrator.ops.liveness
    import orchestrator.ops.quicksubmit
    import orchestrator.ops.requeue
    import orchestrator.ops.submit

    for mod in (orchestrator.ops.launch, orchestrator.ops.launchrecord, orchestrator.ops.liveness,
                orchestrator.ops.requeue, orchestrator.ops.cancel, orchestrator.ops.submit,
                orchestrator.ops.quicksubmit):
        monkeypatch.setattr(mod, "get_backend", lambda _name: backend)


def wait_for(cond: Callable[[], object], timeout: float = 60, what: str = "condition",
             interval: float = 0.05, detail: Callable[[], object] | None = None) -> object:
    """Poll an observable condition until it is truthy (its value is returned) or ``timeout`` seconds
    pass on a monotonic clock (then fail naming ``what``, and ``detail()``'s state of things when given):
    the one way tests synchronise, never a fixed sleep. ``cond`` may act first (a reconcile pass), as a
    user's watch loop does."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 + (f"; {detail()}" if detail is not None else ""))
        time.sleep(interval)


def wait_for_file(path: Path, timeout: float = 30) -> None:
    wait_for(path.exists, timeout, f"{path} to appear")


@contextmanager
def orch_env(env: dict[str, str]) -> Iterator[None]:
    """This process's ORCH_*/SLURM_* environment replaced by ``env``'s for the block (in-process CLI)."""
    old = {k: v for k, v in os.environ.items() if k.startswith(("ORCH_", "SLURM_"))}
    for k in old:
        del os.environ[k]
    os.environ.update({k: v for k, v in env.items() if k.startswith(("ORCH_", "SLURM_"))})
    try:
        yield
    finally:
        for k in [k for k in os.environ if k.startswith(("ORCH_", "SLURM_"))]:
            del os.environ[k]
        os.environ.update(old)


@dataclass
class Orch:
    """``orch`` as a user runs it, with this test's private ORCH_HOME: ``orch(*args)`` runs the real entry
    point in a process of its own (exit codes, tracebacks, output are the claim), forked from a server that
    imported orch already (tests/orchzygote.py: a new interpreter's imports were ~0.5 CPU-s of each run);
    ``orch.cli(*args)`` runs the same click command in-process (CliRunner) for pure argument/usage checks."""

    home: Path
    env: dict
    _reconciled_at: float = field(default=float("-inf"), repr=False)
    reconcile_runs: int = field(default=0, repr=False)  # `orch reconcile` runs through this Orch, ended or not

    @property
    def runs(self) -> Path:
        return self.home / "runs"

    def reconcile_paced(self) -> None:
        """``orch reconcile``, at most once per RECONCILE_EVERY_S: what a test's wait loop runs between its looks.

        Why paced: each pass is a Python process that imports SQLAlchemy (~0.6 CPU-s). Run back to back by the
        wait loops, reconcile and ``show --json`` took over a third of CI's two cores (sampled during a full run),
        and starved the jobs the tests waited on. A user's cron runs it once a minute."""
        if time.monotonic() - self._reconciled_at >= RECONCILE_EVERY_S:
            self("reconcile", check=True)
            self._reconciled_at = time.monotonic()

    def polled_state(self, name: str) -> str:
        """The job's state for a wait loop: read from its SQLite table, read-only, in this process (no CLI run per
        look); from ``orch show`` where that cannot answer (PostgreSQL, no DB yet, a sweep's name)."""
        if "ORCH_DB_URL" not in self.env and (self.home / "orch.db").is_file():
            try:
                with closing(sqlite3.connect(f"file:{self.home / 'orch.db'}?mode=ro", uri=True, timeout=10)) as db:
                    row = db.execute("SELECT state FROM jobs WHERE name = ?", (name,)).fetchone()
            except sqlite3.Error:
                row = None
            if row:
                return row[0]
        return self.state(name)

    def __call__(self, *args: str, timeout: float = 120, env: dict | None = None,
                 check: bool = False) -> subprocess.CompletedProcess:
        self.reconcile_runs += bool(args) and args[0] == "reconcile"
        # the real entry point, forked from a process that imported orch already (orchzygote says why and when not)
        p = run_orch(PY, list(map(str, args)), {**self.env, **(env or {})}, str(ROOT), timeout, _standard_env())
        if check and p.returncode != 0:
            raise AssertionError(f"orch {' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        return p

    def cli(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        """``orch ARGS`` in-process, returned like a subprocess result; an exception that escaped the
        command (a traceback in a real run) fails the test."""
        from click.testing import CliRunner

        from orchestrator.cli import main

        with orch_env({**self.env, **(env or {})}):
            res = CliRunner().invoke(main, list(map(str, args)), prog_name="orch")
        assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
        return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr)

    def json(self, *args: str, **kw) -> object:
        p = self(*args, "--json", check=True, **kw)
        return json.loads(p.stdout)

    def show(self, name: str) -> dict:
        return self.json("show", name)

    def state(self, name: str) -> str:
        return self.show(name)["state"]

    def wait(self, name: str, states: set[str], timeout: float = 120, reconcile: bool = True) -> str:
        """Reconcile (paced) until the job reaches one of `states`; fail with its history otherwise."""

        def reached() -> str | None:
            if reconcile:
                self.reconcile_paced()
            st = self.polled_state(name)
            return st if st in states else None

        return wait_for(reached, timeout, f"{name} to reach one of {sorted(states)}", interval=0.5,
                        detail=lambda: self.show(name))

    def write_config(self, text: str) -> None:
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.home / "orch.toml").write_text(text)


def _standard_env() -> dict:
    """The environment ``orch_for`` gives every Orch, without its own settings: what the fork server starts with."""
    if not _STANDARD:
        _STANDARD.update({k: v for k, v in orch_for(ROOT).env.items() if k != "ORCH_HOME"})
    return _STANDARD


_STANDARD: dict = {}


def orch_for(home: Path, db_url: str | None = None) -> Orch:
    """An Orch on ``home``: this process's environment minus ORCH_*/SLURM_*, plus ORCH_HOME (and
    ORCH_DB_URL for a PostgreSQL variant)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "SLURM_"))}
    env.update(ORCH_HOME=str(home), PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    if db_url:
        env["ORCH_DB_URL"] = db_url
    return Orch(home=home, env=env)


def pending_job(db, cfg, name: str, max_attempts: int = 3) -> None:
    """A job whose attempt 1 was written but not yet launched (as submit leaves it just before launching)."""
    from orchestrator.core.lifecycle import JobState, create_attempt, create_job
    from orchestrator.core.tokens import new_token

    run_dir = cfg.runs_root / name
    run_dir.mkdir(parents=True, exist_ok=True)
    with db.write() as s:
        job = create_job(s, JobState.PENDING, name=name, backend="local", run_dir=str(run_dir), command=["true"],
                         resources={}, outputs=["out.txt"], max_attempts=max_attempts)
        create_attempt(s, job, 1, new_token())


def fake_scheduler(name: str = "local"):  # a Backend subclass instance (imported lazily)
    """The one fake for in-process tests, at the scheduler boundary only: every attempt is RUNNING until
    ``ended[job] = exit code`` says it exited with that code; ``cancelled`` records each cancel call's job
    names; ``cancel_error`` (a BackendError) makes cancel fail as an unreachable scheduler would."""
    from orchestrator.backends.base import AttemptRef, Backend, Outcome, Phase, SubmitSpec

    class FakeScheduler(Backend):
        def __init__(self) -> None:
            self.name = name
            self.tokens: dict[str, str] = {}
            self.ended: dict[str, int] = {}
            self.cancelled: list[list[str]] = []
            self.cancel_error: Exception | None = None

        def submit(self, spec: SubmitSpec) -> str:
            self.tokens[spec.job] = spec.token
            return f"fake-{spec.token}"

        def poll(self, refs: list[AttemptRef]) -> dict[str, Outcome]:
            return {r.token: Outcome(Phase.EXITED, exit_code=self.ended[r.run_dir.name])
                    if r.run_dir.name in self.ended else Outcome(Phase.RUNNING) for r in refs}

        def cancel(self, refs: list[AttemptRef]) -> None:
            self.cancelled.append(sorted(r.run_dir.name for r in refs))
            if self.cancel_error is not None:
                raise self.cancel_error

        def find_by_token(self, refs: list[AttemptRef]) -> dict[str, str]:
            return {}

    return FakeScheduler()


def at_site(monkeypatch, site: str, action) -> None:
    """Run ``action()`` when this process reaches testhooks site ``site`` (in-process: the race made to happen
    at that exact point of orch's code)."""
    from orchestrator import testhooks

    real = testhooks.site

    def hook(name: str) -> None:
        if name == site:
            action()
        real(name)

    monkeypatch.setattr(testhooks, "site", hook)


def assert_launch_times(job, since, until) -> None:  # a models.Job, datetimes as stored
    """A launched job's stored times are plausible and in order: each within [``since``, ``until``], the window of
    the calls that wrote them (a quick path storing the year 2001 compared equal where times were only checked for
    being set), and job created <= attempt created <= claimed <= submitted <= job updated."""
    for a in job.attempts:
        chain = [("job created_at", job.created_at), ("attempt created_at", a.created_at),
                 ("claimed_at", a.claimed_at), ("submitted_at", a.submitted_at), ("job updated_at", job.updated_at)]
        for what, t in chain:
            assert t is not None and since <= t <= until, f"{job.name}: {what} {t} outside [{since}, {until}]"
        for (w1, t1), (w2, t2) in zip(chain, chain[1:], strict=False):
            assert t1 <= t2, f"{job.name}: {w1} {t1} after {w2} {t2}"
