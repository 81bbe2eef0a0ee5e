"""Every environment variable orch sets or reads, declared once: its name, who reads it, and what it does.

The environment reference (``docs/reference/environment.md``) is generated from this table, and
``tests/unit/test_docs.py`` scans the source for every ``ORCH_*`` name it uses and fails on one this table lacks
(24 of them used to be introduced in the README's running prose, and some nowhere). Stdlib only, data only.
"""

from __future__ import annotations

from typing import NamedTuple


class Variable(NamedTuple):
    name: str
    group: str  # one of GROUPS
    default: str  # "" where unset means nothing
    meaning: str


GROUPS = {
    "job": "What a job's program gets (set by orch for every attempt)",
    "controller": "What orch's commands read (the controller: orch submit, orch reconcile, ...)",
    "jobside": "What the job wrapper and the in-job kit read (set it for the job, or before orch submit)",
    "tests": "Fault injection and pauses for tests and drills (never set in production)",
    "docs": "What the documentation build reads (mkdocs build, through scripts/docs_pictures.py)",
}

VARIABLES: tuple[Variable, ...] = (
    # -- a job's program gets
    Variable("ORCH_RUN_DIR", "job", "", "the run dir, also the program's working directory"),
    Variable("ORCH_JOB_NAME", "job", "", "the job's name"),
    Variable("ORCH_ATTEMPT", "job", "", "the attempt's number, 1 for the first"),
    Variable("ORCH_OVERRIDES", "job", "{}",
             "JSON: what the policy changed for this attempt (lr, resume, skip_batches, micro_batch_size, ...)"),
    Variable("ORCH_SUBMIT_TOKEN", "job", "", "the attempt's token, as its fence and completion records name it"),
    Variable("ORCH_RUN_ID", "job", "", "an id stable across attempts: one tracker run per run dir"),
    Variable("ORCH_TENSORBOARD_DIR", "job", "", "where TensorBoard events go (the integrations' loggers use it)"),
    Variable("ORCH_RESUME_STEP", "job", "",
             "the step the attempt resumes from (0 on a first attempt; unset when orch cannot know)"),
    Variable("ORCH_MARKER_WRITER", "job", "",
             "wrapper: orch's wrapper writes done.json after exit 0, and the kit writes complete.json instead"),
    Variable("ORCH_SWEEP", "job", "", "a sweep task's sweep name"),
    Variable("ORCH_TASK_INDEX", "job", "", "a sweep task's index"),
    Variable("ORCH_SWEEP_PARAMS", "job", "", "a sweep task's argument set, as a JSON object"),
    Variable("ORCH_MTBF_S", "job", "86400",
             "the mean time between unwarned failures on the job's partition, from the job table's last 30 days "
             "(save_every=\"auto\" uses it)"),
    Variable("ORCH_MTBF_SOURCE", "job", "", "how orch got ORCH_MTBF_S (history or the prior)"),
    Variable("ORCH_GRACE_S", "job", "", "the grace from a stop signal to SIGKILL, where the launcher exports it"),
    Variable("WANDB_RUN_ID", "job", "", "the stable run id, unless you set your own: one W&B run across attempts"),
    Variable("WANDB_RESUME", "job", "allow", "so that each attempt continues the W&B run (unless you set your own)"),
    # -- orch's commands read
    Variable("ORCH_HOME", "controller", "~/.orch", "the DB, the runs root and the trash (created 0700)"),
    Variable("ORCH_DB_URL", "controller", "sqlite:///$ORCH_HOME/orch.db",
             "any SQLAlchemy URL: a PostgreSQL DB several controller hosts share; a SQLite path must be absolute"),
    Variable("ORCH_METRICS_TEXTFILE_DIR", "controller", "",
             "overrides orch.toml's [metrics] textfile_dir (empty: off)"),
    Variable("ORCH_LAUNCH_GRACE_S", "controller", "120",
             "how long a dead launcher's claim is left before another pass re-claims it (longer than sbatch's "
             "timeout)"),
    Variable("ORCH_LOCK_TIMEOUT_S", "controller", "30",
             "the longest wait for one of orch's lock files (the migrate lock: 300 unless this is set)"),
    Variable("ORCH_SLURM_PYTHON", "controller", "orch's own Python",
             "the Python a Slurm job's wrapper runs under (one with orch-kit installed)"),
    Variable("ORCH_SLURM_SUBMIT_TIMEOUT_S", "controller", "60", "the longest an sbatch call may take"),
    Variable("ORCH_SLURM_QUERY_TIMEOUT_S", "controller", "30", "the longest an sacct or squeue call may take"),
    Variable("ORCH_SLURM_SIGNAL_LEAD_S", "controller", "a tenth of --time, 10 s..5 min (3 min without --time)",
             "how long before its time limit a Slurm job gets its warning signal"),
    Variable("ORCH_SLURM_FIND_HISTORY", "controller", "now-30days",
             "how far back sacct looks for a submission lost in a crash (its -S)"),
    Variable("ORCH_MLFLOW", "controller", "", "0: arrange no MLflow run even where MLFLOW_TRACKING_URI is set"),
    Variable("ORCH_DEBUG", "controller", "", "1: an unexpected error prints its traceback, not one line"),
    # -- the job wrapper and the kit read
    Variable("ORCH_HEARTBEAT_S", "jobside", "2", "how often progress.json is rewritten (seconds)"),
    Variable("ORCH_STOP_CHECK_S", "jobside", "1",
             "the longest time between two stop agreements of a multi-rank job's ranks (seconds)"),
    Variable("ORCH_PREEMPT_LINGER_S", "jobside", "600",
             "how long a multi-rank Slurm wrapper waits for Slurm's end-of-grace signal after a preemption"),
    Variable("ORCH_TRAINER_COLLECTIVE_TIMEOUT_S", "jobside", "300",
             "the bundled trainer's bound on every collective of a multi-rank run (seconds)"),
    # -- tests and drills
    Variable("ORCH_FAULT", "tests", "", "<site>: the process dies there (os._exit(99)), as a kill -9 would"),
    Variable("ORCH_PAUSE_AT", "tests", "", "<site>: the process pauses there, for ORCH_PAUSE_S seconds"),
    Variable("ORCH_PAUSE_S", "tests", "3", "how long ORCH_PAUSE_AT pauses (at most 600 s)"),
    Variable("ORCH_PAUSE_UNTIL", "tests", "",
             "a file: the paused process creates <file>.reached and goes on once the file exists"),
    # -- the documentation build reads
    Variable("ORCH_DOCS_PICTURES", "docs", "",
             "a folder holding the site's pictures (written by `python scripts/docs_pictures.py --out DIR`): the "
             "build takes them from there instead of running the job that draws them (~20 s)"),
)
