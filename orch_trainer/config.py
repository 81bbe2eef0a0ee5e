"""Command line of ``python -m orch_trainer``: every check that needs only the arguments runs here.

Lesson 2 (seed 000): a check that needs only the arguments must fail at parse time, before any
directory, file or model exists — ``ap.error`` exits 2 and nothing is written. The argparse ``dest``
names are the keys of ``run_config.json`` (contract), so rename a flag only everywhere at once.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from orch_trainer.faults import FaultSpec, parse_fault
from orchestrator import protocol

# Preset names (trainer.model.PRESETS holds their shapes); listed here so that argument parsing and
# the "already complete" check run without importing torch.
PRESET_NAMES = ("tiny",)

EPILOG = f"""\
exit codes:
  {protocol.EXIT_OK}    finished: result/ written, done.json verified; or "already complete" (nothing written)
  1    unexpected crash (traceback on stderr; failure.json class "crash" when it could be written)
  {protocol.EXIT_USAGE}    usage error: argument checks failed, nothing written
  {protocol.EXIT_FAILURE_REPORTED}    failure classified in attempts/<n>/failure.json (oom, nan, enospc...)
  {protocol.EXIT_PREEMPTED}  preempted by SIGTERM/SIGUSR2: checkpoint of the last completed step saved,
       failure.json class "preempted"

environment: ORCH_RUN_DIR (default of --run-dir), ORCH_ATTEMPT (attempt number, default 1),
ORCH_JOB_NAME (job name in done.json, default: the run dir's name), ORCH_OVERRIDES (JSON: what orch's
policy changed for this attempt -- resume, lr, skip_batches, micro_batch_size -- over the flags).

fault injection: --inject-fault KIND@step=N, KIND in oom nan enospc sigterm sigkill hang crash;
each fires at most once per run dir (recorded in {protocol.FAULTS_FIRED}).

