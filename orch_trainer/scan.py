"""``python -m orch_trainer scan-data PATH``: list the corpus lines the loader would skip, with line numbers.

The runbook's bad-data hunt (seed 002, example 5) as a command: NaN that keeps coming back after a
rollback is often one absurdly long or undecodable line. Uses the loader's own predicate
(``trainer.data.bad_line_reason``), so what it reports is exactly what training skips.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from orch_trainer.data import MAX_LINE_CHARS, iter_bad_lines


def main(argv: Sequence[str]) -> int:
    """Exit 0: no bad lines; 1: bad lines found (listed); 2: usage error or unreadable file."""
    ap = argparse.ArgumentParser(prog="python -m orch_trainer scan-data",
                                 description="Report corpus lines that fail to encode or are absurdly long.",
                                 epilog="exit codes: 0 clean, 1 bad lines found, 2 usage / unreadable file")
    ap.add_argument("path")
    ap.add_argument("--max-line-chars", type=int, default=MAX_LINE_CHARS)
    ap.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    ap.add_argument("--limit", type=int, default=1000, help="list at most this many lines (all are counted)")
    args = ap.parse_args(argv)
    try:
        data = Path(args.path).read_bytes()
    except OSError as e:
        print(f"scan-data: cannot read {args.path}: {e}", file=sys.stderr)
        return 2
    n_lines = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    bad = [(n, why) for n, why in iter_bad_lines(data, args.max_line_chars) if n <= n_lines]
    if args.json:
        print(json.dumps({"path": args.path, "lines": n_lines, "bad": len(bad),
                          "bad_lines": [{"line": n, "reason": why} for n, why in bad[:args.limit]]}))
    else:
        for n, why in bad[:args.limit]:
            print(f"{args.path}:{n}: {why}")
        unlisted = len(bad) - args.limit
        print(f"{n_lines} lines, {len(bad)} bad" + (f" ({unlisted} not listed)" if unlisted > 0 else ""))
    return 1 if bad else 0
