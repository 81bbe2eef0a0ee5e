"""What every backend provides: submit, poll many attempts in one call, cancel, kill, find by token.

A backend never decides completion (that is ``protocol.verify_done_marker``). It says what the
scheduler knows about a process it started — its phase, exit status, and, when the scheduler knows
why it ended (Slurm's PREEMPTED, OUT_OF_MEMORY, ...), that cause as a ``FailureClass``: the
scheduler's vocabulary stays inside its backend, and ``classify`` never sees a Slurm state name.
Backends are constructed on the login node / controller host and must be cheap to import.
"""

from __future__ import annotations

import enum
import functools
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.protocol import ATTEMPTS_DIR, FailureClass


class Phase(enum.StrEnum):
    """What the scheduler says about one attempt."""

    PENDING = "pending"  # accepted, not started (or requeued in place and waiting to restart)
    RUNNING = "running"
    EXITED = "exited"  # finished by itself or killed; see exit_code / signal / backend_state
    VANISHED = "vanished"  # the scheduler has no trace and the process is gone without a record
    UNKNOWN = "unknown"  # the scheduler could not be asked (sacct failed, timed out): never "failed"


@dataclass(frozen=True)
class Resources:
    """What a job asks of its backend: generic fields every backend reads (each enforces what it can), and
    ``extras``, the options only one backend has (Slurm's partition, account, extra sbatch options), which
    that backend declares in ``Capabilities.extras`` and any other refuses (submitit's ``_equivalence_dict``
    model). ``extras`` may be given as a mapping; it is kept as sorted (key, value) pairs, lists as tuples,
    so that a ``Resources`` stays hashable (a group submission groups tasks by it)."""

    gpus: int | None = None
    cpus_per_task: int | None = None
    mem_mb: int | None = None
    time_s: int | None = None
    extras: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        pairs = self.extras.items() if isinstance(self.extras, Mapping) else self.extras
        frozen = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in pairs))
        object.__setattr__(self, "extras", frozen)

    def extra(self, key: str, default: Any = None) -> Any:
        """The backend-specific option ``key``, or ``default`` when not given."""
        return dict(self.extras).get(key, default)
    # Multi-rank: the program runs as nodes x nproc_per_node ranks under torchrun (jobside/ranklaunch.py).
    nodes: int | None = None
    nproc_per_node: int | None = None
    gpus_per_node: int | None = None
    # Restarts of the ranks inside the allocation, per attempt, after a transient rank failure (jobside/rankrestart.py).
    rank_restarts: int | None = None
    # Nodes held beside ``nodes`` (sbatch --nodes N+K --no-kill): a node lost under the ranks is replaced by one of
    # these inside the allocation, the ranks restarted there (needs rank_restarts).
    spare_nodes: int | None = None
    # The fewest nodes the ranks may go on with after nodes are lost and no spare is left (sbatch --no-kill): a rank
    # restart on fewer nodes, the world size smaller, rather than the queue (needs rank_restarts; < nodes).
    min_nodes: int | None = None


