"""orch's job wrapper: runs one attempt of a user's command and records how it ended.

Run as ``python -m orchestrator.wrapper --run-dir D --job J --attempt N --token T [--outputs G]... -- CMD``
on the compute node (Slurm) or detached on this machine (local backend). Stdlib + protocol only,
so it starts fast and works in any environment that can import the package.

Why a wrapper: the scheduler knows an exit code; orch also needs the command's stdout/stderr in the
attempt dir, SIGTERM/SIGUSR2 forwarded (submitit's job process ignores SIGTERM, so a trainer that
must checkpoint on preemption needs the signal delivered), a record of the exit that survives the
submitter (``exit.json``), and for ``--outputs`` jobs a done marker written only after exit 0.
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator import protocol

FORWARDED = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT, signal.SIGUSR1)
WRAPPER_FILE = "wrapper.json"


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="orchestrator.wrapper")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--attempt", type=int, required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--outputs", action="append", default=[])
    ap.add_argument("--time-limit", type=float, default=None,
                    help="seconds; SIGTERM then, SIGKILL after --kill-grace (the local backend's time limit)")
    ap.add_argument("--kill-grace", type=float, default=30.0)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    if a.command and a.command[0] == "--":
        a.command = a.command[1:]
    if not a.command:
        ap.error("no command given after --")
    return a


def stable_run_id(run_dir: str, job: str) -> str:
    """One id per run dir for experiment trackers, so attempts continue one curve."""
    return protocol.stable_run_id(run_dir, job)


def write_outputs_marker(run_dir: Path, job: str, attempt: int, patterns: list[str]) -> str | None:
    """Write done.json over the files matching ``patterns`` (relative to the run dir); None or why not."""
    rels: set[str] = set()
    for pat in patterns:
        for hit in glob.glob(pat, root_dir=run_dir, recursive=True):
            p = run_dir / hit
            if p.is_file() and not p.is_symlink():
                rels.add(os.path.normpath(hit))
    if not rels:
        return f"--outputs {patterns} matched no file"
    try:
        protocol.write_done_marker(run_dir, job, attempt, sorted(rels))
    except (OSError, ValueError) as e:
        return f"could not write {protocol.DONE_MARKER}: {e}"
    return None


def main(argv: list[str] | None = None) -> int:
    a = _parse(sys.argv[1:] if argv is None else argv)
    run_dir = Path(a.run_dir)
    adir = protocol.attempt_dir(run_dir, a.attempt)
    adir.mkdir(parents=True, exist_ok=True)
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    protocol.set_aside(adir / protocol.EXIT_FILE)

    env = dict(os.environ)
    env.update(protocol.job_env(run_dir, a.job, a.attempt, token=a.token))
    if protocol.ENV_OVERRIDES in os.environ:  # the backend passed the policy's overrides
        env[protocol.ENV_OVERRIDES] = os.environ[protocol.ENV_OVERRIDES]
    env.setdefault("WANDB_RUN_ID", env[protocol.ENV_RUN_ID])
    env.setdefault("WANDB_RESUME", "allow")

    with open(adir / "stdout.log", "ab") as out, open(adir / "stderr.log", "ab") as err:
        try:
            child = subprocess.Popen(a.command, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                     env=env, cwd=str(run_dir))
        except OSError as e:  # command not found / not executable: the job's own fault, recorded
            err.write(f"orch wrapper: cannot start {a.command[0]!r}: {e}\n".encode())
            protocol.atomic_write_json(adir / protocol.EXIT_FILE, {
                "returncode": 127, "signal": None, "error": str(e), "ended_at": protocol.now_iso(),
                "restart_count": restart, "token": a.token})
            return 127
        protocol.atomic_write_json(adir / WRAPPER_FILE, {
            "token": a.token, "pid": os.getpid(), "child_pid": child.pid, "host": os.uname().nodename,
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "restart_count": restart,
            "command": a.command, "started_at": protocol.now_iso()})

        def forward(signum: int, _frame: object) -> None:
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

        under_slurm = "SLURM_JOB_ID" in os.environ
        for s in FORWARDED:
            if under_slurm and s in (signal.SIGTERM, signal.SIGINT):
                # Slurm signals every process of the job itself (preemption, scancel, time limit);
                # forwarding again would hit a program twice (measured: one that exits in its
                # handler died of the second TERM). Only the batch-shell signals (--signal=B:USR2)
                # need forwarding; the wrapper just survives to write exit.json.
                signal.signal(s, lambda *_: None)
            else:
                signal.signal(s, forward)
        timed_out = False
        deadline = time.monotonic() + a.time_limit if a.time_limit else None
        while True:
            try:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                rc = child.wait(timeout=timeout)
                break
            except subprocess.TimeoutExpired:
                # Same lifecycle as a Slurm time limit: SIGTERM (the job checkpoints), SIGKILL after a grace.
                if not timed_out:
                    timed_out = True
                    child.send_signal(signal.SIGTERM)
                    deadline = time.monotonic() + a.kill_grace
                else:
                    child.kill()
                    deadline = None

    sig = -rc if rc < 0 else None
    record: dict[str, object] = {"returncode": rc, "signal": sig, "ended_at": protocol.now_iso(),
                                 "restart_count": restart, "token": a.token, "time": time.time(),
                                 "time_limit_reached": timed_out}
    if rc == 0 and a.outputs:
        problem = write_outputs_marker(run_dir, a.job, a.attempt, a.outputs)
        if problem:
            record["marker_error"] = problem
    protocol.atomic_write_json(adir / protocol.EXIT_FILE, record)
    return 128 + sig if sig else rc


def read_exit(attempt_dir: Path) -> dict | None:
    """The wrapper's exit record, or None if absent or unreadable."""
    try:
        r = protocol.read_json_bounded(attempt_dir / protocol.EXIT_FILE, limit=64 * 1024)
    except (OSError, ValueError):
        return None
    return r if isinstance(r, dict) else None


if __name__ == "__main__":
    sys.exit(main())
