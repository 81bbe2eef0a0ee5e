"""Building an sbatch submission: validated values only, a batch script no shell ever reads.

Every value that reaches the sbatch command line or the batch script passes through here: names and
tokens by pattern, paths absolute and free of control characters and ``%``, numbers positive, extra
arguments as ``--option[=value]`` that never override an option orch sets itself. A newline or an
``#SBATCH`` smuggled in a job name or a comment can therefore never become a directive.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from orchestrator import protocol
from orchestrator.backends.base import Resources, SubmissionRefused

SLURM_DIR = protocol.SLURM_DIR  # attempts/<n>/slurm/: batch script, sbatch's record, the job's Slurm output
SCRIPT_NAME = protocol.SLURM_SCRIPT
OUTPUT_PATTERN = protocol.SLURM_OUTPUT_PATTERN
JOB_NAME_PREFIX = "orch-"
BATCHES_DIR = protocol.BATCHES_DIR  # <runs root>/.orch-batches/<token>/: one array's files
ARRAY_TASKS_FILE = "tasks.json"
ARRAY_OUTPUT_PATTERN = "slurm-%A_%a.out"
WARNING_SIGNAL = "USR2"  # the trainer (and orch's wrapper) treat SIGUSR2 like SIGTERM: checkpoint, exit

# What sacct/squeue/sbatch may take before we give up and answer UNKNOWN (a busy slurmctld or
# slurmdbd must delay a decision, never fail a job: SkyPilot #10155 restarted a healthy job 24
# times because status queries timed out).
QUERY_TIMEOUT_S = float(os.environ.get("ORCH_SLURM_QUERY_TIMEOUT_S", "30"))
SUBMIT_TIMEOUT_S = float(os.environ.get("ORCH_SLURM_SUBMIT_TIMEOUT_S", "60"))
FIND_HISTORY = os.environ.get("ORCH_SLURM_FIND_HISTORY", "now-30days")  # sacct -S for find_by_token
OUTPUT_TAIL_BYTES = 64 * 1024

# Inherited variables that must not reach a job submitted from inside another job: sbatch reads
# SBATCH_*/SLURM_* as option defaults, and torch.distributed reads the rank variables
# (the same list as submitit.helpers.clean_env).
_CLEAN_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_", "SBATCH_", "SUBMITIT_")
_CLEAN_NAMES = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
})

# --- validation: every sbatch value comes from here (no newline, no #SBATCH smuggling) -------------
_TOKEN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_WORD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # partition, account
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")
_EXTRA_RE = re.compile(r"^--[A-Za-z][A-Za-z0-9-]*(=[^\x00-\x1f\x7f]*)?$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
# Options orch sets itself and that an extra argument must not change: they decide where the
# job's output goes, what the job is called (find_by_token), whether it is requeued in place,
# what runs, and how sbatch answers.
_OWNED_OPTIONS = frozenset({
    "job-name", "comment", "output", "error", "open-mode", "requeue", "no-requeue", "export",
    "export-file", "chdir", "wrap", "parsable", "array", "hold", "wait", "test-only", "input",
})


_PERMANENT_SBATCH = re.compile(r"invalid|unrecognized option|not available|no partition|requested node config"
                               r"|not permitted|does not exist|exceeds", re.I)


class SlurmSubmitRefused(SubmissionRefused):
    """A value that may not go into an sbatch command line (the attempt cannot be submitted as is)."""


def _check_value(what: str, value: str, pattern: re.Pattern[str] | None = None) -> str:
    if not isinstance(value, str) or _CONTROL_RE.search(value) or (pattern and not pattern.match(value)):
        raise SlurmSubmitRefused(f"refusing {what} {value!r} for sbatch: not a plain value")
    return value


def _check_path(what: str, path: Path) -> str:
    s = str(path)
    # '%' would be expanded by sbatch as a filename pattern; control characters could end a line.
    if not path.is_absolute() or _CONTROL_RE.search(s) or "%" in s:
        raise SlurmSubmitRefused(
            f"refusing {what} {s!r}: need an absolute path without '%' or control characters")
    return s


def _positive(what: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SlurmSubmitRefused(f"refusing {what} {value!r}: need a positive integer")
    return value


def validate_extra_sbatch(extra: Sequence[str]) -> list[str]:
    """Extra sbatch arguments: each ``--option`` or ``--option=value``; never one orch owns."""
    out = []
    for arg in extra:
        _check_value("extra sbatch argument", arg, _EXTRA_RE)
        opt = arg[2:].split("=", 1)[0].lower()
        # sbatch (getopt_long) also takes unambiguous prefixes: --outp=... is --output=...
        if any(owned.startswith(opt) for owned in _OWNED_OPTIONS):
            raise SlurmSubmitRefused(f"refusing extra sbatch argument {arg!r}: orch sets --{opt} itself")
        out.append(arg)
    return out


def pinned_nodelist(extra: Sequence[str] | None) -> str | None:
    """The node list a job's own sbatch options pin it to (``--nodelist=L``, or an unambiguous getopt prefix of it:
    ``--nodel=L``), the last one given, as sbatch takes it; None when the job pins none. Its usable nodes are those:
    an exclusion of a node it pinned would leave sbatch nothing to run it on ("Requested node configuration is not
    available", a refusal for good); ``exclude_options`` drops orch's exclusion whenever the job chooses nodes."""
    pin = None
    for arg in extra or ():
        opt, eq, value = str(arg)[2:].partition("=")
        if eq and len(opt) >= len("nodel") and "nodelist".startswith(opt.lower()):
            pin = value
    return pin


def warning_lead_s(time_s: int | None) -> int:
    """Seconds before the time limit at which the job gets SIGUSR2 to checkpoint.

    Measured on 22.05: slurmctld checks every ~30 s and sends the signal at the first check where
    the time left is <= lead + 30 s, so the job gets it between lead and lead + 30 s before its
    limit (with --time=1 and a 30 s lead it came 6-9 s after the start). Hence a tenth of the limit,
    between 10 s and 5 min, and never so long that the warning could arrive in the first ~15 s,
    before the program has installed its handler (SIGUSR2's default action kills). 3 min when the
    limit is the partition's. ``ORCH_SLURM_SIGNAL_LEAD_S`` overrides.
    """
    env = os.environ.get("ORCH_SLURM_SIGNAL_LEAD_S")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    if not time_s:
        return 180
    return min(max(10, min(300, time_s // 10)), max(5, time_s - 45))


def clean_submit_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The submitter's environment without what a surrounding Slurm job or torchrun put there."""
    env = dict(os.environ if base is None else base)
    return {k: v for k, v in env.items() if not k.startswith(_CLEAN_PREFIXES) and k not in _CLEAN_NAMES}


def job_name_for(token: str) -> str:
    return JOB_NAME_PREFIX + token


def batch_script(python: str, argv: Sequence[str], env: dict[str, str], header: str) -> str:
    """A batch script that sets ``env`` and replaces itself with ``argv`` (no shell involved).

    The values are embedded as JSON (ASCII only, so one line each, and valid Python literals): a
    newline or '#SBATCH' inside a value stays inside a string and can never become a directive.
    """
    return (
        f"#!{python}\n"
        f"# {header}\n"
        "# Generated by orch (orchestrator/backends/slurm/sbatch.py). Runs orch's job wrapper as the batch\n"
        "# process itself, so Slurm's --signal=B:... and preemption signals reach it; no srun.\n"
        "import json, os, sys\n"
        f"ARGV = json.loads({json.dumps(json.dumps(list(argv)))})\n"
        f"ENV = json.loads({json.dumps(json.dumps(env, sort_keys=True))})\n"
        "os.environ.update(ENV)\n"
        "sys.stdout.flush()\n"
        "os.execv(ARGV[0], ARGV)\n"
    )


def _run(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout_s, env=env, check=False)


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""




def array_script(python: str, tasks_file: str, header: str) -> str:
    """A batch script for an array: it runs the wrapper of the task SLURM_ARRAY_TASK_ID names in
    ``tasks_file`` (argv + environment per task, written by orch before sbatch). No shell involved."""
    return (
        f"#!{python}\n"
        f"# {header}\n"
        "# Generated by orch (orchestrator/backends/slurm/backend.py): one array task = one orch\n"
        "# attempt; runs orch's wrapper as the batch process itself (no srun).\n"
        "import json, os, stat, sys\n"
        f"TASKS = {json.dumps(tasks_file)}\n"
        "# Only a regular file: a FIFO planted here held the task's allocation for good (hostile test).\n"
        "fd = os.open(TASKS, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)\n"
        "if not stat.S_ISREG(os.fstat(fd).st_mode):\n"
        "    sys.exit(f'orch: {TASKS} is not a regular file; the task was not run')\n"
        "with os.fdopen(fd) as f:\n"
        "    task = json.load(f)[os.environ['SLURM_ARRAY_TASK_ID']]\n"
        "os.environ.update(task['env'])\n"
        "os.chdir(task['run_dir'])\n"
        "sys.stdout.flush()\n"
        "os.execv(task['argv'][0], task['argv'])\n"
    )


def check_env(env: dict[str, str]) -> None:
    for k, v in env.items():
        _check_value("environment variable name", k, _ENV_NAME_RE)
        if not isinstance(v, str) or "\x00" in v:
            raise SlurmSubmitRefused(f"refusing environment value for {k}: not a string without NUL")


def positive_or_zero(what: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SlurmSubmitRefused(f"refusing {what} {value!r}: need an integer >= 0")
    return value


# The user's own node choice in --sbatch-arg; orch then adds no --exclude (sbatch keeps only the last one).
_NODE_CHOICE_OPTIONS = ("exclude", "nodelist")


def own_node_choice(extra: Sequence[str] | None) -> str | None:
    """The job's own sbatch option that chooses its nodes (``--exclude``/``--nodelist``, or a getopt prefix of one),
    the last one given; None when it chooses none. The user's choice wins: orch adds no ``--exclude`` then."""
    own = None
    for arg in extra or ():
        opt = str(arg)[2:].split("=", 1)[0].lower()
        if str(arg).startswith("--") and opt and any(full.startswith(opt) for full in _NODE_CHOICE_OPTIONS):
            own = str(arg)
    return own


def exclude_options(exclude: Sequence[str], r: Resources) -> list[str]:
    """``--exclude=`` for suspect nodes (orchestrator/decide/suspects.py), every name validated; nothing when the job's
    own --sbatch-arg chooses nodes (``own_node_choice``): the user's choice wins."""
    if not exclude or own_node_choice(r.extra("extra_sbatch", ())) is not None:
        return []
    return ["--exclude=" + ",".join(_check_value("node name", n, _WORD_RE) for n in exclude)]


def resource_options(r: Resources) -> list[str]:
    """sbatch options for the resources (every value validated)."""
    argv = []
    if r.extra("partition") is not None:
        argv.append(f"--partition={_check_value('partition', r.extra('partition'), _WORD_RE)}")
    if r.extra("account") is not None:
        argv.append(f"--account={_check_value('account', r.extra('account'), _WORD_RE)}")
    if r.gpus:  # 0 / None: no GPU requested
        # gres, not --gpus-per-node: works with count-only and File= gres alike, no cons_tres needed
        argv.append(f"--gres=gpu:{_positive('gpus', r.gpus)}")
    if r.nproc_per_node or r.nodes:
        # One task per node: the wrapper's srun starts one torchrun on each, which starts the node's ranks.
        argv += [f"--nodes={_positive('nodes', r.nodes or 1) + (r.spare_nodes or 0)}", "--ntasks-per-node=1"]
        if r.spare_nodes or r.min_nodes:  # a node's death must not end the job: the ranks restart on a spare or on
            argv.append("--no-kill")  # the nodes left (rankrestart.py)
    if r.gpus_per_node:
        argv.append(f"--gpus-per-node={_positive('gpus_per_node', r.gpus_per_node)}")
    if r.cpus_per_task is not None:
        argv.append(f"--cpus-per-task={_positive('cpus_per_task', r.cpus_per_task)}")
    if r.mem_mb is not None:
        argv.append(f"--mem={_positive('mem_mb', r.mem_mb)}M")
    if r.time_s is not None:
        argv.append(f"--time={math.ceil(_positive('time_s', r.time_s) / 60)}")  # Slurm counts minutes
    return argv + validate_extra_sbatch(r.extra("extra_sbatch", ()))
