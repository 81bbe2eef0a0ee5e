"""A sweep's argument sets, commands and task names, and the checks before anything is written (stdlib only:
``orch sweep``'s quick path, ``orchestrator/ops/quicksweep.py``, and ``orchestrator/ops/sweep.py`` share them)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

from orchestrator import protocol
from orchestrator.backends.base import Backend
from orchestrator.core.config import Config
from orchestrator.core.rundir import check_run_dir, ensure_runs_root, run_dir_for
from orchestrator.errors import AlreadyVerified, Refused, UsageError
from orchestrator.ops.liveness import live_processes

MAX_TASKS = 100_000
# Linux refuses one argv or environment string longer than MAX_ARG_STRLEN (32 pages: 128 KiB) with E2BIG,
# and a NUL cuts it short: such a value was accepted, then every task's launch failed as `unknown`.
MAX_VALUE_BYTES = 128 * 1024
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_FIELD_RE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")


@dataclass
class SweepRequest:
    name: str
    command: list[str]  # may hold {key} placeholders
    params: list[dict[str, Any]]  # one argument set per task
    backend: str = "local"
    resources: dict[str, Any] = field(default_factory=dict)
    max_attempts: int = 3
    outputs: list[str] = field(default_factory=list)
    throttle: int | None = None
    launch_deferred: str = ""  # why its tasks were not launched now (they wait for a reconcile pass)


# ------------------------------------------------------------------------------------------
# argument sets (argument-only checks: they run before anything is written)
# ------------------------------------------------------------------------------------------
def parse_grid(axes: list[str]) -> list[dict[str, Any]]:
    """``["lr=1e-3,1e-4", "seed=1,2"]`` -> the cartesian product, first axis slowest."""
    keys, values = [], []
    for axis in axes:
        key, sep, vals = axis.partition("=")
        if not sep or not _KEY_RE.match(key) or not vals:
            raise UsageError(f"--grid {axis!r}: use KEY=V1,V2,... with KEY a word")
        if key in keys:
            raise UsageError(f"--grid: key {key!r} given twice")
        keys.append(key)
        values.append(vals.split(","))
        for v in values[-1]:
            _check_value(v, f"--grid {key}")
    # the largest ORCH_SWEEP_PARAMS any task gets: each axis's longest value (as JSON) together
    _check_set({k: max(vs, key=lambda v: len(json.dumps(v))) for k, vs in zip(keys, values, strict=True)}, "--grid")
    sets = [dict(zip(keys, combo, strict=True)) for combo in product(*values)]
    if len(sets) > MAX_TASKS:
        raise UsageError(f"--grid makes {len(sets)} tasks; at most {MAX_TASKS}")
    return sets


def load_params(text: str, source: str) -> list[dict[str, Any]]:
    """A JSON-lines file: one JSON object (argument set) per non-empty line."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, parse_constant=_no_constant, parse_float=_finite_float)
        except (ValueError, RecursionError) as e:
            raise UsageError(f"{source}:{n}: not a JSON object: {str(e)[:80]}") from None
        if not isinstance(obj, dict) or not all(isinstance(k, str) and _KEY_RE.match(k) for k in obj):
            raise UsageError(f"{source}:{n}: need a JSON object whose keys are words")
        if not all(isinstance(v, (str, int, float, bool)) for v in obj.values()):
            raise UsageError(f"{source}:{n}: values must be strings, numbers or booleans")
        for k, v in obj.items():
            _check_value(v, f"{source}:{n}: {k}")
        _check_set(obj, f"{source}:{n}")
        out.append(obj)
        if len(out) > MAX_TASKS:
            raise UsageError(f"{source}: more than {MAX_TASKS} argument sets")
    if not out:
        raise UsageError(f"{source}: no argument sets")
    return out