@dataclass(frozen=True)
class SubmitSpec:
    """Everything a backend needs to start attempt ``attempt`` of job ``job``."""

    job: str
    attempt: int
    token: str  # unique per attempt; travels with the job so a lost submission can be found again
    run_dir: Path
    command: tuple[str, ...]  # argv of the user's program, policy flags already appended
    env: dict[str, str] = field(default_factory=dict)  # ORCH_* etc., added to the job's environment
    outputs: tuple[str, ...] = ()  # --outputs globs: the wrapper writes done.json after exit 0
    resources: Resources = Resources()
    # The signal the program gets as the scheduler's early warning (time limit): TERM unless the
    # program opted into USR2 (the bundled trainer does). A program without a USR2 handler died of
    # orch's own warning (signal 12, classified crash, never requeued).
    warning_signal: str = "TERM"
    umask: int = 0o077  # run dirs 0700, files 0600 unless orch.toml shares them with the group
    task: int | None = None  # its index in a group submission (a sweep task's index = its array index)
    # The environment the job was submitted from (every attempt gets it, whoever launches it);
    # None: the launching process's own (rows from before orch stored it).
    base_env: Mapping[str, str] | None = None
    # The cloud whose spot interruption notices the wrapper watches ("off", "auto", "aws", "gcp",
    # "azure"), where its metadata service answers (None: the clouds' own address) and how often.
    spot_notice: str = "off"
    spot_url: str | None = None
    spot_interval_s: float = 5.0
    # The launch claim's fencing generation: the wrapper runs the program only while the attempt dir's
    # fence file names it (None: launched by an orch from before fencing, no check).
    fence: int | None = None
    # SIGTERM -> SIGKILL that torchrun gives the ranks of a multi-rank job (its --shutdown-timeout): orch's stop
    # grace, never torchrun's fixed 30 s. None: ranks.DEFAULT_GRACE_S.
    grace_s: float | None = None
    # Nodes this attempt must not run on (suspect nodes, orchestrator/decide/suspects.py); only a backend whose
    # ``Capabilities.node_exclusion`` is set is ever given any.
    exclude_nodes: tuple[str, ...] = ()
    # The group submission (a Slurm array) this launch goes out in, chosen before the run dir is prepared: the
    # attempt's fence record names it and ``task``, and the group gets one submitted record, not one per task
    # (a record per task was a quarter of a 1,000-task sweep). None: a single submission.
    batch: str | None = None
    # The launch left this attempt's command and fence records, and its ballast, in ``batch``'s dir
    # (``protocol.BATCH_RECORDS``): the wrapper puts them in place when the task starts.
    records_in_batch: bool = False

    def job_environ(self) -> dict[str, str]:
        """The attempt's process environment before orch's own variables are added."""
        return dict(os.environ if self.base_env is None else self.base_env)

    @functools.cached_property
    def attempt_dir(self) -> Path:  # computed once per spec: a sweep's launch asked 5,000 times
        return self.run_dir / ATTEMPTS_DIR / str(self.attempt)

    def wrapper_argv(self, python: str | None = None, time_limit_s: float | None = None,
                     mem_mb: int | None = None) -> list[str]:
        """argv that runs the user's command under orch's job wrapper (see ``orchestrator/jobside/wrapper.py``).

        ``time_limit_s``: let the wrapper enforce the time limit (local backend; Slurm enforces its own).
        ``mem_mb``: let the wrapper run it in a memory cgroup of that limit (local backend; memlimit.py).
        """
        argv = [python or sys.executable, "-m", "orchestrator.jobside.wrapper", "--run-dir", str(self.run_dir),
                "--job", self.job, "--attempt", str(self.attempt), "--token", self.token,
                "--warning-signal", self.warning_signal, "--umask", f"{self.umask:04o}"]
        if self.fence is not None:
            argv += ["--fence", str(self.fence)]
        if self.records_in_batch and self.batch and self.task is not None:
            argv += ["--batch", self.batch, "--task", str(self.task)]
        for g in self.outputs:
            argv += ["--outputs", g]
        if time_limit_s:
            argv += ["--time-limit", str(time_limit_s)]
        if mem_mb:
            argv += ["--mem-mb", str(int(mem_mb))]
        if self.resources.nproc_per_node:  # the wrapper starts the ranks through torchrun (jobside/ranklaunch.py)
            argv += ["--nproc-per-node", str(self.resources.nproc_per_node), "--nodes", str(self.resources.nodes or 1)]
            if self.grace_s is not None:
                argv += ["--grace", f"{self.grace_s:g}"]
            if self.resources.rank_restarts:
                argv += ["--rank-restarts", str(self.resources.rank_restarts)]
            if self.resources.spare_nodes:
                argv += ["--spare-nodes", str(self.resources.spare_nodes)]
            if self.resources.min_nodes:
                argv += ["--min-nodes", str(self.resources.min_nodes)]
        if self.spot_notice != "off":
            argv += ["--spot-notice", self.spot_notice, "--spot-interval", str(self.spot_interval_s)]
            if self.spot_url:
                argv += ["--spot-url", self.spot_url]
        return argv + ["--", *self.command]


