"""examples/lightning_train.py with one EIO in the checkpoint write of step ``$EIO_STEP`` in attempt 1: the storage
fault (a network filesystem's EIO on one write, every earlier checkpoint intact)."""

import errno
import os
import sys
from pathlib import Path

import lightning.pytorch as L

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import lightning_train

STEP = int(os.environ["EIO_STEP"])
_real = L.Trainer.save_checkpoint


def save_checkpoint(self: L.Trainer, filepath: object, *args: object, **kwargs: object) -> None:
    if os.environ.get("ORCH_ATTEMPT") == "1" and self.global_step == STEP and str(filepath) != os.devnull:
        raise OSError(errno.EIO, f"injected: EIO writing {filepath}")
    _real(self, filepath, *args, **kwargs)


L.Trainer.save_checkpoint = save_checkpoint
lightning_train.main()
