"""The ``orch`` command group and what every command shares: exit-code mapping, config + DB, JSON output.

The commands live in their own modules (manage, read, submit_cmd, sweep_cmd), import from here and register
on ``main``; ``orchestrator/cli/__init__.py`` imports them all. Each command parses, calls one service
function, renders.

Exit codes: 0 success; 1 unexpected error; 2 usage error (bad arguments, unknown job, bad
orch.toml); 3 refused (it would overwrite or rerun a verified result, or the job is in a state
that forbids it); 4 not verified (``orch verify`` answered ABSENT/CORRUPT, or ``submit --wait``
ended without a verified marker); 141 stdout closed by its reader (as a SIGPIPE death). ``--json`` prints
exactly one JSON document on stdout.

Login-node latency: this module imports only click and the stdlib at start; the DB layer is
imported by the commands, and read commands never import torch or submitit.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

STATES = ("pending", "submitted", "running", "done_marker_verified", "retryable_failed", "failed", "cancelled")
EXIT_NOT_VERIFIED = 4
EXIT_BROKEN_PIPE = 128 + 13  # SIGPIPE's: what `seq 9 | head -1` reports under pipefail


def _usage_error(e: click.UsageError, command: str | None = None) -> int:
    """Print a usage error as one line naming the command's help (click's own is three: usage, hint, error)."""
    where = e.ctx.command_path if e.ctx is not None and e.ctx.parent is not None else \
        f"orch {command}" if command else "orch"
    click.echo(f"orch: {_one_line(e.format_message())} (see '{where} --help')", err=True)
    return e.exit_code


class OrchGroup(click.Group):
    """Maps domain errors to exit codes with one line on stderr; no tracebacks for users."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """The console script's entry: stdout is flushed here, inside the handler, so a reader that went
        away is exit 141 wherever it shows (`orch --help | true` exited 1 through click's own EPIPE
        handling, and output still buffered at exit surfaced only in the interpreter's final flush)."""
        try:
            rv = super().main(*args, **kwargs)
        except SystemExit as e:
            _flush_stdout(e.code)
            raise
        _flush_stdout(0)
        return rv

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        # `orch --help` / `orch --version` print while the top-level arguments are parsed, outside invoke.
        try:
            return super().make_context(*args, **kwargs)
        except BrokenPipeError:
            _quiet_stdout()
            raise click.exceptions.Exit(EXIT_BROKEN_PIPE) from None
        except click.UsageError as e:
            raise click.exceptions.Exit(_usage_error(e)) from None

    def invoke(self, ctx: click.Context) -> Any:
        from orchestrator.errors import OrchError

        try:
            return super().invoke(ctx)
        except OrchError as e:
            click.echo(f"orch: {_one_line(str(e))}", err=True)
            ctx.exit(e.exit_code)
        except BrokenPipeError:
            # `orch status | head -1`: the reader has gone; say nothing more (a traceback), and exit
            # as a process killed by SIGPIPE does (141), never 0: `orch verify x | ...` with the reader gone
            # exited 0 for an unverified job, which `set -o pipefail` scripts took for success.
            _quiet_stdout()
            ctx.exit(EXIT_BROKEN_PIPE)
        except click.UsageError as e:  # a misspelt option, a bad value: one line, like every other refusal
            ctx.exit(_usage_error(e, ctx.invoked_subcommand))
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("orch: interrupted", err=True)
            ctx.exit(130)
        except Exception as e:  # the last line of defence
            if os.environ.get("ORCH_DEBUG"):
                raise
            click.echo(f"orch: unexpected error: {type(e).__name__}: {str(e)[:300]} "
                       "(set ORCH_DEBUG=1 for a traceback)", err=True)
            ctx.exit(1)


def _one_line(msg: str) -> str:
    msg = " ".join(msg.split())
    return msg if msg.isprintable() else msg.encode("unicode_escape").decode()


def _flush_stdout(code: Any) -> None:
    """Flush what is still buffered for stdout; a reader that went away is exit 141.

    Three ways it shows: click met EPIPE itself (it swaps in a wrapper that pacifies flushes and
    exits 1); the flush raises; or nothing raises at all, because CPython's buffered writer reports a
    large write that the kernel took only in part before EPIPE as complete (`orch status --tasks |
    head -1` exited 0): for a pipe, poll says POLLERR once its reader has closed. The last is asked only
    of a command that would exit 0; one that already failed keeps its own code.
    """
    if type(sys.stdout).__name__ == "_PacifyFlushWrapper":  # click met EPIPE and chose exit 1
        sys.exit(EXIT_BROKEN_PIPE)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
        sys.exit(EXIT_BROKEN_PIPE)
    except (OSError, ValueError, AttributeError):  # stdout closed or absent: nothing more to say
        return
    if code in (0, None) and _reader_gone():
        _quiet_stdout()
        sys.exit(EXIT_BROKEN_PIPE)


def _reader_gone() -> bool:
    """Whether stdout is a pipe (or FIFO) whose every reader has closed it."""
    import select
    import stat

    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & select.POLLERR for _fd, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _ctx():
    """Config + DB, created on first use (ORCH_HOME 0700, DB 0600, schema at head)."""
    from orchestrator.core.db import Database

    cfg = _cfg()
    return cfg, Database(cfg)


def _cfg():
    """The config, with orch's umask set (the quick paths that open no ``Database``)."""
    from orchestrator.core.config import load_config

    cfg = load_config()
    os.umask(cfg.umask)  # run dirs, logs and records are private unless orch.toml shares them
    return cfg


def _emit(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=1, sort_keys=True, default=str))


def _show(db: Any, name: str, events: bool = False) -> dict[str, Any]:
    from orchestrator.views.show import show_job

    return show_job(db, name, events=events)


@click.group(cls=OrchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="orch", prog_name="orch")  # the version in pyproject.toml, said once
def main() -> None:
    """orch: run long training jobs on Slurm or this machine; never lose or rerun a finished one.

    A job is finished when, and only when, its run dir's done.json verifies (every listed file
    has its recorded size and sha256). State lives in $ORCH_HOME (default ~/.orch).

    Exit codes: 0 ok, 1 unexpected error, 2 usage, 3 refused, 4 not verified.
    """
