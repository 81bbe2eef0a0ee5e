"""The reference pages of the docs, generated from the code itself: the CLI (each click command's ``--help``), every
``orch.toml`` setting (``core/settings.py``), every environment variable (``orchestrator/envvars.py``), every exit
code (``orchestrator/exitcodes.py``) and the kit's API (``cli/apiref.py``).

A hand-written list drifts the day an option, a setting or a variable is added; these pages are rendered from the
declarations the code runs on. ``tests/unit/test_docs.py`` regenerates them and compares, as ``docs/lifecycle.md``
is checked.

    python -m orchestrator.cli.reference --write    # regenerate docs/reference/{cli,settings,environment,...}.md
    python -m orchestrator.cli.reference --check    # exit 1 if one is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from orchestrator.core.generated import write_or_check

PAGES = Path(__file__).resolve().parents[2] / "docs" / "reference"
TARGET = PAGES / "cli.md"
WIDTH = 100  # the help text's width: fixed, so the page does not depend on the terminal that generated it
STAMP = "generated from the code by `python -m orchestrator.cli.reference --write` (a test fails when it is stale)"


def _help(command: click.Command, name: str, parent: click.Context | None) -> str:
    ctx = click.Context(command, info_name=name, parent=parent, terminal_width=WIDTH, max_content_width=WIDTH,
                        **command.context_settings)  # -h as well as --help, as the command itself takes them
    return command.get_help(ctx)


def commands() -> list[str]:
    """Every command's name, as ``orch --help`` lists them."""
    from orchestrator.cli import main

    ctx = click.Context(main, info_name="orch")
    return list(main.list_commands(ctx))


def generate() -> str:
    """The text of ``docs/reference/cli.md``."""
    from orchestrator.cli import main

    root = click.Context(main, info_name="orch", terminal_width=WIDTH, max_content_width=WIDTH, **main.context_settings)
    out = ["# The CLI", "", f"Every command's `--help`, {STAMP}. What the exit codes and the job's environment mean: "
           "[Commands](commands.md).", "", "```", _help(main, "orch", None), "```"]
    for name in commands():
        command = main.get_command(root, name)
        assert command is not None, name
        out += ["", f"## orch {name}", "", "```", _help(command, name, root), "```"]
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def settings_page() -> str:
    """The text of ``docs/reference/settings.md``: every key orch.toml takes, table by table."""
    from orchestrator.core.config import AUTO_REQUEUE, CLASS_CAPS, UNCOUNTED
    from orchestrator.core.settings import KNOWN_KEYS, NUMERIC, OTHER

    from_classes = {("policy", "auto_requeue"): ", ".join(sorted(AUTO_REQUEUE)),
                    ("policy", "uncounted"): ", ".join(sorted(UNCOUNTED)),
                    ("policy", "caps"): ", ".join(f"{c} {n}" for c, n in sorted(CLASS_CAPS.items()))}
    out = ["# orch.toml settings", "",
           f"Every key `$ORCH_HOME/orch.toml` takes, {STAMP}. An unknown table, a misspelt key or a value out of "
           "its bounds is a usage error (exit 2) naming the key; the numeric settings and `--max-attempts` are "
           "checked against the same declaration (`orchestrator/core/settings.py`). What the policy's classes "
           "mean: [Failure classes and policy](../concepts/failures.md).", ""]
    for table in KNOWN_KEYS:
        out += [f"## [{table}]", "", "| key | takes | default | what |", "|---|---|---|---|"]
        for s in NUMERIC:
            if s.table == table:
                takes = f"{'an integer' if s.kind is int else 'a number'} {_number(s.lo)}..{_number(s.hi)}"
                out.append(f"| `{s.key}` | {takes} | `{_number(s.default)}` | {_cell(s.help)} |")
        for o in OTHER:
            if o.table == table:
                default = from_classes.get((o.table, o.key), o.default)
                out.append(f"| `{o.key}` | {_cell(o.takes)} | {_cell(default)} | {_cell(o.help)} |")
        out.append("")
    return "\n".join(out)


def environment_page() -> str:
    """The text of ``docs/reference/environment.md``: every variable orch sets or reads, by who reads it."""
    from orchestrator.envvars import GROUPS, VARIABLES

    out = ["# Environment variables", "",
           f"Every variable orch sets for a job or reads itself, {STAMP}; a test fails when the source uses an "
           "`ORCH_*` name this page lacks.", ""]
    for group, title in GROUPS.items():
        out += [f"## {title}", "", "| variable | default | what |", "|---|---|---|"]
        out += [f"| `{v.name}` | {_cell(v.default) if v.default else '-'} | {_cell(v.meaning)} |"
                for v in VARIABLES if v.group == group]
        out.append("")
    return "\n".join(out)


def exit_codes_page() -> str:
    """The text of ``docs/reference/exit-codes.md``: every exit code, by the program that gives it."""
    from orchestrator import exitcodes

    lines = ["# Exit codes", "", "<!-- Generated from orchestrator/exitcodes.py by `python -m "
             "orchestrator.cli.reference --write`; do not edit. -->", "",
             "A script can rely on these: each is checked against the code that gives it. A job's own program exits "
             "as it likes; orch classifies its end from its records first ([Failure classes and "
             "policy](../concepts/failures.md)).", ""]
    for program, title in exitcodes.PROGRAMS.items():
        lines += [f"## {title}", "", "| code | meaning |", "|---|---|"]
        lines += [f"| **{c.code}** | {_cell(c.meaning)} |" for c in exitcodes.CODES if c.program == program]
        lines.append("")
    return "\n".join(lines)


def pages() -> dict[Path, str]:
    """Every reference page this module generates: path -> text."""
    from orchestrator.cli.apiref import api_page

    return {TARGET: generate(), PAGES / "settings.md": settings_page(), PAGES / "environment.md": environment_page(),
            PAGES / "kit-api.md": api_page(), PAGES / "exit-codes.md": exit_codes_page()}


def main(argv: list[str]) -> int:
    return write_or_check(argv, pages, "orchestrator.cli.reference")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
