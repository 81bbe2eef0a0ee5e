"""The exception that unwinds the trainer to ``Trainer.run`` with an exit code, on every rank.

A module of its own: ``Attempt.fail`` raises it and ``ranks.Ranks.rank0_decides`` carries it from rank 0 to the
others, and ``attempt`` imports ``ranks`` (through ``runfiles``).
"""

from __future__ import annotations


class TrainerExit(Exception):
    """Unwind to ``Trainer.run`` with an exit code; the failure (if any) is already reported."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code
