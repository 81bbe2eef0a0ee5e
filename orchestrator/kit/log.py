"""The kit's one line of output: stderr, prefixed, flushed (it lands in attempts/<n>/stderr.log)."""

from __future__ import annotations

import sys


def log(msg: str) -> None:
    print(f"[orch] {msg}", file=sys.stderr, flush=True)
