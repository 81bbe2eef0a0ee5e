"""What the step loop hands to ``finish``: its own module, so that ``loop`` (which calls ``finish``) and
``finish`` (which reads this) do not import each other (the finish <-> loop import cycle)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Trained:
    """Where the step loop ended (max_steps reached); what ``finish`` writes into result/."""

    step: int
    last_loss: float
    tok_s: float | None
    micro: int  # after any OOM shrink
    accum: int
    oom_events: tuple[dict[str, Any], ...]
    micro_batches_computed: int
