"""The command line of a file generated from the code and checked in (``core/sqlitetext.py``,
``docs/reference/cli.md``): ``--write`` regenerates it, ``--check`` says whether it is stale. Each file's own test
regenerates and compares; this is how a person refreshes one after a change."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path


def write_or_check(argv: list[str], pages: Callable[[], dict[Path, str]], module: str) -> int:
    """``python -m <module> --write | --check`` of the files ``pages()`` generates (path -> text): 0 written or
    fresh, 1 stale, 2 usage."""
    if argv == ["--write"]:
        for target, text in pages().items():
            target.write_text(text)
        return 0
    if argv == ["--check"]:
        stale = [t for t, text in pages().items() if not t.exists() or t.read_text() != text]
        for target in stale:
            print(f"{target} is stale: run python -m {module} --write", file=sys.stderr)
        return 1 if stale else 0
    print(f"usage: python -m {module} --write | --check", file=sys.stderr)
    return 2
