"""The program P7d's real run submits to orch: the bundled trainer, unchanged, with two costs made visible.

``python bench/_interval_job.py --save-s C --step-s T -- <orch_trainer flags>`` runs ``orch_trainer``'s own
``main()`` in this process (the entry point its tests drive) with a boundary hook that

* paces each optimizer step to at least ``T`` seconds (a sleep tops up the tiny model's ~15 ms of compute:
  a step that mostly sleeps keeps its length when other work shares the 2 cores), and
* adds ``C`` seconds to every checkpoint save, inside the checkpoint writer's write hook (a bigger model's
  write): with ``--no-background-save`` the loop waits for it, so ``--save-interval auto`` measures it as its
  save cost and orch's goodput accounting counts it as save stall.

``--mtbf-s M`` replaces the ``ORCH_MTBF_S`` orch handed the attempt with M (the bench's 1/λ: orch's own
estimate starts at its 24 h prior and would need days of such kills to come down to seconds); what orch
handed is kept in ``ORCH_MTBF_SOURCE``, which the trainer logs.

Everything else is the real trainer under orch: its heartbeats, checkpoints, resume, run_config.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orch_trainer.__main__ import main as trainer_main
from orchestrator.kit.interval import ENV_MTBF, ENV_MTBF_SOURCE


def pacing_hook(step_s: float, save_s: float) -> Any:
    """The boundary hook: installs the slow write on the first call, then paces every step's first micro-batch."""
    last = [time.monotonic()]
    slowed: set[int] = set()

    def hook(trainer: Any, step: int, micro: int) -> None:
        if trainer.ckpts.write_hook is None or getattr(trainer.ckpts.write_hook, "_p7", False) is False:
            inner = trainer.ckpts.write_hook

            def slow(save_step: int, path: str) -> None:
                if save_step not in slowed:  # once per save: the hook runs for every file it writes
                    slowed.add(save_step)
                    time.sleep(save_s)
                if inner is not None:
                    inner(save_step, path)
            slow._p7 = True  # type: ignore[attr-defined]
            trainer.ckpts.write_hook = slow
        if micro == 0:
            now = time.monotonic()
            if now - last[0] < step_s:
                time.sleep(step_s - (now - last[0]))
            last[0] = time.monotonic()

    return hook


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save-s", type=float, required=True, help="seconds added to every checkpoint save")
    ap.add_argument("--step-s", type=float, required=True, help="each optimizer step takes at least this long")
    ap.add_argument("--mtbf-s", type=float, default=None, help="the M --save-interval auto is given")
    ap.add_argument("trainer_args", nargs=argparse.REMAINDER, help="-- then the orch_trainer flags")
    a = ap.parse_args(argv)
    if a.mtbf_s is not None:
        handed = os.environ.get(ENV_MTBF, "none")
        os.environ[ENV_MTBF] = f"{a.mtbf_s:g}"
        os.environ[ENV_MTBF_SOURCE] = f"P7d bench: 1/λ (orch handed {handed})"
    rest = a.trainer_args[1:] if a.trainer_args[:1] == ["--"] else a.trainer_args
    return trainer_main(rest, boundary_hook=pacing_hook(a.step_s, a.save_s))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