def _check_value(v: Any, where: str) -> None:
    """A value a task's argv and ORCH_SWEEP_PARAMS can carry: no NUL, UTF-8, at most MAX_VALUE_BYTES."""
    if not isinstance(v, str):
        return
    if "\x00" in v:
        raise UsageError(f"{where}: the value holds a NUL character, which no argument or environment can carry")
    try:
        size = len(v.encode())
    except UnicodeEncodeError:  # a lone surrogate ("\ud800"): the launch could not encode it
        raise UsageError(f"{where}: the value is not valid Unicode text") from None
    if size > MAX_VALUE_BYTES:
        raise UsageError(f"{where}: the value is {size} bytes; at most 128 KiB ({MAX_VALUE_BYTES} bytes) fits "
                         "one argument")


def _check_set(params: dict[str, Any], where: str) -> None:
    """The whole set travels as one environment string (ORCH_SWEEP_PARAMS=...): the same limit applies."""
    size = len(protocol.ENV_SWEEP_PARAMS) + 1 + len(json.dumps(params, sort_keys=True, default=str))  # as launch
    if size >= MAX_VALUE_BYTES:
        raise UsageError(f"{where}: the argument set is {size} bytes as {protocol.ENV_SWEEP_PARAMS}; at most 128 KiB "
                         f"({MAX_VALUE_BYTES} bytes) fits one environment string")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    # 1e400 parsed as inf: NaN and Infinity are refused, so their overflowing spelling is too.
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is not a finite JSON number")
    return value


