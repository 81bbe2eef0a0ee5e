"""submitit's Executor/Job API over orch's job table: the controller side of orch's submitit interop.

Runs where ``orch submit`` runs (a login node), through the same services as the CLI (``submit``, ``cancel``,
``reconcile_pass``, ``show_job``); the job side is ``orchestrator.integrations.submitit_runner``. Submitting
(the lines marked ``# orch`` are what changes in submitit code)::

    from orchestrator.integrations.submitit import OrchExecutor          # orch (= orchestrator.ops.executor)
    executor = OrchExecutor(backend="slurm")                             # orch (was: submitit.AutoExecutor(folder=...))
    executor.update_parameters(timeout_min=240, mem_gb=16, gpus_per_node=1, slurm_partition="spot")
    job = executor.submit(Trainer(), "data/")    # an orch job; job.job_id is its orch name
    out = job.result()                           # waits (reconcile passes), then reads result/ under a verified marker

Inside the callable (optional, one line; a no-op outside orch, so the code still runs under submitit)::

    from orchestrator.integrations.submitit import safe_point
    for step in range(self.step + 1, max_steps + 1):
        ...                                      # one optimizer step
        self.step = step
        safe_point(step, loss=loss.item())        # orch: the state is consistent here

What the job runs: ``python -m orchestrator.integrations.submitit_runner run --submission ... --sha256 ...``. It loads
the ``submitit.helpers.DelayedSubmission`` (submitit's own cloudpickle format) — the newest *verified*
checkpoint if there is one, else the original, whose sha256 the command names — and calls it:

* **normal return**: the return value is pickled to ``result/result.pkl``; ``done.json`` lists it (orch's one
  completion predicate). ``job.result()`` reads it only under a verifying marker, checking its sha256 again.
* **SIGTERM / SIGUSR2** only set a flag. At the next :func:`safe_point` the callable's
  ``checkpoint(*args, **kwargs)`` (submitit's ``Checkpointable`` contract) is called; the ``DelayedSubmission`` it
  returns is committed as ``checkpoints/step-<step>/submission.pkl`` (fsynced, hashed, ``manifest.json`` last,
  renamed into place), ``failure.json`` says ``preempted`` and the process exits 143. ``orch reconcile`` requeues
  it; the next attempt resumes from that pickle: 0 steps redone, bit for bit (tests/integrations/test_submitit.py).
* **fallback, submitit's own semantics**: while the callable has not reached a ``safe_point()`` in this attempt
  (code written for plain submitit never does), a stop signal calls ``checkpoint()`` *inside the signal handler*,
  wherever the main thread was, and commits what it returns. Measured: the state it pickles can be torn (an
  optimizer update applied, the step counter not yet advanced: the resumed run applies that update twice and
  its final weights differ from an uninterrupted run's). ``failure.json``'s detail says which path was taken.
* **an exception** in the callable: ``failure.json`` class ``crash`` with the exception and the traceback's tail
  (``orch show``), exit 1; it waits in ``retryable_failed`` for ``orch requeue``.
* a callable without ``checkpoint()`` stops as ``preempted`` without a checkpoint and restarts from the last one
  (or from the start), as under submitit.
* **periodically** (``orch_checkpoint_every_s``, default 600 s; 0 turns it off) the first ``safe_point()`` that long
  after the last commit commits ``checkpoint()`` and carries on: a kill -9 (class ``killed``, requeued by ``orch
  reconcile`` after a back-off) resumes from there instead of from the start.
* ``job.result()`` keeps waiting while the job is ``retryable_failed`` and the reconciler will requeue it
  (``auto_requeue``: preempted, timeout, killed, oom, ...); it raises only once the job is settled for good.

What differs from submitit: the run dir is orch's (``$ORCH_HOME/runs/<name>``: logs in ``attempts/<n>/``,
pickles in ``submitit/`` and ``checkpoints/``); ``folder`` is accepted and ignored. orch requeues (policy: a
preemption or time limit is requeued by ``orch reconcile`` and not counted), never ``scontrol requeue`` from the
job; ``job.state`` is orch's job state, not sacct's. ``submitit.JobEnvironment()`` works inside the callable.
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import re
import secrets
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from orchestrator import protocol
from orchestrator.core.settings import setting
from orchestrator.integrations.submitit_runner import DEFAULT_CHECKPOINT_EVERY_S, RESULT_FILE, SUBMISSION_DIR

__all__ = ["OrchExecutor", "OrchJob"]


# =========================================================================================
# submitting side: OrchExecutor and OrchJob (submitit's Executor / Job API over orch's job table)
# =========================================================================================
_GENERIC = ("name", "timeout_min", "mem_gb", "cpus_per_task", "gpus_per_node", "nodes", "tasks_per_node",
            "stderr_to_stdout")
_SLURM_SBATCH = {"slurm_qos": "qos", "slurm_constraint": "constraint", "slurm_exclude": "exclude",
                 "slurm_gres": "gres", "slurm_wckey": "wckey", "slurm_mem_per_gpu": "mem-per-gpu",
                 "slurm_mem_per_cpu": "mem-per-cpu", "slurm_cpus_per_gpu": "cpus-per-gpu"}
_SLURM = ("slurm_partition", "slurm_account", "slurm_additional_parameters", *_SLURM_SBATCH)
_ORCH = ("orch_name", "orch_max_attempts", "orch_keep_last_k", "orch_checkpoint_every_s")
_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def _number(key: str, value: Any, *, integer: bool, minimum: float) -> float:
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < minimum:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{key}={value!r}: must be {kind} >= {minimum:g}")
    return value


class OrchExecutor:
    """submitit's ``Executor`` API; each ``submit`` creates one orch job. Call from the submitting host.

    ``backend``: ``"local"`` (this machine) or ``"slurm"``; ``cluster=`` (submitit's name) is accepted too,
    ``"debug"`` meaning local. ``folder`` is accepted for compatibility and not used: the run dir
    (``$ORCH_HOME/runs/<name>``) holds the pickles and every attempt's logs. ``home``: an ``ORCH_HOME`` other
    than the environment's. ``reconcile``: ``job.done()``/``wait()``/``result()`` run reconcile passes (as
    ``orch submit --wait`` does) — set False where a cron reconciler drives the jobs.
    """

    def __init__(self, folder: str | os.PathLike[str] | None = None, backend: str | None = None, *,
                 cluster: str | None = None, home: str | os.PathLike[str] | None = None, reconcile: bool = True,
                 poll_s: float = 1.0) -> None:
        chosen = backend or {"debug": "local"}.get(cluster or "", cluster) or "local"
        from orchestrator.backends import BACKENDS

        if chosen not in BACKENDS:
            raise ValueError(f"backend {chosen!r}: orch runs jobs on 'local' or 'slurm'")
        self.backend = chosen
        self.folder = folder
        self.home = Path(home) if home is not None else None
        self.reconcile = reconcile
        self.poll_s = poll_s
        self.parameters: dict[str, Any] = {}
        self._ctx_cache: tuple[Any, Any] | None = None

    # --- parameters (argument-only checks: before any row, directory or file exists) ---------------
    def update_parameters(self, **kwargs: Any) -> None:
        """submitit's generic names (``timeout_min``, ``mem_gb``, ``cpus_per_task``, ``gpus_per_node``, ``name``),
        ``slurm_partition``/``slurm_account``/``slurm_qos``/... and ``slurm_additional_parameters``; orch's own:
        ``orch_name`` (the exact job name; default ``<name>-<time>-<hex>``), ``orch_max_attempts``,
        ``orch_keep_last_k``, ``orch_checkpoint_every_s`` (periodic ``checkpoint()`` at a ``safe_point()``, default
        600; 0: only on a stop signal). Anything else raises ValueError naming it, as submitit does.
        """
        unknown = sorted(k for k in kwargs if k not in (*_GENERIC, *_SLURM, *_ORCH))
        if unknown:
            raise ValueError(f"parameter(s) {', '.join(unknown)} not supported by OrchExecutor; supported: "
                             f"{', '.join((*_GENERIC, *_SLURM, *_ORCH))}")
        merged = {**self.parameters, **kwargs}
        self._resources(merged)  # raises on a bad value now, not at submit
        self.parameters = merged

    def _resources(self, p: dict[str, Any]) -> dict[str, Any]:
        from orchestrator.core.resources import EXTRAS_KEY, MAX_MEM_MB, MAX_TIME_S

        res: dict[str, Any] = {}
        if p.get("timeout_min") is not None:
            res["time_s"] = max(1, round(_number("timeout_min", p["timeout_min"], integer=False, minimum=1 / 60) * 60))
            if res["time_s"] > MAX_TIME_S:
                raise ValueError(f"timeout_min={p['timeout_min']!r} is longer than Slurm can express")
        if p.get("mem_gb") is not None:
            res["mem_mb"] = max(1, round(_number("mem_gb", p["mem_gb"], integer=False, minimum=0.001) * 1024))
            if res["mem_mb"] > MAX_MEM_MB:
                raise ValueError(f"mem_gb={p['mem_gb']!r} is more than {MAX_MEM_MB} MB")
        if p.get("cpus_per_task") is not None:
            res["cpus_per_task"] = int(_number("cpus_per_task", p["cpus_per_task"], integer=True, minimum=1))
        if p.get("gpus_per_node") is not None:
            res["gpus"] = int(_number("gpus_per_node", p["gpus_per_node"], integer=True, minimum=0))
        for key in ("nodes", "tasks_per_node"):
            if p.get(key) not in (None, 1):
                # orch runs one program per job (rank 0 writes); several tasks would each run the callable.
                raise ValueError(f"{key}={p[key]!r}: OrchExecutor runs one task on one node")
        if p.get("name") is not None and (not isinstance(p["name"], str) or not p["name"].strip()):
            raise ValueError(f"name={p['name']!r}: must be a non-empty string")
        if p.get("orch_name") is not None:
            protocol.validate_job_name(p["orch_name"])  # UnsafePath (a ValueError) names the rule
        if p.get("orch_max_attempts") is not None:
            # One schema with orch.toml and --max-attempts: only a minimum was checked here (10**12 passed).
            problem = setting("policy.max_attempts").problem(p["orch_max_attempts"])
            if problem is not None:
                raise ValueError(f"orch_max_attempts={p['orch_max_attempts']!r}: {problem}")
        if p.get("orch_keep_last_k") is not None:
            _number("orch_keep_last_k", p["orch_keep_last_k"], integer=True, minimum=1)
        if p.get("orch_checkpoint_every_s") is not None:
            if _number("orch_checkpoint_every_s", p["orch_checkpoint_every_s"], integer=False, minimum=0) > 10**9:
                raise ValueError(f"orch_checkpoint_every_s={p['orch_checkpoint_every_s']!r}: at most 1e9 seconds")
        # slurm_* parameters reach a backend that takes the option they set (Slurm's extras) and are ignored by
        # any other, as submitit's AutoExecutor ignores another cluster's: the same script runs locally for debugging.
        from orchestrator.backends import get_backend

        takes = get_backend(self.backend).capabilities.extras
        extras: dict[str, Any] = {}
        for key, extra_key in (("slurm_partition", "partition"), ("slurm_account", "account")):
            if p.get(key) is not None and extra_key in takes:
                extras[extra_key] = p[key]
        if "extra_sbatch" in takes:
            extra = [f"--{opt}={p[k]}" for k, opt in _SLURM_SBATCH.items() if p.get(k) is not None]
            adds = p.get("slurm_additional_parameters") or {}
            if not isinstance(adds, dict):
                raise ValueError("slurm_additional_parameters must be a dict, e.g. {'qos': 'high'}")
            # submitit's spelling: underscores become dashes, True is a bare flag
            extra += [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in adds.items()]
            if extra:
                extras["extra_sbatch"] = extra
        if extras:
            res[EXTRAS_KEY] = extras
        self._check_sbatch(res)
        return res

    def _check_sbatch(self, res: dict[str, Any]) -> None:
        """The backend's own check of every value it would pass on (no I/O), run now rather than at launch."""
        from orchestrator.backends import get_backend
        from orchestrator.backends.base import BackendError
        from orchestrator.core.resources import resources_of

        try:
            get_backend(self.backend).check_resources(resources_of(res))
        except BackendError as e:  # a partition with a newline, an sbatch option orch owns...
            raise ValueError(str(e)) from None

    # --- the job table ---------------------------------------------------------------------------
    def _ctx(self) -> tuple[Any, Any]:
        if self._ctx_cache is None:
            from orchestrator.core.config import load_config
            from orchestrator.core.db import Database

            cfg = load_config(self.home)
            self._ctx_cache = (cfg, Database(cfg))
        return self._ctx_cache

    def _job_name(self) -> str:
        if self.parameters.get("orch_name"):
            return str(self.parameters["orch_name"])
        base = _NAME_CHARS.sub("-", str(self.parameters.get("name") or "submitit"))[:60].strip(".-") or "submitit"
        return f"{base}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"

    def _checkpoint_every_s(self) -> float:
        """``orch_checkpoint_every_s`` (0: only on a stop signal), default 600: the runner then commits
        ``checkpoint()`` at the first ``safe_point()`` that long after the last commit."""
        v = self.parameters.get("orch_checkpoint_every_s")
        return DEFAULT_CHECKPOINT_EVERY_S if v is None else float(v)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> OrchJob:
        """Pickle ``fn(*args, **kwargs)`` as submitit does and create the orch job that runs it.

        Refused (``orch.errors.Refused``, what ``orch submit`` exits 3 for) when the name exists or its run dir
        holds a verified marker; nothing is written then. An unpicklable callable raises before anything exists.
        """
        import cloudpickle
        from sqlalchemy import select
        from submitit.helpers import DelayedSubmission

        from orchestrator.core.models import Job
        from orchestrator.core.rundir import check_run_dir, ensure_runs_root, make_dir_nofollow, run_dir_for
        from orchestrator.errors import AlreadyVerified, Refused
        from orchestrator.ops.submit import SubmitRequest, submit

        resources = self._resources(self.parameters)
        delayed = DelayedSubmission(fn, *args, **kwargs)
        # submitit records timeout_min on the submission (its has_timed_out reads it); orch's requeue policy
        # replaces its countdown of timeouts.
        delayed.set_timeout(round(self.parameters.get("timeout_min") or 0), 0)
        data = cloudpickle.dumps(delayed, pickle.HIGHEST_PROTOCOL)
        name = self._job_name()
        cfg, db = self._ctx()
        run_dir = run_dir_for(cfg, name)
        ensure_runs_root(cfg)
        check_run_dir(cfg, run_dir)
        # submit() checks both again; checked first here so that the pickle never lands in the run dir of a
        # job that exists or is finished (seed 000: only the marker decides "finished").
        if protocol.verify_done_marker(run_dir).verified:
            raise AlreadyVerified(f"refused: {run_dir} holds a verified done marker; job {name!r} is finished")
        with db.read() as s:
            if s.scalar(select(Job.id).where(Job.name == name)) is not None:
                raise Refused(f"refused: job {name!r} already exists; use `orch requeue {name}`")
        digest = hashlib.sha256(data).hexdigest()
        rel = f"{SUBMISSION_DIR}/submission-{digest[:12]}-{secrets.token_hex(4)}.pkl"
        make_dir_nofollow(cfg.runs_root, Path(name) / SUBMISSION_DIR)
        protocol.atomic_write(run_dir / rel, data)
        command = [sys.executable, "-m", "orchestrator.integrations.submitit_runner", "run", "--submission", rel,
                   "--sha256", digest, "--keep-last-k", str(self.parameters.get("orch_keep_last_k") or 2),
                   "--checkpoint-every-s", str(float(self._checkpoint_every_s()))]
        for p in _import_paths():
            command += ["--sys-path", p]
        req = SubmitRequest(name=name, command=command, backend=self.backend, resources=resources,
                            max_attempts=int(self.parameters.get("orch_max_attempts") or cfg.max_attempts))
        try:
            submit(db, cfg, req)
        except BaseException:
            with db.read() as s:
                cmd = s.scalar(select(Job.command).where(Job.name == name))
            if not cmd or rel not in cmd:  # refused before its row existed: the pickle is nobody's
                (run_dir / rel).unlink(missing_ok=True)
            raise
        return OrchJob(name, self)

    def map_array(self, fn: Callable[..., Any], *iterables: Iterable[Any]) -> list[OrchJob]:
        """One orch job per item (not a Slurm array: each job is requeued and verified on its own)."""
        if self.parameters.get("orch_name"):
            raise ValueError("map_array with orch_name: the jobs need distinct names; set name= instead")
        return [self.submit(fn, *args) for args in zip(*iterables, strict=True)]

    def job(self, name: str) -> OrchJob:
        """A handle on an existing job (e.g. from another process: jobs outlive their submitter)."""
        return OrchJob(name, self)


