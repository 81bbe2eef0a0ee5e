"""examples/hf_train.py, except that in attempt 1 the 3rd optimizer.pt HF writes stops half way.

A stand-in for a kill -9 (or a node failure) in the middle of HF's checkpoint save: the file is
truncated to half its bytes, ``<run_dir>/in-save`` appears, and the process waits to be killed.
"""

import os
import runpy
import sys
import time
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hf_train.py"

if os.environ.get("ORCH_ATTEMPT") == "1":
    real_save, saves = torch.save, []

    def save_then_hang(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        if str(f).endswith("optimizer.pt"):
            saves.append(f)
            if len(saves) == 3:
                data = Path(f).read_bytes()
                Path(f).write_bytes(data[: len(data) // 2])
                Path(os.environ["ORCH_RUN_DIR"], "in-save").touch()
                time.sleep(120)

    torch.save = save_then_hang

sys.argv = [str(EXAMPLE), *sys.argv[1:]]
runpy.run_path(str(EXAMPLE), run_name="__main__")