def render(command: list[str], params: dict[str, Any]) -> list[str]:
    """The command with ``{key}`` replaced by the task's value (``{{``/``}}``: literal braces)."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "{{":
            return "{"
        if m.group(0) == "}}":
            return "}"
        key = m.group(1)
        if key not in params:
            raise UsageError(f"the command names {{{key}}} but the argument set has no {key!r}")
        v = params[key]
        return json.dumps(v) if isinstance(v, bool) else str(v)

    return [_FIELD_RE.sub(sub, arg) for arg in command]


# What one exec may carry, argv and environment together (Linux: ARG_MAX is 2 MiB by default, and each string
# at most 128 KiB); the environment of the submitter comes on top, so the command alone stays well below it.
MAX_ARGV_BYTES = 1 << 20


def check_argv_size(commands: list[list[str]]) -> None:
    """Refuse, before anything is written, a rendered command too large to exec: `{a}` 40 times with a 60 KB
    value made 2.4 MB of argv; the sweep was accepted, and every task then failed `unknown` (hostile test).
    The CLI calls it at parse time; submit_sweep again, for the Python API."""
    for i, cmd in enumerate(commands):
        size = sum(len(a.encode()) + 1 for a in cmd)
        if size > MAX_ARGV_BYTES:
            raise UsageError(f"task {i}'s command is {size} bytes once its values are filled in; a program's "
                             f"arguments can hold at most {MAX_ARGV_BYTES} here")


def task_name(sweep: str, index: int, count: int) -> str:
    return f"{sweep}.{index:0{max(4, len(str(count - 1)))}d}"


@dataclass
class Preflight:
    """What the checks before anything is written found: the task names and commands, and the tasks whose run
    dir already holds a verified result of this very task (recorded done, never rerun)."""

    names: list[str]
    commands: list[list[str]]
    verified: set[str]


def preflight_sweep(cfg: Config, req: SweepRequest, backend: Backend,
                    names_taken: Callable[[list[str]], set[str]]) -> Preflight:
    """The checks of a new sweep before anything is written, in order of cost: names, commands, the scheduler's
    array limit, then each task's run dir (no symlink; a verified marker only of this task's command and
    argument set), then one process-table scan for live attempts the DB does not know."""
    protocol.validate_job_name(req.name)
    commands = [render(req.command, p) for p in req.params]  # every placeholder resolves, or nothing is written
    check_argv_size(commands)
    names = [task_name(req.name, i, len(req.params)) for i in range(len(req.params))]
    for n in names:
        protocol.validate_job_name(n)
    # Slurm refuses an array index >= MaxArraySize (1001 by default) as "Invalid job array specification",
    # which orch would take for a permanent refusal of every task: say so before anything is written.
    limit = backend.max_group_size()
    if limit is not None and len(req.params) > limit:
        raise UsageError(f"a sweep of {len(req.params)} tasks is more than this cluster's job arrays take "
                         f"(MaxArraySize={limit}): split it into sweeps of at most {limit}, or raise MaxArraySize")
    ensure_runs_root(cfg)
    verified: set[str] = set()
    unverified: list[Path] = []
    for n, cmd, params in zip(names, commands, req.params, strict=True):
        run_dir = run_dir_for(cfg, n)
        check_run_dir(cfg, run_dir)
        if protocol.verify_done_marker(run_dir).verified:
            recorded = protocol.last_attempt_command(run_dir)
            if diff := command_difference(cmd, recorded):
                raise Refused(f"refused: {n}: {run_dir} holds a verified result of another command ({diff}); "
                              "use another sweep name, or move that run dir away")
            if diff := params_difference(params, run_dir, recorded):
                raise Refused(f"refused: {n}: {run_dir} holds a verified result of another argument set ({diff}); "
                              "use another sweep name, or move that run dir away")
            verified.add(n)  # a finished task of an earlier sweep (a lost DB): recorded done, never rerun
        else:
            unverified.append(run_dir)
    if len(verified) == len(names):  # (no unverified run dir: no process to judge)
        raise AlreadyVerified(f"refused: every task of {req.name!r} already holds a verified done marker")
    # A name this DB holds is refused as one before any run dir's processes are judged: a task named like a job
    # still running ("taken.0000") was refused as a live attempt "this DB does not know".
    if taken := names_taken([req.name, *names]):
        raise names_exist(taken)
    for run_dir, live in live_processes(unverified).items():
        if live:
            raise Refused(f"refused: a live attempt runs in {run_dir} ({'; '.join(live[:2])}) that this DB "
                          "does not know (was the DB deleted?); stop it first")
    return Preflight(names, commands, verified)


def names_exist(taken: set[str]) -> Refused:
    return Refused(f"refused: {', '.join(sorted(taken)[:3])} already exist(s); sweep and job names share one "
                   "namespace")


def command_difference(cmd: list[str], recorded: tuple[int, list[str]] | None) -> str | None:
    """Why a run dir's last attempt (``recorded``: its number and the argv orch launched) did not run
    ``cmd``; None if it did."""
    if recorded is None:
        return "its last attempt has no readable command record"
    n, argv = recorded
    if argv == cmd:
        return None
    return f"attempt {n} ran {_short(argv)}, this task runs {_short(cmd)}"


def params_difference(params: dict[str, Any], run_dir: Path, recorded: tuple[int, list[str]] | None) -> str | None:
    """Why the run dir's last attempt did not run this argument set (as ORCH_SWEEP_PARAMS carried it);
    None if it did. Compared as the JSON the task gets: 1 and 1.0, or true and 1, are other parameters."""
    if recorded is None:
        return "its last attempt has no readable command record"
    n = recorded[0]
    try:
        rec = protocol.read_json_bounded(protocol.attempt_dir(run_dir, n) / protocol.COMMAND_FILE, limit=1 << 20)
    except (OSError, ValueError):
        rec = None
    if not isinstance(rec, dict) or "sweep_params" not in rec:
        return f"attempt {n} recorded no sweep parameters, so they cannot be shown to be this task's"
    mine, theirs = (json.dumps(p, sort_keys=True, default=str) for p in (params, rec["sweep_params"]))
    if mine == theirs:
        return None
    return f"attempt {n} ran with the parameters {_clip(theirs)}, this task has {_clip(mine)}"


def _clip(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."


def _short(argv: list[str]) -> str:
    text = json.dumps(argv)
    return text if len(text) <= 200 else text[:197] + "..."


PARAMS_FILE_LIMIT = 64 << 20  # 100,000 argument sets of ~600 bytes


def parse_params_file(path: str) -> list[dict[str, Any]]:
    # A FIFO (or a device) as --from blocked `orch sweep` for ever (a hostile test): regular files only,
    # opened without blocking, size-capped.
    try:
        text = protocol.read_bounded(path, PARAMS_FILE_LIMIT, follow=True).decode()
    except protocol.BadRecord as e:  # "<name> is not a regular file": said of the path as given
        raise UsageError(f"--from {path} {str(e).removeprefix(Path(path).name + ' ')}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--from {path}: {getattr(e, 'strerror', None) or e}") from None
    return load_params(text, path)
