"""RNG: what makes a resumed run draw the same dropout masks and shuffles as an uninterrupted one."""

from __future__ import annotations

import sys
from typing import Any


# =========================================================================================
def capture_rng() -> dict[str, Any]:
    """Python, torch (CPU, CUDA) and, if already imported, numpy's global RNG states.

    Plain types and tensors only, so a ``torch.load(weights_only=True)`` reads them back.
    """
    import random

    import torch

    version, state, gauss = random.getstate()
    rng: dict[str, Any] = {"python": [version, list(state), gauss], "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        rng["numpy"] = [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    import random

    import torch

    version, state, gauss = rng["python"]
    random.setstate((version, tuple(state), gauss))
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    if "numpy" in rng:
        import numpy as np

        kind, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


