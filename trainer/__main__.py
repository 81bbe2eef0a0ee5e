"""``python -m trainer`` runs ``python -m orch_trainer`` (same flags, exit codes and run-dir contract)."""

import sys

from orch_trainer.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
