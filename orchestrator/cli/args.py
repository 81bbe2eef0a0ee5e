"""Argument-only checks: they run at parse time, before any row, directory or file exists (lesson 2).

Each raises ``click.BadParameter`` (exit 2, one line). The values that reach sbatch are checked
here with the backend's own validators, so a bad one is refused before the job row exists.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import click

from orchestrator.core.settings import setting
from orchestrator.jobside.spotnotice import CHOICES as SPOT_CHOICES
from orchestrator.protocol import layout

# ------------------------------------------------------------------------------------------
# argument-only validation (before any row or directory exists)
# ------------------------------------------------------------------------------------------
# Bounded digit runs: int() of a 5000-digit string raises ValueError (exit 1 instead of 2).
# ASCII only: under re.I the Kelvin sign (U+212A) matched [K] and then missed the unit table (a
# KeyError, exit 1); \d also matched other scripts' digits.
_MEM_RE = re.compile(r"^(\d{1,20})([KMGT]?)B?$", re.I | re.ASCII)
from orchestrator.core.resources import EXTRAS_KEY, MAX_MEM_MB, MAX_TIME_S  # noqa: E402 - the bounds every entry point shares

_TIME_RE = re.compile(r"^(?:(\d{1,12})-)?(\d{1,12})(?::(\d{1,12}))?(?::(\d{1,12}))?$", re.ASCII)


def parse_mem_mb(value: str) -> int:
    """Slurm-style memory (``500M``, ``4G``, ``1T``; a bare number is MB) in MB."""
    m = _MEM_RE.match(value.strip())
    if not m or int(m.group(1)) == 0:
        raise click.BadParameter(f"{value!r} is not a memory size like 500M, 4G or 1T", param_hint="--mem")
    n, unit = int(m.group(1)), m.group(2).upper()
    mb = {"K": n // 1024, "": n, "M": n, "G": n * 1024, "T": n * 1024 * 1024}[unit]
    # Refused here rather than by sbatch after the job row exists (and the reconciler would retry
    # the launch every pass); "9"*400+"K" also overflowed the float division (exit 1, not 2).
    if mb > MAX_MEM_MB:
        raise click.BadParameter(f"{value!r} is more than {MAX_MEM_MB} MB", param_hint="--mem")
    return max(1, mb)


def parse_time_s(value: str) -> int:
    """Slurm time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS -> seconds."""
    m = _TIME_RE.match(value.strip())
    if not m:
        raise click.BadParameter(f"{value!r} is not a time like 30, 1:30:00 or 2-00:00:00", param_hint="--time")
    d, a, b, c = m.groups()
    if d is not None:  # D-HH[:MM[:SS]]
        secs = int(d) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
        parts = [int(b or 0), int(c or 0)]
    elif c is not None:  # HH:MM:SS
        secs, parts = int(a) * 3600 + int(b) * 60 + int(c), [int(b), int(c)]
    elif b is not None:  # MM:SS
        secs, parts = int(a) * 60 + int(b), [int(b)]
    else:  # MM
        secs, parts = int(a) * 60, []
    if any(p >= 60 for p in parts) or secs <= 0:
        raise click.BadParameter(f"{value!r} is not a valid positive time", param_hint="--time")
    if secs > MAX_TIME_S:
        raise click.BadParameter(f"{value!r} is longer than Slurm can express", param_hint="--time")
    return secs


def _name_cb(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from orchestrator.protocol import UnsafePath, validate_job_name

    try:
        return validate_job_name(value)
    except UnsafePath as e:
        raise click.BadParameter(str(e)) from None


def _outputs_cb(_ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for g in value:
        parts = g.split("/")
        # An output glob that leaves the run dir would let the marker vouch for files orch doesn't own.
        if not g or g.startswith("/") or ".." in parts or "\x00" in g or "\n" in g:
            raise click.BadParameter(f"{g!r} must be a relative glob inside the run dir (no '/...' or '..')")
        # The run dir itself, or orch's own records, can never be a result: `--outputs .` used to be
        # refused only at launch, after the job row existed.
        first = os.path.normpath(g).split("/")[0]
        if first in (".", layout.ATTEMPTS_DIR, layout.CHECKPOINTS_DIR) or os.path.normpath(g) == layout.DONE_MARKER:
            raise click.BadParameter(f"{g!r} names the run dir itself or orch's own files; name result files",
                                     param_hint="--outputs")
        # `--outputs '**'` (or '**/*', '[a]ttempts/**', '*') listed attempts/1/exit.reserve, so every
        # attempt ended marker_corrupt: the glob is tried, by glob itself, on a sample of orch's files.
        if hit := orch_owned_match(g):
            raise click.BadParameter(f"{g!r} matches orch's own {hit}; name result files only (e.g. 'out/**', "
                                     "'*.pt')", param_hint="--outputs")
    return value


def orch_owned_match(pattern: str) -> str | None:
    """The first of orch's own run-dir files (``layout.ORCH_OWNED_SAMPLES``) that ``pattern`` matches,
    found with the very call the job wrapper lists outputs with (recursive ``**``, ``*`` not crossing
    ``/``, hidden names only for a pattern that names a dot); None when it matches none."""
    import glob
    import tempfile

    with tempfile.TemporaryDirectory(prefix="orch-outputs-") as tmp:
        root = Path(tmp)
        for rel in layout.ORCH_OWNED_SAMPLES:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).touch()
        hits = sorted(os.path.normpath(h) for h in glob.glob(pattern, root_dir=root, recursive=True)
                      if (root / h).is_file())
    return hits[0] if hits else None


def _keep_cb(_ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for g in value:
        # Like --outputs: a glob that leaves the run dir would make requeue reason about files not its own.
        if not g or g.startswith("/") or ".." in g.split("/") or "\x00" in g or "\n" in g:
            raise click.BadParameter(f"{g!r} must be a relative glob inside the run dir (no '/...' or '..')",
                                     param_hint="--keep")
        if os.path.normpath(g) == ".":
            raise click.BadParameter(f"{g!r} names the whole run dir; name the resume state", param_hint="--keep")
    return value


def _plain_cb(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # Values that end up in sbatch directives: a newline or '#' could smuggle an #SBATCH line.
    # fullmatch: with re.match, "$" also matches before a trailing newline ("gpu\n" passed).
    if value is not None and not re.fullmatch(r"[A-Za-z0-9._,:=@/+-]+", value):
        raise click.BadParameter(f"{value!r} contains characters not allowed in --{param.name}")
    return value


_SCRIPT_SUFFIXES = (".py", ".sh", ".bash")


def _absolute_program(cmd: tuple[str, ...]) -> tuple[str, ...]:
    """Relative paths of the program and its script mean the submitter's cwd, not the run dir the job runs in
    (a new user's ``orch submit -- python train.py``, the README's own, failed at once: "can't open file
    .../runs/<job>/train.py"). The program (``.venv/bin/python``) when it holds a slash, and the first argument
    that names a script (``.py``, ``.sh``) existing here as a relative path (``train.py`` of ``python``,
    ``torchrun --nproc-per-node 2``, ``bash``), are made absolute. Bare names (``python``) are looked up on PATH by
    the job, as usual; any other argument is the program's to read (a path the job creates in its run dir)."""
    prog = cmd[0]
    if "/" in prog and not os.path.isabs(prog):
        prog = os.path.abspath(prog)
    args = list(cmd[1:])
    for i, arg in enumerate(args):
        if arg == "--" or (arg in ("-m", "-c") and i == 0 and "python" in Path(prog).name):
            break  # python -m MODULE / -c CODE: no script path follows
        if arg.endswith(_SCRIPT_SUFFIXES) and not arg.startswith("-") and not os.path.isabs(arg) \
                and os.path.isfile(arg):
            args[i] = os.path.abspath(arg)
            break
    return (prog, *args)


def _default_name(cmd: tuple[str, ...]) -> str:
    import secrets

    base = re.sub(r"[^A-Za-z0-9._-]", "-", Path(cmd[0]).name)[:40].strip(".-") or "job"
    if base in ("python", "python3") and len(cmd) > 2 and cmd[1] == "-m":
        base = re.sub(r"[^A-Za-z0-9._-]", "-", cmd[2])[:40] or base
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"




_MAX_ATTEMPTS = setting("policy.max_attempts")


def job_options(f: Any) -> Any:
    """The options every job (``orch submit``) and every sweep task (``orch sweep``) takes."""
    opts = [
        click.option("--backend", type=click.Choice(["local", "slurm"]), default="local", show_default=True),
        click.option("--partition", callback=_plain_cb, help="Slurm partition."),
        click.option("--account", callback=_plain_cb, help="Slurm account."),
        click.option("--gpus", type=click.IntRange(0, 1024), help="GPUs per job."),
        click.option("--cpus-per-task", type=click.IntRange(1, 4096), help="CPUs per task."),
        click.option("--nproc-per-node", type=click.IntRange(1, 4096), default=None,
                     help="Run the program as this many ranks per node under torchrun (RANK, LOCAL_RANK, WORLD_SIZE, "
                          "MASTER_ADDR, ... set for each); locally torchrun --standalone, on Slurm one torchrun per "
                          "node through srun."),
        click.option("--nodes", type=click.IntRange(1, 100_000), default=None,
                     help="Nodes of a multi-rank job (with --nproc-per-node; only on a backend that runs several "
                          "nodes). Default 1."),
        click.option("--rank-restarts", type=click.IntRange(0, 100), default=None,
                     help="With --nproc-per-node: restart the ranks inside the job's own allocation, from the "
                          "newest checkpoint, up to this many times per attempt when a rank is killed (SIGKILL, "
                          "SIGSEGV, SIGBUS) or the program reports a storage fault, and only while each restart "
                          "committed a newer checkpoint. Default 0: the attempt ends and orch's policy requeues it."),
        click.option("--spare-nodes", type=click.IntRange(1, 100), default=None,
                     help="With --nodes and --rank-restarts (Slurm): hold this many more nodes (sbatch --nodes N+K "
                          "--no-kill); when a node dies under the ranks, they are restarted on a spare inside the "
                          "allocation, from the newest checkpoint, instead of the job going back to the queue."),
        click.option("--min-nodes", type=click.IntRange(1, 100_000), default=None,
                     help="With --nodes and --rank-restarts (Slurm): when nodes die under the ranks and no spare is "
                          "left, restart the ranks on the nodes left, down to this many (a smaller world size; "
                          "the program must resume on it), inside the allocation (sbatch --no-kill). Default: "
                          "--nodes (never fewer)."),
        click.option("--gpus-per-node", type=click.IntRange(1, 1024), default=None,
                     help="GPUs on each node (Slurm: --gpus-per-node)."),
        click.option("--mem", help="Memory, Slurm style: 500M, 16G."),
        click.option("--time", "time_", help="Time limit, Slurm style: 30, 4:00:00, 2-00:00:00."),
        # One schema with orch.toml's policy.max_attempts (orchestrator.core.settings): orch.toml accepted 0.
        click.option("--max-attempts", type=click.IntRange(int(_MAX_ATTEMPTS.lo), int(_MAX_ATTEMPTS.hi)), default=None,
                     help=_MAX_ATTEMPTS.help),
        click.option("--outputs", multiple=True, callback=_outputs_cb,
                     help="Glob (relative to the run dir) of result files; orch writes done.json after exit 0. "
                          "For programs that do not write their own marker."),
        click.option("--keep", multiple=True, callback=_keep_cb,
                     help="Glob (relative to the run dir) of resume state a requeue never moves to the trash, "
                          "even inside --outputs (HF checkpoint-N dirs and Lightning *.ckpt files are kept "
                          "anyway). Repeatable."),
        click.option("--sbatch-arg", "sbatch_args", multiple=True, help="Extra sbatch argument, e.g. --qos=high."),
        click.option("--warning-signal", type=click.Choice(["TERM", "USR2", "INT"]), default=None,
                     help="Signal the program gets when the time limit nears (Slurm's early warning). "
                          "Default TERM (for every program: none is recognised from its argv)."),
        click.option("--spot-notice", type=click.Choice(SPOT_CHOICES), default=None,
                     help="Watch this cloud's spot interruption notice from inside the job and stop the program "
                          "as for a preemption (SIGTERM) when it comes; auto: whichever answers. "
                          "Default: [spot] notice in orch.toml, else off."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


# The backend-specific options (``Resources.extras``) the CLI sets, by the option that sets each.
EXTRA_OPTIONS = {"partition": "--partition", "account": "--account", "extra_sbatch": "--sbatch-arg"}


def _check_extras(backend: str, extras: dict[str, Any]) -> None:
    """Refuse options the chosen backend does not take (it declares the ones it does), naming the backends
    that take them: a --partition with --backend local was stored and ignored before it was refused."""
    from orchestrator.backends import BACKENDS, get_backend
    from orchestrator.backends.base import BackendError

    try:
        get_backend(backend).check_extras(extras)
    except BackendError:
        takers = " or ".join(f"--backend {n}" for n in BACKENDS if set(extras) <= get_backend(n).capabilities.extras)
        raise click.BadParameter(f"{'/'.join(EXTRA_OPTIONS.values())} need {takers}") from None


def rank_resources(opts: dict[str, Any]) -> dict[str, Any]:
    """``nodes``/``nproc_per_node``/``gpus_per_node`` from the options, refused (exit 2) where the backend cannot
    run them: asked of the backend's ``multi_node`` capability, never its name."""
    out: dict[str, Any] = {}
    nproc, nodes, gpn = opts.get("nproc_per_node"), opts.get("nodes"), opts.get("gpus_per_node")
    if nodes is not None:
        if nproc is None:  # N nodes each running the one program would be N copies, not N ranks
            raise click.BadParameter("--nodes needs --nproc-per-node (the ranks each node runs)", param_hint="--nodes")
        from orchestrator.backends import get_backend

        if not get_backend(opts["backend"]).capabilities.multi_node:
            raise click.BadParameter(f"--nodes: the {opts['backend']} backend runs a job on this machine only "
                                     "(drop --nodes; --nproc-per-node sets the ranks)", param_hint="--nodes")
        out["nodes"] = nodes
    if nproc is not None:
        out["nproc_per_node"] = nproc
        out.setdefault("nodes", 1)
        from orchestrator.core.resources import rank_option_taken

        if (arg := rank_option_taken(opts.get("sbatch_args"))) is not None:
            opt = arg[2:].split("=", 1)[0].lower()
            raise click.BadParameter(f"{arg!r}: with --nproc-per-node, orch sets --{opt} itself (use --nodes, "
                                     "--gpus-per-node)", param_hint="--sbatch-arg")
    if opts.get("rank_restarts") is not None:
        if nproc is None:  # orch restarts only ranks it launched itself
            raise click.BadParameter("--rank-restarts needs --nproc-per-node (orch restarts the ranks it launches)",
                                     param_hint="--rank-restarts")
        out["rank_restarts"] = opts["rank_restarts"]
    # A spare node, or going on with fewer nodes, is used only by a restart of the ranks inside the allocation.
    for key, where in (("spare_nodes", "on a spare"), ("min_nodes", "on the nodes left")):
        if opts.get(key) is None:
            continue
        flag = "--" + key.replace("_", "-")
        if nodes is None or not opts.get("rank_restarts"):
            raise click.BadParameter(f"{flag} needs --nodes and --rank-restarts (the ranks restart {where})",
                                     param_hint=flag)
        out[key] = opts[key]
    if out.get("min_nodes") is not None and out["min_nodes"] >= nodes:
        raise click.BadParameter(f"--min-nodes {out['min_nodes']} must be below --nodes {nodes}",
                                 param_hint="--min-nodes")
    if gpn is not None:
        if opts.get("gpus") is not None:
            raise click.BadParameter("give --gpus and --gpus-per-node not both (per node is what a node gets)",
                                     param_hint="--gpus-per-node")
        out["gpus_per_node"] = gpn
    return out


def job_settings(opts: dict[str, Any]) -> tuple[str, dict[str, Any], int | None, tuple[str, ...]]:
    """(backend, resources, max_attempts, outputs) from ``job_options``' values: argument checks only."""
    resources: dict[str, Any] = {}
    if opts["mem"] is not None:
        resources["mem_mb"] = parse_mem_mb(opts["mem"])
    if opts["time_"] is not None:
        resources["time_s"] = parse_time_s(opts["time_"])
    for k in ("gpus", "cpus_per_task"):
        if opts[k] is not None:
            resources[k] = opts[k]
    extras = {k: opts[k] for k in ("partition", "account") if opts[k] is not None}
    if opts["sbatch_args"]:
        # The backend's own check, run at parse time: an option orch owns (--output=, even as a
        # getopt prefix) used to be refused only at sbatch time, after the job row existed.
        from orchestrator.backends.base import BackendError
        from orchestrator.backends.slurm import validate_extra_sbatch

        try:
            validate_extra_sbatch(opts["sbatch_args"])
        except BackendError as e:
            raise click.BadParameter(str(e), param_hint="--sbatch-arg") from None
        extras["extra_sbatch"] = list(opts["sbatch_args"])
    if extras:
        _check_extras(opts["backend"], extras)
        resources[EXTRAS_KEY] = extras
    resources.update(rank_resources(opts))
    if opts["warning_signal"] is not None:
        resources["warning_signal"] = opts["warning_signal"]
    if opts["spot_notice"] is not None:
        resources["spot_notice"] = opts["spot_notice"]
    if opts.get("keep"):
        resources["keep"] = list(opts["keep"])  # resumestate.KEEP_KEY: kept in the job's resources JSON
    return opts["backend"], resources, opts["max_attempts"], opts["outputs"]
