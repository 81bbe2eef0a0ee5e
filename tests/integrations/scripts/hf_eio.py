"""examples/hf_train.py, except that in attempt 1 HF's 2nd optimizer.pt write fails with EIO: the storage fault
(one EIO of a network filesystem; the checkpoint before it intact)."""

import errno
import os
import runpy
import sys
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hf_train.py"

if os.environ.get("ORCH_ATTEMPT") == "1":
    real_save, saves = torch.save, []

    def save_or_eio(obj, f, *args, **kwargs):
        if str(f).endswith("optimizer.pt"):
            saves.append(f)
            if len(saves) == 2:
                raise OSError(errno.EIO, f"injected: EIO writing {f}")
        return real_save(obj, f, *args, **kwargs)

    torch.save = save_or_eio

sys.argv = [str(EXAMPLE), *sys.argv[1:]]
runpy.run_path(str(EXAMPLE), run_name="__main__")