def _import_paths() -> list[str]:
    """The submitter's import paths outside the Python installation (its script dir, cwd, PYTHONPATH).

    cloudpickle pickles a callable from an importable module by reference; the job runs in the run dir,
    not in the submitter's working directory (submitit's sbatch runs there), so it gets these paths too.
    """
    prefixes = {os.path.abspath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out: list[str] = []
    for entry in sys.path:
        p = os.path.abspath(entry or os.getcwd())
        inside = any(p == pre or p.startswith(pre + os.sep) for pre in prefixes)
        if os.path.isdir(p) and not inside and p not in out and p.isprintable():
            out.append(p)
    return out


class OrchJob:
    """submitit's ``Job`` API over one orch job. ``job_id`` is the orch job name (stable across attempts)."""

    def __init__(self, name: str, executor: OrchExecutor | None = None) -> None:
        self.job_id = name
        self.executor = executor or OrchExecutor()
        self.num_tasks = 1

    def __repr__(self) -> str:
        return f"OrchJob<{self.job_id}>"

    def _show(self) -> dict[str, Any]:
        from orchestrator.views.show import show_job

        return show_job(self.executor._ctx()[1], self.job_id)

    @property
    def run_dir(self) -> Path:
        """The job's run dir."""
        return Path(self._show()["run_dir"])

    @property
    def state(self) -> str:
        """orch's job state (``running``, ``done_marker_verified``, ...), read from the job table (no pass)."""
        return self._show()["state"]

    def done(self, force_check: bool = False) -> bool:
        """Settled: verified, failed, cancelled, or waiting in ``retryable_failed`` for ``orch requeue``.

        Runs one reconcile pass first (when the executor reconciles): it is what moves the job table, and
        what requeues a preempted attempt. ``force_check`` is accepted for submitit's signature.
        """
        from orchestrator.core.lifecycle import JOB_SETTLED, JobState

        cfg, db = self.executor._ctx()
        if self.executor.reconcile:
            from orchestrator.ops.reconcile import reconcile_pass

            reconcile_pass(db, cfg)
        d = self._show()
        state = JobState(d["state"])
        return state in JOB_SETTLED and not (state is JobState.RETRYABLE_FAILED and d["auto_requeue"])

    def wait(self, timeout_s: float | None = None) -> None:
        """Until ``done()``, polling every ``poll_s``; ``TimeoutError`` after ``timeout_s`` (default: no bound)."""
        t0 = time.monotonic()
        while not self.done():
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"{self.job_id} not settled after {timeout_s} s (state {self.state})")
            time.sleep(self.executor.poll_s)

    def result(self) -> Any:
        """Wait, then the return value — only from a run dir whose ``done.json`` verifies and lists it
        (sha256 checked on the bytes loaded). Otherwise submitit's ``FailedJobError`` (the callable raised)
        or ``UncompletedJobError``, naming the state and the last attempt's failure."""
        self.wait()
        outcome = self._outcome()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome[0]

    def results(self) -> list[Any]:
        """``[result()]``, as submitit's ``Job.results`` gives one per task."""
        return [self.result()]

    def exception(self) -> Exception | None:
        """Wait, then what ``result()`` would raise, or None where it would return."""
        self.wait()
        outcome = self._outcome()
        return outcome if isinstance(outcome, Exception) else None

    def _outcome(self) -> tuple[Any] | Exception:
        from submitit.core.utils import FailedJobError, UncompletedJobError

        d = self._show()
        run_dir = Path(d["run_dir"])
        v = protocol.verify_done_marker(run_dir)
        rel = f"{protocol.RESULT_DIR}/{RESULT_FILE}"
        if v.verified and v.marker and rel in v.marker["artifacts"]:
            data = (run_dir / rel).read_bytes()
            if hashlib.sha256(data).hexdigest() == v.marker["artifacts"][rel]["sha256"]:
                return (pickle.loads(data),)  # listed in a verified marker, hash-checked
            return UncompletedJobError(f"{self.job_id}: {rel} changed after its marker was written")
        last = d["attempts"][-1] if d["attempts"] else {}
        why = f"job {self.job_id} is {d['state']} ({v}); attempt {last.get('n')}: " \
              f"{last.get('failure_class') or last.get('state')}"
        report = protocol.read_failure_report(run_dir, last["n"]) if last else None
        if last.get("failure_class") == "crash":
            detail = (report.detail if report else "") or last.get("detail") or ""
            return FailedJobError(f"{why}\n{detail}")
        return UncompletedJobError(f"{why}: {last.get('detail') or ''}")

    def cancel(self, check: bool = True) -> None:
        """``orch cancel`` of the job: SIGTERM first, so it checkpoints (``check``: submitit's signature)."""
        from orchestrator.ops.cancel import cancel

        cfg, db = self.executor._ctx()
        cancel(db, cfg, [self.job_id])

    def _log(self, which: str) -> str | None:
        d = self._show()
        if not d["attempts"]:
            return None
        p = protocol.attempt_dir(d["run_dir"], d["attempts"][-1]["n"]) / which
        return p.read_text(errors="replace") if p.is_file() else None

    def stdout(self) -> str | None:
        """The latest attempt's stdout (``attempts/<n>/stdout.log``)."""
        return self._log(protocol.STDOUT_LOG)

    def stderr(self) -> str | None:
        """The latest attempt's stderr (``attempts/<n>/stderr.log``)."""
        return self._log(protocol.STDERR_LOG)
