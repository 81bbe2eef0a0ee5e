"""The per-rank parent's entry point before the job side moved to ``orchestrator/jobside/``.

The torchrun command line of a job started by an older orch names ``python -m orchestrator.rankend`` for each rank;
a rank that torchrun restarts after an upgrade runs this name again. This module keeps it working.
"""

from __future__ import annotations

import sys

from orchestrator.jobside.rankend import main

if __name__ == "__main__":
    sys.exit(main())
