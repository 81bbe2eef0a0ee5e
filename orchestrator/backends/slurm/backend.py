"""Slurm backend: one batch job per attempt, submitted with a thin ``sbatch`` of our own.

Who calls: the reconciler and ``orch submit`` on the login node / controller host. Import cost is
the standard library only (no submitit, no torch).

Why not submitit's SlurmExecutor (1.5.4) — measured on Slurm 22.05 (deploy/slurm/cluster.sh) and
read from its source (../shared/notes/submitit.md):

* The time-limit warning never reached the program. Measured: ``SlurmExecutor`` with
  ``use_srun=False``, ``timeout_min=1``, ``signal_delay_s=30`` running a ``CommandFunction``: the
  program got no USR2 at all (submitit passes ``--signal=USR2@..`` without ``B:``, which signals job
  steps, and without srun there are none), only the time limit's SIGTERM -> ``TIMEOUT``. With srun
  the signal goes to submitit's own process, whose handler requeues (``scontrol requeue``) or raises
  ``UncompletedJobError`` instead of passing it on; it also ignores SIGTERM.
* It emits no ``--requeue``; under srun (its default) 22.05 does not inherit ``--cpus-per-task``,
  and srun jobs that exited within the grace time were not requeued in place on this cluster.
* It pickles a Python call that needs submitit on the compute node; orch's contract
  (``spec.wrapper_argv()``) is an argv.

So ``submit`` writes a tiny batch script (Python, so the argv never passes through a shell) that
``os.execv``s ``spec.wrapper_argv()``: the wrapper *is* the batch process, ``--signal=B:USR2@<lead>``
reaches it (and is forwarded to the program), no srun is involved, and Slurm's in-place requeue
reruns the same script under the same job id. What we keep from submitit: its list of inherited
variables to drop when submitting from inside a job (``submitit.helpers.clean_env``: SLURM_*,
SLURMD_*, SRUN_*, SBATCH_*, SUBMITIT_*, torch.distributed's rank variables) and its
``--open-mode=append``.

Signals, as measured on 22.05 without srun (deploy/slurm/README.md has the numbers):

* Preemption: the grace-start SIGTERM goes to job *steps* only, so a batch-only job sees nothing
  until the grace ends (+ up to ~10 s); then SIGCONT+SIGTERM reach every process of the job (the
  program directly, and again through the wrapper), SIGKILL after KillWait. A job that exits then
  is requeued in place on a REQUEUE partition (any exit code) and ends ``PREEMPTED`` on a CANCEL
  one. With ``SlurmctldParameters=preempt_send_user_signal`` the USR2 comes at the grace start, but
  a job that exits on it ends ``FAILED`` and is not requeued in place (orch requeues it instead).
* Time limit: USR2 arrives when at most lead + ~30 s are left (slurmctld checks every ~30 s); a
  job still running at the limit gets SIGTERM, then SIGKILL after KillWait (``TIMEOUT``).
* ``cancel`` is a plain ``scancel``: SIGCONT+SIGTERM to every process, SIGKILL after KillWait.
* sacct drops 128 from exit statuses above 128 (exit 143 shows as ``15:0``): ``exit_code`` is
  sacct's; orch's wrapper keeps the real status in ``exit.json``.

Outcomes (``poll``): one ``sacct -X --duplicates`` call for all attempts, the newest record per id
wins, cross-checked with one ``squeue`` call because sacct lags the controller by seconds after an
in-place requeue (rules in ``orchestrator/backends/slurm/states.py``). Memory: a cluster with cgroup
enforcement reports ``OUT_OF_MEMORY``; one with ``JobAcctGatherParams=OverMemoryKill`` reports
``FAILED 0:9`` and slurmstepd writes "exceeded memory limit" into the job's output. This backend
reads the tail of that output (``attempts/<n>/slurm/slurm-<id>.out``) and reports the second form
as ``backend_state="OUT_OF_MEMORY"`` too, with the slurmstepd line as ``reason``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from orchestrator import protocol
from orchestrator.backends.base import (
    AttemptRef,
    Backend,
    BackendError,
    Capabilities,
    Outcome,
    Phase,
    Resources,
    SubmitSpec,
)
from orchestrator.backends.slurm import states as slurm_states
from orchestrator.backends.slurm.output import batch_dir_of, over_memory_line
from orchestrator.backends.slurm.rundirjobs import RunDirJobs
from orchestrator.backends.slurm.sbatch import (
    _CONTROL_RE,
    _PERMANENT_SBATCH,
    _TOKEN_RE,
    ARRAY_OUTPUT_PATTERN,
    ARRAY_TASKS_FILE,
    FIND_HISTORY,
    JOB_NAME_PREFIX,
    OUTPUT_PATTERN,
    QUERY_TIMEOUT_S,
    SCRIPT_NAME,
    SLURM_DIR,
    SUBMIT_TIMEOUT_S,
    WARNING_SIGNAL,
    SlurmSubmitRefused,
    _check_path,
    _check_value,
    _first_line,
    _positive,
    _run,
    array_script,
    batch_script,
    check_env,
    clean_submit_env,
    exclude_options,
    job_name_for,
    own_node_choice,
    pinned_nodelist,
    positive_or_zero,
    resource_options,
    warning_lead_s,
)


class SlurmBackend(RunDirJobs, Backend):
    """Attempts as Slurm batch jobs named ``orch-<token>``; see the module docstring."""

    name = "slurm"
    # A sweep is one array that Slurm queues and throttles (%N); liveness is a squeue round trip.
    capabilities = Capabilities(group_queue=True, host_liveness=False,
                                extras=frozenset({"partition", "account", "extra_sbatch"}), multi_node=True,
                                node_exclusion=True)

    def __init__(self, *, python: str | None = None, query_timeout_s: float | None = None) -> None:
        # The interpreter that runs orch's wrapper on the compute node: the same venv path by
        # default (a shared filesystem), or ORCH_SLURM_PYTHON where the nodes install it elsewhere.
        self.python = python or os.environ.get("ORCH_SLURM_PYTHON") or None
        self.query_timeout_s = QUERY_TIMEOUT_S if query_timeout_s is None else query_timeout_s

    # ------------------------------------------------------------------------------------------
    def sbatch_argv(self, spec: SubmitSpec, script: Path) -> list[str]:
        """The sbatch command line for ``spec`` (every value validated here)."""
        protocol.validate_job_name(spec.job)
        token = _check_value("token", spec.token, _TOKEN_RE)
        _positive("attempt", spec.attempt)
        out_dir = spec.attempt_dir / SLURM_DIR
        r = spec.resources
        argv = [
            "sbatch", "--parsable",
            f"--job-name={job_name_for(token)}",
            f"--comment=orch job={spec.job} attempt={spec.attempt} token={token}",
            f"--output={_check_path('output dir', out_dir)}/{OUTPUT_PATTERN}",
            "--open-mode=append",  # a rerun after an in-place requeue appends instead of truncating
            "--requeue",  # preempted on a REQUEUE partition / node failure -> rerun under the same id
            "--export=ALL",
            f"--chdir={_check_path('run dir', spec.run_dir)}",
            f"--signal=B:{WARNING_SIGNAL}@{warning_lead_s(r.time_s)}",
        ]
        argv += resource_options(r) + exclude_options(spec.exclude_nodes, r)
        argv.append(_check_path("batch script", script))
        return argv

    def check_resources(self, resources: Resources) -> None:
        """Every value that would reach sbatch, validated as ``sbatch_argv`` does (no I/O)."""
        super().check_resources(resources)
        spec = SubmitSpec(job="check", attempt=1, token="check", run_dir=Path("/check"), command=("true",),
                          resources=resources)
        self.sbatch_argv(spec, Path("/check") / SCRIPT_NAME)

    def submit(self, spec: SubmitSpec) -> str:
        """sbatch the attempt; return the Slurm job id. Raises BackendError (nothing submitted is
        guaranteed only for SlurmSubmitRefused; after a timeout use ``find_by_token``)."""
        out_dir = spec.attempt_dir / SLURM_DIR
        script = out_dir / SCRIPT_NAME
        argv = self.sbatch_argv(spec, script)  # validate before anything is written
        check_env(spec.env)
        python = self._interpreter(spec)
        out_dir.mkdir(parents=True, exist_ok=True)
        header = f"orch job {spec.job} attempt {spec.attempt} token {spec.token}"
        protocol.atomic_write(script, batch_script(python, spec.wrapper_argv(python), dict(spec.env), header))
        os.chmod(script, 0o700)
        job_id = _sbatch(argv, spec.token, spec.job_environ())
        protocol.atomic_write_json(out_dir / protocol.SLURM_SUBMITTED, {
            "job_id": job_id, "token": spec.token, "sbatch": argv, "submitted_at": protocol.now_iso()})
        return job_id

    def _interpreter(self, spec: SubmitSpec) -> str:
        python = self.python or spec.wrapper_argv()[0]
        if _CONTROL_RE.search(python) or " " in python or not os.path.isabs(python):
            raise SlurmSubmitRefused(f"refusing interpreter path {python!r} for a #! line")
        return python

    def submit_group(self, specs: Sequence[SubmitSpec], batch_token: str, throttle: int | None) -> dict[str, str]:
        """ONE ``sbatch --array=<task indices>[%throttle]`` for all ``specs`` (tasks of one sweep with
        the same resources); each task's external id is ``<array id>_<task index>``.

        The batch script reads ``tasks.json`` in the batch dir (``<runs root>/.orch-batches/<token>``)
        and runs the wrapper of the task ``SLURM_ARRAY_TASK_ID`` names; Slurm's output files go there
        too. A preempted task is requeued in place by Slurm as that task only (``--requeue`` applies
        per task; never ``scontrol requeue`` of the array: Lightning#15022).
        """
        if not specs:
            return {}
        token = _check_value("batch token", batch_token, _TOKEN_RE)
        first = specs[0]
        tasks: dict[str, dict] = {}
        for spec in specs:
            protocol.validate_job_name(spec.job)
            _check_value("token", spec.token, _TOKEN_RE)
            if spec.task is None or spec.resources != first.resources or spec.base_env != first.base_env:
                raise SlurmSubmitRefused("an array's tasks need an index each, and the same resources and environment")
            check_env(spec.env)
            python = self._interpreter(spec)
            tasks[str(positive_or_zero("task index", spec.task))] = {
                "argv": spec.wrapper_argv(python), "env": dict(spec.env), "run_dir": str(spec.run_dir),
                "job": spec.job, "attempt": spec.attempt, "token": spec.token}
        batch_dir = batch_dir_of(first.run_dir, token)
        script = batch_dir / SCRIPT_NAME
        indices = sorted(int(i) for i in tasks)
        argv = [
            "sbatch", "--parsable",
            f"--job-name={job_name_for(token)}",
            f"--comment=orch batch={token} tasks={len(tasks)}",
            f"--output={_check_path('batch dir', batch_dir)}/{ARRAY_OUTPUT_PATTERN}",
            "--open-mode=append", "--requeue", "--export=ALL",
            f"--chdir={_check_path('batch dir', batch_dir)}",
            f"--signal=B:{WARNING_SIGNAL}@{warning_lead_s(first.resources.time_s)}",
            f"--array={','.join(map(str, indices))}" + (f"%{_positive('throttle', throttle)}" if throttle else ""),
            *resource_options(first.resources),
            *exclude_options(first.exclude_nodes, first.resources),
            _check_path("batch script", script),
        ]
        try:
            protocol.make_batch_dir(first.run_dir.parent, token)
        except protocol.UnsafePath as e:  # a symlinked .orch-batches led the batch's files outside the runs root
            raise SlurmSubmitRefused(f"refusing the batch dir: {e}") from None
        # Compact: the file is fsync'd before sbatch, and indented it was twice the bytes (700 KiB for 1,000 tasks).
        protocol.atomic_write(batch_dir / ARRAY_TASKS_FILE, json.dumps(tasks, sort_keys=True, separators=(",", ":")))
        protocol.atomic_write(script, array_script(self._interpreter(first), str(batch_dir / ARRAY_TASKS_FILE),
                                                   f"orch batch {token}: {len(tasks)} tasks"))
        os.chmod(script, 0o700)
        array_id = _sbatch(argv, token, first.job_environ())
        out = {spec.token: f"{array_id}_{spec.task}" for spec in specs}
        # One record for the array: each task's fence record names this batch and its index (SubmitSpec.batch),
        # which is how ``live_in_run_dir`` finds a task's job from its run dir. A task launched without that
        # pointer gets its own record, as every task did before (1,000 of them were a quarter of a sweep).
        protocol.atomic_write_json(batch_dir / protocol.SLURM_SUBMITTED, {
            "job_id": array_id, "batch_token": token, "tasks": len(specs), "submitted_at": protocol.now_iso()})
        unpointed = [spec for spec in specs if spec.batch != token]
        if unpointed:
            with protocol.SyncBatch() as records:
                for spec in unpointed:
                    out_dir = spec.attempt_dir / SLURM_DIR
                    out_dir.mkdir(parents=True, exist_ok=True)
                    records.write_json(out_dir / protocol.SLURM_SUBMITTED, {
                        "job_id": out[spec.token], "token": spec.token, "batch_token": token,
                        "submitted_at": protocol.now_iso()})
        return out

    def max_group_size(self) -> int | None:
        """Slurm's ``MaxArraySize``: array indices must be below it (1001 unless slurm.conf raises it).
        None when scontrol cannot say; sbatch then has the last word."""
        try:
            p = _run(["scontrol", "show", "config"], self.query_timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            return None
        m = re.search(r"^MaxArraySize\s*=\s*(\d+)\s*$", p.stdout if p.returncode == 0 else "", re.MULTILINE)
        return int(m.group(1)) if m else None

    def usable_nodes(self, resources: Resources) -> frozenset[str] | None:
        """The nodes of the job's partition (the default one, marked ``*``, when it names none) that can run a
        job: idle, mixed, allocated or completing, not down, drained or reserved. One ``sinfo -N`` call; None
        when sinfo fails (then suspect nodes are not excluded: never unschedulable, orchestrator/decide/suspects.py)."""
        try:
            p = _run(["sinfo", "-h", "-N", "-o", "%N|%P|%t"], self.query_timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if p.returncode != 0:
            return None
        usable = slurm_states.usable_nodes(p.stdout, resources.extra("partition"))
        pin = pinned_nodelist(resources.extra("extra_sbatch"))
        if pin is None:
            return usable
        # A job pinned to its nodes can use only those: a suspect among them stays (never unschedulable).
        if "/" in pin:  # sbatch reads a node list with a slash from that file: unknown here, exclude nothing
            return None
        try:
            h = _run(["scontrol", "show", "hostnames", pin], self.query_timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return usable & frozenset(h.stdout.split()) if h.returncode == 0 else None

    def own_node_choice(self, resources: Resources) -> str | None:
        """The job's own ``--sbatch-arg`` choosing its nodes (``--nodelist``/``--exclude``): sbatch gets no orch
        ``--exclude`` then (``exclude_options``)."""
        return own_node_choice(resources.extra("extra_sbatch"))

    # ------------------------------------------------------------------------------------------
    def _squeue(self, ids: Sequence[str]) -> dict[str, tuple[str, str, str]] | None:
        """Controller's view of ``ids`` (one call); None when squeue cannot be asked."""
        if not ids:
            return {}
        try:
            asked = ",".join(sorted({slurm_states.array_of(i) for i in ids}))
            p = _run(["squeue", "-h", "-r", "-t", "all", "-j", asked, "-o", slurm_states.SQUEUE_FORMAT],
                     self.query_timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            self.query_failures += 1
            return None
        if p.returncode != 0:
            # One id the controller forgot (MinJobAge passed) makes squeue fail with this message.
            if "Invalid job id" in p.stderr:
                return {}
            self.query_failures += 1
            return None
        return slurm_states.parse_squeue(p.stdout)

    def poll(self, refs: Sequence[AttemptRef]) -> dict[str, Outcome]:
        """token -> Outcome for every ref with an external id: one sacct (+ one squeue) call.

        sacct failing or timing out -> UNKNOWN for all (never EXITED). Records of another job
        that reuses the id (a controller that lost its state) are ignored by name.
        """
        by_id = {r.external_id: r for r in refs if slurm_states.is_job_id(r.external_id)}
        if not by_id:
            return {}
        fields = ",".join(slurm_states.SACCT_FIELDS)
        asked_ids = ",".join(sorted({slurm_states.array_of(i) for i in by_id}))  # an array's id lists its tasks
        argv = ["sacct", "-X", "--duplicates", "-n", "--parsable2", "-o", fields, "-j", asked_ids]
        try:
            p = _run(argv, self.query_timeout_s, env={**os.environ, **slurm_states.SACCT_ENV})
            err = None if p.returncode == 0 else (_first_line(p.stderr) or f"exit {p.returncode}")
        except subprocess.TimeoutExpired:
            err = f"timed out after {self.query_timeout_s:.0f} s"
        except OSError as e:
            err = str(e)
        if err is not None:
            self.query_failures += 1
            return {r.token: Outcome(Phase.UNKNOWN, reason=f"sacct failed: {err}") for r in by_id.values()}
        records = slurm_states.parse_sacct(p.stdout)

        sacct_view: dict[str, Outcome | None] = {}
        need_live: list[str] = []
        for job_id, ref in by_id.items():
            mine = [rec for rec in records.get(job_id, []) if rec.name == _name_of(ref)]
            if not mine:
                sacct_view[job_id] = None
                need_live.append(job_id)
                continue
            oc = slurm_states.outcome_from_records(mine)
            if oc.phase is Phase.EXITED and oc.backend_state in ("FAILED", "CANCELLED"):
                line = over_memory_line(ref, job_id)
                if line:
                    oc = slurm_states.outcome_from_records(mine, over_memory_line=line)
            sacct_view[job_id] = oc
            if oc.phase is Phase.EXITED:  # the controller may be requeueing it in place right now
                need_live.append(job_id)
        live = self._squeue(need_live)
        asked = set(need_live)
        out: dict[str, Outcome] = {}
        for job_id, ref in by_id.items():
            if job_id not in asked:
                out[ref.token] = sacct_view[job_id] or Outcome(Phase.UNKNOWN)
                continue
            entry = (live or {}).get(job_id)
            if entry is not None and entry[0] != _name_of(ref):
                entry = None  # another job under a reused id
            out[ref.token] = slurm_states.combine(sacct_view[job_id], entry, live_known=live is not None)
        return out

    def cancel(self, refs: Sequence[AttemptRef]) -> None:
        """One plain ``scancel``: SIGCONT+SIGTERM to every process of each job, SIGKILL after KillWait."""
        ids = [r.external_id for r in refs if slurm_states.is_job_id(r.external_id)]
        if not ids:
            return
        try:
            p = _run(["scancel", *ids], self.query_timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BackendError(f"scancel failed: {e}") from None
        # scancel exits non-zero when a job already ended ("Invalid job id"); that is not a failure.
        if p.returncode != 0 and "Invalid job id" not in p.stderr and "already completing" not in p.stderr:
            raise BackendError(f"scancel failed ({p.returncode}): {_first_line(p.stderr)}")

    def kill(self, refs: Sequence[AttemptRef]) -> None:
        """SIGKILL every process of each job now (a hung job that ignored ``cancel``'s SIGTERM)."""
        ids = [r.external_id for r in refs if slurm_states.is_job_id(r.external_id)]
        if not ids:
            return
        try:
            _run(["scancel", "--signal=KILL", "--full", *ids], self.query_timeout_s)
            _run(["scancel", *ids], self.query_timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BackendError(f"scancel failed: {e}") from None

    def _live_array_tasks(self) -> dict[str, dict[str, str]] | None:
        """batch token -> task index -> "Slurm job <array>_<task> (STATE)" for every array task of orch's this
        user's jobs the controller lists as pending or running (one squeue call, no list of every batch ever
        made); None when squeue cannot be asked."""
        try:
            p = _run(["squeue", "-h", "-r", "-t", "all", "-u", str(os.getuid()), "-o", slurm_states.SQUEUE_FORMAT],
                     self.query_timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            self.query_failures += 1
            return None
        if p.returncode != 0:
            self.query_failures += 1
            return None
        out: dict[str, dict[str, str]] = {}
        for jid, (name, st, _r) in slurm_states.parse_squeue(p.stdout).items():
            _array, _, task = jid.partition("_")
            if task.isdigit() and name.startswith(JOB_NAME_PREFIX) \
                    and slurm_states.phase_of(st) in (Phase.PENDING, Phase.RUNNING):
                out.setdefault(name[len(JOB_NAME_PREFIX):], {})[task] = f"Slurm job {jid} ({st})"
        return out

    def find_by_token(self, refs: Sequence[AttemptRef]) -> dict[str, str]:
        """token -> Slurm job id by job name ``orch-<token>``: one sacct call, squeue for the rest.

        Two Slurm jobs with one token (a submission retried blindly) answer with the older one;
        both are visible in ``sacct --name``.
        """
        tokens = {job_name_for(r.token): r.token for r in refs if _TOKEN_RE.match(r.token or "")}
        if not tokens:
            return {}
        found: dict[str, tuple[int, str]] = {}

        def add(name: str, job_id: str) -> None:
            tok = tokens.get(name)
            job_id = slurm_states.array_of(job_id)  # an array's tasks all answer for its batch token
            if tok and job_id.isdigit() and (tok not in found or int(job_id) < found[tok][0]):
                found[tok] = (int(job_id), job_id)

        # "Not found" must mean the scheduler answered and has no such job: a failed query that
        # looked like "not found" made the reconciler submit the attempt a second time.
        failed: list[str] = []

        def ask(argv: list[str]) -> None:
            """Run one lookup whose lines are ``<job id>|<job name>``; record it if it failed."""
            try:
                p = _run(argv, self.query_timeout_s)
            except (OSError, subprocess.TimeoutExpired) as e:
                failed.append(f"{argv[0]}: {e}")
                return
            if p.returncode != 0:
                failed.append(f"{argv[0]}: {_first_line(p.stderr)}")
                return
            for line in p.stdout.splitlines():
                job_id, _, name = line.partition("|")
                add(name.strip(), job_id.strip())

        ask(["sacct", "-X", "-n", "--parsable2", "-S", FIND_HISTORY, "-o", "JobID,JobName",
             f"--name={','.join(tokens)}"])
        missing = [n for n, t in tokens.items() if t not in found]
        if missing:
            ask(["squeue", "-h", "-t", "all", f"--name={','.join(missing)}", "-o", "%i|%j"])
            if failed and any(t not in found for t in tokens.values()):
                raise BackendError("cannot look submissions up by token: " + "; ".join(failed))
        return {tok: jid for tok, (_, jid) in found.items()}


def _sbatch(argv: list[str], token: str, environ: dict[str, str]) -> str:
    """Run sbatch (``--export=ALL`` hands ``environ`` to the job); the job (or array) id.
    SlurmSubmitRefused when sbatch will never take it."""
    try:
        p = _run(argv, SUBMIT_TIMEOUT_S, env=clean_submit_env(environ))
    except subprocess.TimeoutExpired:
        raise BackendError(f"sbatch timed out after {SUBMIT_TIMEOUT_S:.0f} s (the job may exist: "
                           f"look it up by token {token})") from None
    except OSError as e:
        raise BackendError(f"cannot run sbatch: {e}") from None
    if p.returncode != 0:
        why = _first_line(p.stderr) or _first_line(p.stdout)
        if _PERMANENT_SBATCH.search(why):  # e.g. "invalid partition specified": retrying cannot help
            raise SlurmSubmitRefused(f"sbatch refused the job: {why}")
        raise BackendError(f"sbatch failed ({p.returncode}): {why}")
    job_id = p.stdout.strip().split(";", 1)[0]
    if not job_id.isdigit():
        raise BackendError(f"sbatch answered {p.stdout.strip()!r}: not a job id")
    return job_id


def _name_of(ref: AttemptRef) -> str:
    """The Slurm job name the attempt was submitted under: its own token's, or its array's."""
    return job_name_for(ref.batch or ref.token)
