"""An exclusive flock on a lock file orch owns (next to its DB, in ORCH_HOME).

One helper for every such lock: the file is created 0600 and opened without following links, so a
symlink or directory planted there is refused rather than followed out of ORCH_HOME (hostile test).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from orchestrator.errors import OrchError


@contextlib.contextmanager
def exclusive(path: Path, error: type[OrchError], what: str = "") -> Iterator[None]:
    """Hold ``flock(LOCK_EX)`` on ``path`` for the block; ``error("cannot open <what><path>: ...")`` if it
    cannot be opened."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise error(f"cannot open {what}{path}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
