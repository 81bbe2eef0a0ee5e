"""examples/hf_train.py, except that in attempt 1 rank 1 announces when it reaches ``OrchCallback.on_train_end``
(after the last step's stop agreement) by creating ``<run dir>/rank1-at-train-end``, and waits there (at most
60 s) for a stop signal: a SIGTERM that reaches one rank only, after the last step.
"""

import os
import runpy
import sys
import time
from pathlib import Path

from orchestrator.integrations import hf

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hf_train.py"
MARK = "rank1-at-train-end"

if os.environ.get("ORCH_ATTEMPT") == "1" and os.environ.get("RANK") == "1":
    real_on_train_end = hf.OrchCallback.on_train_end

    def on_train_end(self, args, state, control, **kwargs):  # HF's signature
        Path(os.environ["ORCH_RUN_DIR"], MARK).touch()
        deadline = time.monotonic() + 60
        while not self.flag.requested and time.monotonic() < deadline:
            time.sleep(0.01)
        return real_on_train_end(self, args, state, control, **kwargs)

    hf.OrchCallback.on_train_end = on_train_end

sys.argv = [str(EXAMPLE), *sys.argv[1:]]
runpy.run_path(str(EXAMPLE), run_name="__main__")
