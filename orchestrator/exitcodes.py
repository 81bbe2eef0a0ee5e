"""Every exit code orch's commands and its bundled trainer give, declared once: the code, who gives it, what it means.

The exit-code reference (``docs/reference/exit-codes.md``) is generated from this table, and
``tests/unit/test_docs.py`` checks it against the codes the code gives (the errors' ``exit_code``, the CLI's own
constants, the trainer's ``protocol.EXIT_*``): a code added there and not here fails it, as does one declared here
that nothing gives. Stdlib only, data only.
"""

from __future__ import annotations

from typing import NamedTuple


class ExitCode(NamedTuple):
    code: int
    program: str  # one of PROGRAMS
    meaning: str


PROGRAMS = {
    "orch": "orch's commands (`orch submit`, `orch status`, ...)",
    "orch_trainer": "The bundled trainer (`python -m orch_trainer`), as a job's program",
}

CODES: tuple[ExitCode, ...] = (
    ExitCode(0, "orch", "success"),
    ExitCode(1, "orch", "an error orch names in one line (a DB corrupt, locked past its busy timeout or unreachable), "
             "or an unexpected one"),
    ExitCode(2, "orch", "usage error: bad arguments or configuration, or an unknown job; found before anything was "
             "written"),
    ExitCode(3, "orch", "refused: the message names why (the run dir holds a verified marker, the job is done, ...)"),
    ExitCode(4, "orch", "not verified: `orch verify` found no verifying marker; `orch submit --wait` or `orch watch` "
             "saw the job end without one"),
    ExitCode(130, "orch", "interrupted (Ctrl-C: `orch: interrupted`); a job it submitted or watched goes on"),
    ExitCode(141, "orch", "its stdout was closed by the reader before orch was done (`orch status | head -1`)"),
    ExitCode(0, "orch_trainer", "finished: result/ written and done.json verified; or already complete (nothing "
             "written)"),
    ExitCode(1, "orch_trainer", "unexpected crash (a traceback on stderr; failure.json's class `crash` when it could "
             "be written)"),
    ExitCode(2, "orch_trainer", "usage error: the argument checks failed, nothing written"),
    ExitCode(3, "orch_trainer", "a failure it classified itself, in attempts/<n>/failure.json (oom, nan, enospc, ...)"),
    ExitCode(143, "orch_trainer", "preempted by SIGTERM or SIGUSR2: the last completed step is checkpointed, "
             "failure.json says `preempted`"),
)
