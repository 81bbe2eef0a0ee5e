"""The job side's ``... -- COMMAND`` argument parsing, shared by the wrapper and the per-rank parent (stdlib only:
both start once per attempt or rank and import nothing heavy)."""

from __future__ import annotations

import argparse


def parse_with_command(ap: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``ap``'s options, then ``command``: everything after them (after a ``--`` if given); none is an error."""
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    if a.command and a.command[0] == "--":
        a.command = a.command[1:]
    if not a.command:
        ap.error("no command given after --")
    return a