@dataclass(frozen=True)
class AttemptRef:
    """How the reconciler names one live attempt to a backend."""

    external_id: str | None
    token: str
    run_dir: Path
    attempt: int
    batch: str | None = None  # the group submission's token (a Slurm array's name), if any
    task: int | None = None

    @property
    def attempt_dir(self) -> Path:
        return self.run_dir / ATTEMPTS_DIR / str(self.attempt)


@dataclass(frozen=True)
class Outcome:
    phase: Phase
    exit_code: int | None = None
    signal: int | None = None
    backend_state: str | None = None  # raw scheduler state, e.g. sacct's OUT_OF_MEMORY (for people)
    reason: str = ""
    restart_count: int = 0  # Slurm in-place requeues of this same attempt
    cause: FailureClass | None = None  # why it ended, when the scheduler knows (preempted, oom, ...)
    # Where it ran, as the scheduler says (Slurm's NodeList, compressed): the node list of an attempt whose
    # wrapper left no exit record (a node failure takes the wrapper with it), for suspect nodes.
    nodes: str | None = None
    # Why each earlier run of this attempt ended, oldest first, as the scheduler recorded it (one per in-place
    # restart; None where it gave no cause). The scheduler's account wins over the class the program guessed
    # from the stop signal it saw: a node failure Slurm reran in place was shown as a preemption.
    restart_causes: tuple[FailureClass | None, ...] = ()
    # (start, end) in epoch seconds of each run of this attempt that started, oldest first, as the scheduler
    # accounted them (end None while it runs): goodput's held time (Slurm's per-run Start and End). Empty where the
    # backend keeps no such account (locally, orch's own observations bound the hold).
    runs: tuple[tuple[float, float | None], ...] = ()
    # UNKNOWN although the scheduler was asked: its live view does not list it as pending or running (not at all,
    # or ended) and its accounting has no record. All Slurm leaves of a pending array task cancelled before it
    # started (dropped from its array, never accounted).
    not_live: bool = False


class BackendError(RuntimeError):
    """The backend failed a submission; the attempt stays pending and is retried by reconcile."""

    permanent = False


