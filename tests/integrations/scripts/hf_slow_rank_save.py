"""examples/hf_train.py, except that in attempt 1 rank 1's storage is slow: its ``rng_state_1.pth`` is written
only once rank 0's commit of that step appeared, or 5 s after it began, whichever comes first.

A stand-in for a rank that reaches HF's save later than rank 0 (HF's ``_save_checkpoint`` has no barrier
between the ranks' writes and ``on_save``): a commit that does not wait for every rank moves the
``checkpoint-N`` dir away before rank 1's file is in it.
"""

import os
import runpy
import sys
import time
from pathlib import Path

import torch

from orchestrator import protocol

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hf_train.py"
WAIT_S = 5.0

if os.environ.get("ORCH_ATTEMPT") == "1" and os.environ.get("RANK") == "1":
    real_save = torch.save

    def slow_rng_save(obj, f, *args, **kwargs):
        if str(f).endswith("rng_state_1.pth"):
            step = int(Path(f).parent.name.rsplit("-", 1)[1])
            committed = Path(os.environ["ORCH_RUN_DIR"], protocol.CHECKPOINTS_DIR, protocol.checkpoint_name(step))
            deadline = time.monotonic() + WAIT_S
            while not committed.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        real_save(obj, f, *args, **kwargs)

    torch.save = slow_rng_save

sys.argv = [str(EXAMPLE), *sys.argv[1:]]
runpy.run_path(str(EXAMPLE), run_name="__main__")
