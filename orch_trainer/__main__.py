"""``python -m orch_trainer``: the bundled trainer (see ``--help`` for flags and exit codes).

Order of work, cheapest first (lesson 2, seed 000):
1. the preemption handler is installed first thing in ``main()``, before torch is imported (a
   SIGTERM during the ~1.5 s torch import must still end as "preempted", not as a bare kill);
2. argument checks (argparse, exit 2, nothing written; under orch the attempt's failure.json says
   ``invalid``, so orch knows that retrying the same arguments cannot help);
3. the completion predicate: a verified done.json means "already complete", exit 0, nothing written;
4. only then command.json, torch, the filesystem checks, the model, training.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path

from orch_trainer import runfiles
from orch_trainer.config import apply_overrides, build_parser, parse_args
from orch_trainer.ranks import Ranks

# Everything imported here is stdlib-only (no torch): argument errors and "already complete" are fast.
from orchestrator import protocol
from orchestrator.kit.preemption import PreemptionFlag


def main(argv: Sequence[str] | None = None, *, preemption: PreemptionFlag | None = None,
         boundary_hook: object = None) -> int:
    """Run one attempt; returns the exit code.

    ``preemption`` and ``boundary_hook`` let tests drive it in-process (see ``trainer.loop.BoundaryHook``).
    """
    own_flag = preemption is None
    flag = PreemptionFlag().install() if preemption is None else preemption
    try:
        return _main(list(sys.argv[1:] if argv is None else argv), flag, boundary_hook)
    finally:
        if own_flag:
            flag.uninstall()


def _main(argv: list[str], flag: PreemptionFlag, boundary_hook: object) -> int:
    if argv[:1] == ["scan-data"]:
        from orch_trainer.scan import main as scan_main
        return scan_main(argv[1:])
    try:
        return _attempt(argv, flag, boundary_hook)
    except SystemExit as e:
        if e.code == protocol.EXIT_USAGE:
            _report_usage_error()
        raise


def _report_usage_error() -> None:
    """Under orch (its wrapper made the attempt dir), say that this exit 2 is a usage error: orch
    classifies an exit 2 as ``invalid`` only from the program's own report, never from its argv."""
    run_dir, attempt = os.environ.get(protocol.ENV_RUN_DIR), os.environ.get(protocol.ENV_ATTEMPT, "")
    if not run_dir or not attempt.isdigit() or not protocol.attempt_dir(run_dir, int(attempt)).is_dir():
        return  # not under orch: nothing is written
    runfiles.report_failure(Path(run_dir), int(attempt), "invalid", None,
                            "usage error: the arguments were refused (see stderr.log); retrying cannot help")


def _attempt(argv: list[str], flag: PreemptionFlag, boundary_hook: object) -> int:
    args = parse_args(argv)
    for what in apply_overrides(args, os.environ.get(protocol.ENV_OVERRIDES)):
        runfiles.log(f"ignored override {what}")
    run_dir = Path(args.run_dir).absolute()
    args.run_dir = str(run_dir)
    # The one completion predicate, before anything is written: a verified run is never redone or
    # touched. "Directory is non-empty" would be true after any failure (the seed 000 deadlock).
    v = protocol.verify_done_marker(run_dir)
    if v.verified:
        m = v.marker or {}
        print(f"already complete: {run_dir} (job {m.get('job')}, attempt {m.get('attempt')}); "
              "nothing written")
        return protocol.EXIT_OK
    # A symlinked run dir could point anywhere; orch refuses it and so does the trainer (nothing written).
    if run_dir.is_symlink() or (run_dir.exists() and not run_dir.is_dir()):
        build_parser().error(f"--run-dir {run_dir} is a symlink or not a directory")
    raw_attempt = os.environ.get(protocol.ENV_ATTEMPT, "1")
    if not raw_attempt.isdigit() or int(raw_attempt) < 1:
        build_parser().error(f"{protocol.ENV_ATTEMPT}={raw_attempt!r}: attempts are numbered from 1")
    attempt = int(raw_attempt)
    job = os.environ.get(protocol.ENV_JOB_NAME) or run_dir.name
    # torch is an extra (a login node installs orch without it): say so before anything is written.
    if importlib.util.find_spec("torch") is None:
        build_parser().error("torch is not installed in this environment: pip install 'orch[trainer]'")

    protocol.attempt_dir(run_dir, attempt).mkdir(parents=True, exist_ok=True)
    ranks = Ranks.from_env()
    if ranks.is_writer:  # the attempt's own files: rank 0's alone (two ranks raced on program.json)
        stale = runfiles.set_aside_stale_failure(run_dir, attempt)
        if stale is not None:
            runfiles.log(f"attempt {attempt} restarted in place: previous failure.json kept as {stale.name}")
        runfiles.write_program(run_dir, attempt, argv, dict(os.environ))

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy: noise
    from orch_trainer.loop import Trainer

    trainer = None
    try:
        trainer = Trainer(args, run_dir, attempt, job, flag, boundary_hook)  # type: ignore[arg-type]
        return trainer.run()
    except Exception as e:
        # Unexpected: keep the traceback (exit 1) but also classify, so the orchestrator need not guess.
        step = trainer.step if trainer is not None else None
        if ranks.multi:
            # The kit's account of a rank's crash: its own file, or `killed` when a collective lost a peer
            from orchestrator.kit.run import Run

            Run(run_dir, job, attempt, is_writer=ranks.is_writer).crashed(
                step, e, traceback.format_exc()[-1800:], rank=ranks.rank, world=ranks.world)
        else:
            runfiles.report_failure(run_dir, attempt, "crash", step, traceback.format_exc()[-1800:])
        raise


def exit_now(code: int | None) -> None:
    """End the process with ``code`` (None: 0, as sys.exit) once the attempt returned, skipping interpreter
    finalization.

    Everything the attempt owes is written and fsynced by then (its checkpoints, result/, complete.json or
    failure.json), and the process group is destroyed. What finalization still tears down (torch's and gloo's
    threads) aborted a rank now and then after a 2-rank run completed ("terminate called without an active
    exception", SIGABRT): torchrun then exited 1 and a finished run was classed ``crash``, waiting for a person.
    What finalization does first is kept: a thread still running (a background checkpoint save on an OOM's
    way out) is waited for, as the interpreter would.
    """
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon and thread.is_alive():
            thread.join()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code or 0)


if __name__ == "__main__":
    from orchestrator import testhooks

    testhooks.abort_at_exit("trainer_exit")
    exit_now(main())
