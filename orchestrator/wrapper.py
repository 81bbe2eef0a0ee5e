"""The job wrapper's entry point before the job side moved to ``orchestrator/jobside/``.

A job started by an older orch names ``python -m orchestrator.wrapper`` in its batch script; Slurm reruns that script
when it requeues the job in place, after an upgrade too. This module keeps that name working: it runs the wrapper.
"""

from __future__ import annotations

import sys

from orchestrator.jobside.wrapper import main

if __name__ == "__main__":
    sys.exit(main())
