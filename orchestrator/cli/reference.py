"""The CLI reference page (``docs/reference/cli.md``), generated from the click commands themselves.

A hand-written option list drifts the day an option is added; this page is each command's own ``--help``, rendered
at a fixed width, so the docs say what ``orch`` says. ``tests/unit/test_docs.py`` regenerates it and compares, as
``docs/lifecycle.md`` is checked.

    python -m orchestrator.cli.reference --write    # regenerate docs/reference/cli.md
    python -m orchestrator.cli.reference --check    # exit 1 if it is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from orchestrator.core.generated import write_or_check

TARGET = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md"
WIDTH = 100  # the help text's width: fixed, so the page does not depend on the terminal that generated it


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
    out = ["# The CLI", "",
           "Every command's `--help`, generated from the code by `python -m orchestrator.cli.reference --write` "
           "(a test fails when this page is stale). What the exit codes and the job's environment mean: "
           "[Commands](commands.md).", "", "```", _help(main, "orch", None), "```"]
    for name in commands():
        command = main.get_command(root, name)
        assert command is not None, name
        out += ["", f"## orch {name}", "", "```", _help(command, name, root), "```"]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    return write_or_check(argv, TARGET, generate, "orchestrator.cli.reference")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
