"""RNG: what makes a resumed run draw the same dropout masks and shuffles as an uninterrupted one.

One format for every writer (the integrations and the bundled trainer): ``python``, ``torch``, ``cuda`` (one state
per device, when CUDA is in use) and ``numpy`` (when the program imported it). The bundled trainer wrote its own
before it used the kit's (``torch_cpu``, ``torch_cuda``); ``restore_rng`` reads those too, so its older checkpoints
still resume bit-exactly.
"""

from __future__ import annotations

import sys
from typing import Any

# The bundled trainer's own names, in checkpoints written before it used the kit's format -> the kit's.
OLDER_TRAINER_KEYS = {"torch_cpu": "torch", "torch_cuda": "cuda"}


# =========================================================================================
def capture_rng() -> dict[str, Any]:
    """Python, torch (CPU, CUDA) and, if already imported, numpy's global RNG states.

    Plain types and tensors only, so a ``torch.load(weights_only=True)`` reads them back.
    """
    import random

    import torch

    version, state, gauss = random.getstate()
    rng: dict[str, Any] = {"python": [version, list(state), gauss], "torch": torch.get_rng_state()}
    if torch.cuda.is_initialized():  # only a program that uses CUDA has device states (and the check is a flag)
        rng["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        rng["numpy"] = [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng`, for a state as captured, as loaded back from ``rng.pt``, or as the bundled
    trainer wrote it before it used this format."""
    import random

    import torch

    rng = {OLDER_TRAINER_KEYS.get(k, k): v for k, v in rng.items()}
    version, state, gauss = rng["python"]
    random.setstate((version, tuple(state), gauss))
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    if "numpy" in rng:
        import numpy as np

        kind, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