class SubmissionRefused(BackendError):
    """The scheduler will never accept this submission as it is (bad partition, bad value).

    Retrying cannot help: the attempt is classified ``invalid`` and the job goes to ``failed``.
    """

    permanent = True


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do: core code asks this, never a backend's name (submit, sweep and
    reconcile compared names, so a third backend would silently have taken the Slurm or the local path).

    The defaults are the conservative answers: a backend that declares nothing gets orch's own queue and
    scheduler-style liveness checks, and takes no backend-specific resource options.
    """

    # ``submit_group`` hands the whole group to the scheduler, which queues its tasks and keeps the throttle
    # itself (a Slurm array). False: orch keeps the group's queue and launches tasks as the throttle leaves room,
    # every reconcile pass, under its launch lock.
    group_queue: bool = False
    # ``live_in_run_dirs`` reads this host's process table: cheap and complete, so it is asked for every run
    # dir. False: a scheduler round trip, asked only for dirs an attempt was ever submitted from.
    host_liveness: bool = False
    # The ``Resources.extras`` keys this backend takes (Slurm's partition, account, ...); any other is refused
    # before a row is written.
    extras: frozenset[str] = frozenset()
    # One job may span several nodes (--nodes N > 1: one torchrun per node through the scheduler).
    multi_node: bool = False
    # The scheduler can keep an attempt off named nodes (``SubmitSpec.exclude_nodes``, Slurm's --exclude) and
    # list a partition's usable nodes (``usable_nodes``): orch then steers new attempts around suspect nodes
    # (orchestrator/decide/suspects.py). False: suspects are never computed for it.
    node_exclusion: bool = False


class Backend(ABC):
    name: str = "?"
    capabilities: Capabilities = Capabilities()
    # Scheduler queries this instance made that failed or timed out, although the call itself
    # answered (UNKNOWN outcomes): the reconciler adds them to its pass's count for `orch metrics`.
    query_failures: int = 0

    @abstractmethod
    def submit(self, spec: SubmitSpec) -> str:
        """Start the attempt; return its external id. Raises BackendError."""

    @abstractmethod
    def poll(self, refs: Sequence[AttemptRef]) -> dict[str, Outcome]:
        """One batched query for all refs; keyed by ``ref.token``. Missing keys mean UNKNOWN."""

    @abstractmethod
    def cancel(self, refs: Sequence[AttemptRef]) -> None:
        """Ask the scheduler to stop these attempts (SIGTERM first, so the job can checkpoint)."""

    def submit_group(self, specs: Sequence[SubmitSpec], batch_token: str, throttle: int | None) -> dict[str, str]:
        """Start several attempts (the tasks of a sweep) as one submission where the scheduler has
        one (a Slurm array); token -> external id. ``throttle``: at most this many run at once.

        The default submits one by one (the local backend: orch itself keeps to the throttle).
        """
        return {spec.token: self.submit(spec) for spec in specs}

    def check_resources(self, resources: Resources) -> None:
        """Raise BackendError (naming the value) for what this backend would refuse; no I/O. Run at argument
        parsing, before any row exists. The default refuses only extras this backend does not declare."""
        self.check_extras(key for key, _ in resources.extras)

    def check_extras(self, keys: Iterable[str]) -> None:
        """Raise BackendError naming the backend-specific options this backend does not take (an
        option meant for another backend was stored and silently ignored)."""
        unknown = sorted(set(keys) - self.capabilities.extras)
        if unknown:
            takes = ", ".join(sorted(self.capabilities.extras)) or "none"
            raise BackendError(f"the {self.name} backend does not take {', '.join(unknown)} (it takes: {takes})")

    def max_group_size(self) -> int | None:
        """The most tasks one :meth:`submit_group` can take (task indices 0..n-1), None for no limit."""
        return None

    def usable_nodes(self, resources: Resources) -> frozenset[str] | None:
        """The nodes a job with ``resources`` could run on now (its partition's, not down or drained); None
        when they cannot be listed. Asked only with ``Capabilities.node_exclusion`` and a suspect to exclude."""
        return None

    def own_node_choice(self, resources: Resources) -> str | None:
        """The option by which a job with ``resources`` chooses its own nodes (then orch excludes none of its own:
        the user's choice wins), None when it chooses none."""
        return None

    def kill(self, refs: Sequence[AttemptRef]) -> None:
        """Stop these attempts now (SIGKILL): the end of a stop whose SIGTERM was ignored."""
        self.cancel(refs)

    def live_in_run_dir(self, run_dir: Path) -> list[str]:
        """Live processes this backend can see running in ``run_dir``, whatever the DB says.

        ``orch submit`` refuses a name whose run dir shows one (after the DB file was
        deleted, the same name was submitted again beside the running first attempt).
        """
        return []

    def live_in_run_dirs(self, run_dirs: Sequence[Path]) -> dict[Path, list[str]]:
        """``live_in_run_dir`` for many run dirs; a backend overrides it when one query answers all."""
        return {d: self.live_in_run_dir(d) for d in run_dirs}

    @abstractmethod
    def find_by_token(self, refs: Sequence[AttemptRef]) -> dict[str, str]:
        """token -> external id for attempts the scheduler knows although the DB lost the id.

        Exactly-once submission rests on this: an attempt row written before a crash that hid
        whether the backend call happened is resolved by looking its token up, never by resubmitting
        blindly. Raises BackendError when the scheduler could not be asked (never "not found").
        """