subcommand: python -m orch_trainer scan-data PATH [--json]   report lines the loader would skip
"""


def _int_at_least(lo: int) -> type:
    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v
    conv.__name__ = f"int>={lo}"
    return conv  # type: ignore[return-value]


def _save_interval(pos1: type) -> type:
    """``auto`` or an integer >= 1."""
    def conv(text: str) -> int | str:
        return "auto" if text == "auto" else pos1(text)
    return conv


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0 or v == float("inf"):  # also refuses nan: nan > 0 is False
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


def _nonnegative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= v <= 3600:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be 0..3600, got {text}")
    return v


def _fault(text: str) -> FaultSpec:
    try:
        return parse_fault(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m orch_trainer",
        description="Tiny char-level transformer trainer with crash-safe checkpoints, exact resume, "
                    "preemption, in-process OOM recovery and NaN detection.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Ranges are argument-only checks (lesson 2): "--max-steps 0" would write a verified done.json
    # for a run that trained nothing, "--keep-last-k 0" would prune every checkpoint it commits, and a
    # negative or NaN LR only shows up as a NaN many steps in.
    pos1, pos0 = _int_at_least(1), _int_at_least(0)
    ap.add_argument("--run-dir", default=os.environ.get(protocol.ENV_RUN_DIR),
                    help="run directory (default: $ORCH_RUN_DIR)")
    ap.add_argument("--preset", choices=PRESET_NAMES, default="tiny")
    ap.add_argument("--data", default=None, metavar="PATH",
                    help="text corpus (default: a small generated one); unusable lines are skipped, counted")
    ap.add_argument("--max-steps", type=pos1, default=60)
    ap.add_argument("--batch-size", type=pos1, default=8, help="effective batch (samples per optimizer step)")
    ap.add_argument("--micro-batch-size", type=pos1, default=None,
                    help="samples per forward/backward on each rank (default: the batch size over the ranks); "
                         "times the ranks it must divide --batch-size")
    ap.add_argument("--lr", type=_positive_float, default=1e-3)
    ap.add_argument("--warmup-steps", type=pos0, default=5)
    ap.add_argument("--save-interval", type=_save_interval(pos1), default=10, metavar="N|auto",
                    help="checkpoint every N optimizer steps; auto: at Daly's interval for the measured save cost "
                         "and the MTBF orch hands the job (ORCH_MTBF_S; README: Checkpoint interval)")
    ap.add_argument("--keep-last-k", type=pos1, default=3)
    ap.add_argument("--seed", type=pos0, default=0)
    ap.add_argument("--resume", default="auto", metavar="auto|none|PATH",
                    help="auto: newest verified checkpoint (corrupt ones are skipped and reported); "
                         "none: fresh start; PATH: that checkpoint dir (relative to the run dir or cwd)")
    ap.add_argument("--skip-batches", type=pos0, default=0,
                    help="absolute data offset: step s trains on batch s+N (set by the NaN rollback policy)")
    ap.add_argument("--lora-rank", type=pos0, default=0,
                    help="train LoRA adapters of rank R (0: full training)")
    ap.add_argument("--save-fork-checkpoint", action="store_true",
                    help="also write result/checkpoints/step-N/ (a full checkpoint, listed in done.json) "
                         "that other runs can --resume from")
    # Malformed fault specs are refused here: a typo ("oom@5") that silently injected nothing would
    # make a recovery test pass without the recovery ever running.
    ap.add_argument("--inject-fault", type=_fault, action="append", default=[], metavar="KIND@step=N")
    ap.add_argument("--allow-batch-change", action="store_true",
                    help="resume even if the checkpoint's effective batch differs")
    ap.add_argument("--allow-data-change", action="store_true",
                    help="resume even if the corpus sha256 differs from the checkpoint's")
    ap.add_argument("--fsdp", action="store_true",
                    help="with several ranks: shard the model and optimizer over them (FSDP2, fully_shard) and "
                         "checkpoint them through torch.distributed.checkpoint (default: DDP, replicated)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--threads", type=pos1, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--background-save", action=argparse.BooleanOptionalAction, default=True,
                    help="write periodic checkpoints in a worker thread (default: on)")
    ap.add_argument("--sleep-per-step", type=_nonnegative_float, default=0.0, metavar="SECONDS",
                    help="sleep this long after each step: stands in for a slower model (tests and benchmarks that "
                         "must outlast a scheduler's delay, whatever this machine's speed)")
    ap.add_argument("--log-interval", type=pos1, default=10)
    ap.add_argument("--heartbeat-interval", type=_positive_float, default=2.0, metavar="SECONDS")
    return ap


def _world(env: Mapping[str, str]) -> int:
    """WORLD_SIZE as torchrun set it, 1 when unset or not a positive integer (ranks.refusal names that)."""
    raw = env.get("WORLD_SIZE", "1").strip()
    return int(raw) if raw.isdigit() and int(raw) >= 1 else 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and run the argument-only checks; on failure argparse prints usage and exits 2."""
    ap = build_parser()
    args = ap.parse_args(argv)
    # Without a run dir there is nowhere to checkpoint or report; refuse before touching anything.
    if not args.run_dir:
        ap.error("--run-dir is required (or set ORCH_RUN_DIR)")
    if args.micro_batch_size is None:
        # The global batch split over the ranks torchrun started (the README's multi-rank command was
        # `invalid` at once, the default micro-batch being the whole global batch on every rank); a world that
        # does not divide it is refused before the process group starts (ranks.refusal says how to set it).
        world = _world(os.environ)
        args.micro_batch_size = args.batch_size // world if args.batch_size % world == 0 else args.batch_size
    # Gradient accumulation needs whole micro-batches: 10 samples in micro-batches of 4 would
    # silently train on 8 (or 12) and change the effective batch the loss curve is compared on.
    if args.micro_batch_size > args.batch_size or args.batch_size % args.micro_batch_size:
        ap.error(f"--batch-size {args.batch_size} must be a multiple of "
                 f"--micro-batch-size {args.micro_batch_size}")
    # A fork checkpoint pairs the full weights with the optimizer state; under LoRA the optimizer
    # holds only the adapters' moments, so a run forked from it would silently restart the base
    # weights' optimizer from zero. Refused here, at no cost, instead of after the whole run.
    if args.lora_rank and args.save_fork_checkpoint:
        ap.error("--lora-rank and --save-fork-checkpoint cannot be used together: a fork checkpoint needs "
                 "optimizer state for every weight, LoRA trains only the adapters")
    # FSDP shards the weights: a fork checkpoint (full weights beside the optimizer, written by rank 0 alone) and
    # LoRA's frozen base weights in the same shards are not built for it.
    if args.fsdp and (args.lora_rank or args.save_fork_checkpoint):
        ap.error("--fsdp cannot be used with --lora-rank or --save-fork-checkpoint")
    # "auto"/"none" or a path; an empty string (an unset shell variable) is a usage error, not a path.
    if not args.resume.strip():
        ap.error("--resume must be auto, none or a checkpoint path")
    return args


# What orch's policy may change for an attempt (ORCH_OVERRIDES) and how each value is checked: the policy
# reaches the bundled trainer as it reaches any program, never as flags appended to its argv.
_OVERRIDES = {"resume": lambda v: isinstance(v, str) and bool(v.strip()),
              "lr": lambda v: protocol.finite_number(v) is not None and v > 0,
              "skip_batches": lambda v: protocol.is_int(v, 0),
              "micro_batch_size": lambda v: protocol.is_int(v, 1)}


def apply_overrides(args: argparse.Namespace, raw: str | None) -> list[str]:
    """Apply ``ORCH_OVERRIDES`` over the parsed flags (the policy's word wins, as a later flag would);
    returns what was ignored and why (a value of the wrong type, a micro-batch that does not divide)."""
    import json

    ignored: list[str] = []
    try:
        overrides = json.loads(raw) if raw else {}
    except ValueError:
        return [f"{protocol.ENV_OVERRIDES} is not JSON"]
    if not isinstance(overrides, dict):
        return [f"{protocol.ENV_OVERRIDES} is not a JSON object"]
    for key, check in _OVERRIDES.items():
        if key not in overrides:
            continue
        value = overrides[key]
        if not check(value) or (key == "micro_batch_size" and args.batch_size % value):
            ignored.append(f"{key}={value!r}")
            continue
        setattr(args, key, float(value) if key == "lr" else value)
    return ignored


def run_config(args: argparse.Namespace) -> dict:
    """The effective configuration: every argparse dest with its effective value (run_config.json)."""
    cfg = dict(vars(args))
    cfg["inject_fault"] = [str(f) for f in args.inject_fault]
    return cfg

