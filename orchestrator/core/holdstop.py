"""Ctrl-Z (SIGTSTP) of an orch command takes effect when its write transaction ends, not inside it.

SQLite has one writer at a time, and a stopped process keeps its lock: an ``orch sweep`` suspended with Ctrl-Z
inside one of its many short write transactions held every other submit and reconcile pass (found by a
hostile pass). Other writers refuse a stopped holder at once (``quickdb.begin_immediate``); this keeps the terminal's
own stop from making one. SIGSTOP cannot be caught: that case is the refusal's.

The handler is installed by the first write transaction of the main thread, only where SIGTSTP has its default
disposition (never over a handler or an ignore someone else set). Outside a transaction it stops the process at
once, as the default would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

_lock = threading.Lock()  # guards _open; never taken by the handler (it may run inside a held block)
_open = 0  # write transactions in progress, in any thread
_stop_pending = False


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A Ctrl-Z that arrives inside the block stops the process once every open block has ended."""
    global _open, _stop_pending
    _install()
    with _lock:
        _open += 1
    try:
        yield
    finally:
        with _lock:
            _open -= 1
            stop_now = _open == 0 and _stop_pending
            if stop_now:
                _stop_pending = False
        if stop_now:
            os.kill(os.getpid(), signal.SIGSTOP)


def _on_tstp(_signum: int, _frame: object) -> None:
    global _stop_pending
    if _open:
        _stop_pending = True
    else:
        os.kill(os.getpid(), signal.SIGSTOP)


def _install() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set a handler; its own transactions install it
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTSTP) is signal.SIG_DFL:
            signal.signal(signal.SIGTSTP, _on_tstp)
