"""Domain errors. Services raise these; the CLI maps them to exit codes and one-line messages."""

from __future__ import annotations


class OrchError(Exception):
    """Something the user can act on; exit 1 unless a subclass says otherwise."""

    exit_code = 1


class UsageError(OrchError):
    """Bad arguments or configuration, found before anything was written."""

    exit_code = 2


class Refused(OrchError):
    """orch will not do this (e.g. it would overwrite or rerun a verified result)."""

    exit_code = 3


class AlreadyVerified(Refused):
    pass


class JobNotFound(OrchError):
    exit_code = 2


class IllegalTransition(OrchError):
    """A transition not in the state table, or a compare-and-set that lost a race."""


class DatabaseProblem(OrchError):
    """The DB file is corrupt, locked past the busy timeout, or unreachable."""


class DatabaseInterrupted(DatabaseProblem):
    """Locked past the busy timeout, or the connection lost (a server restart): a later try may work.

    ``reconcile --watch`` carries on after one of these; it stopped for good when PostgreSQL restarted
    in the middle of a pass (a hostile run)."""
