"""The ``orch`` command line: the group (``orchestrator/cli/app.py``) with every command registered on it.

Exit codes: 0 success; 1 unexpected error; 2 usage error; 3 refused; 4 not verified (see app.py).
"""

# Each command module registers its commands on ``main`` when imported.
from orchestrator.cli import (  # noqa: F401
    dashboard_cmd,
    manage,
    metrics_cmd,
    nodes_cmd,
    plot_cmd,
    read,
    submit_cmd,
    sweep_cmd,
    watch_cmd,
)
from orchestrator.cli.app import EXIT_NOT_VERIFIED, STATES, main

__all__ = ["EXIT_NOT_VERIFIED", "STATES", "main"]

if __name__ == "__main__":
    main()
