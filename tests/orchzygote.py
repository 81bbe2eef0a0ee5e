"""A fork server for the tests' ``orch`` runs: ``Orch(...)`` runs the real ``python -m orchestrator.cli`` entry
point, but forked from a process that has already imported what every orch process imports (SQLAlchemy, click,
orch's own modules), instead of a new interpreter that imports it all again.

Why: sampled during a full CI run (2 cores, three pytest streams), the runnable ``orch reconcile``, ``orch show``
and ``orch submit`` processes were ~40 % of the CPU asked for, nearly all of it imports (``orch reconcile`` on an
idle home: 1.8 s, 1.46 of them importing). The tests' wait loops run them every 1.5 s.

What a child gets is what a new process would: the request's environment, working directory and umask, stdin from
/dev/null, stdout and stderr to files, ``sys.argv`` as ``-m`` sets it, the default SIGCHLD disposition, a new seed
for ``random``; it exits through the interpreter's own end steps (threads joined, atexit, streams flushed) with
the exit code ``python -m`` would give. What it cannot get is what an interpreter reads when it starts
(``PYTHON*``, the locale, ``TZ``): a run whose environment differs there from the server's, and the modules that
read the environment when imported (``PRELOAD_NEVER``), run as before, in a new interpreter. So does everything
when ``ORCH_TEST_FRESH=1``.
"""

from __future__ import annotations

import json
import locale
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI_MAIN = str(ROOT / "orchestrator" / "cli" / "__main__.py")
PROG = "python -m orchestrator.cli"  # the program name click derives for `python -m orchestrator.cli`
# Imported in the server: each costs every orch process its import time, none reads the environment when imported.
PRELOAD = ("sqlalchemy", "sqlalchemy.orm", "sqlalchemy.dialects.sqlite", "sqlalchemy.dialects.postgresql", "click",
           "orchestrator.cli", "orchestrator.ops.reconcile", "orchestrator.views.show", "orchestrator.ops.submit",
           "orchestrator.core.db", "orchestrator.core.models")
# Modules that read the environment (or the clock) when imported: never in the server, so each child imports them
# under its own environment (a test that sets ORCH_SLURM_QUERY_TIMEOUT_S for one run, say).
PRELOAD_NEVER = ("orchestrator.backends.slurm.sbatch", "orchestrator.jobside.supervisor", "orchestrator.kit.tbpurge")
# What an interpreter reads once, when it starts: a run that differs here needs a new interpreter.
STARTUP_PREFIXES = ("PYTHON", "LC_")
STARTUP_KEYS = ("LANG", "LANGUAGE", "TZ")


def _startup(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(STARTUP_PREFIXES) or k in STARTUP_KEYS))


# ----------------------------------------------------------------------------------------------------------------
# the server (this file run as a script)
# ----------------------------------------------------------------------------------------------------------------


def _child(req: dict, wake: tuple[int, int]) -> None:
    """In the forked child: become the requested ``orch`` run, then exit as ``python -m orchestrator.cli`` would."""
    import atexit
    import random
    import signal
    import traceback

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in wake:
        os.close(fd)
    d = req["dir"]
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(os.path.join(d, "out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(os.path.join(d, "err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd, to in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, to)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    os.umask(req["umask"])
    time.tzset()
    random.seed()
    sys.argv = [CLI_MAIN, *req["argv"]]
    code: object = 0
    try:
        from orchestrator.cli import main

        main.main(args=list(req["argv"]), prog_name=PROG)
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # the interpreter joins its threads at exit
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code & 0xFF)


def _publish(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def serve() -> None:
    """Read one JSON request a line from stdin; fork a child for each; write its pid, then its exit code (as
    ``subprocess`` reports it: negative for a signal), into the request's directory. Ends with stdin."""
    import importlib
    import select
    import signal

    sys.path[0] = str(ROOT)  # as `python -m` run from ROOT has it
    for name in PRELOAD:
        importlib.import_module(name)
    leaked = [m for m in PRELOAD_NEVER if m in sys.modules]
    if leaked:
        raise SystemExit(f"orchzygote: {leaked} imported by the preload; they read the environment at import")
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, str] = {}
    buf = b""
    stdin = sys.stdin.buffer.raw
    while True:
        try:
            ready, _, _ = select.select([stdin, r], [], [])
        except InterruptedError:
            ready = []
        if r in ready:
            try:
                os.read(r, 4096)
            except BlockingIOError:
                pass
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            d = children.pop(pid, None)
            if d is not None:
                _publish(os.path.join(d, "rc"), str(os.waitstatus_to_exitcode(status)))
        if stdin in ready:
            chunk = os.read(stdin.fileno(), 65536)
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(req, (r, w))
                children[pid] = req["dir"]
                _publish(os.path.join(req["dir"], "pid"), str(pid))


# ----------------------------------------------------------------------------------------------------------------
# the client (in the pytest process)
# ----------------------------------------------------------------------------------------------------------------


class Zygote:
    """One server, for the runs whose environment starts an interpreter as its own did."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="orchzygote-", suffix=".log", delete=False)
        # none of a test's own settings: a teardown kills the processes whose environment names its ORCH_HOME
        own = {k: v for k, v in env.items() if not k.startswith(("ORCH_", "SLURM_"))}
        self.proc = subprocess.Popen([python, __file__], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=self.log, cwd=str(ROOT), env=own)
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, argv: list[str], env: dict[str, str], cwd: str, timeout: float) -> subprocess.CompletedProcess:
        d = tempfile.mkdtemp(prefix="orchz-")
        umask = os.umask(0o077)
        os.umask(umask)
        req = json.dumps({"argv": argv, "env": env, "cwd": cwd, "umask": umask, "dir": d}) + "\n"
        cmd = [sys.executable, "-m", "orchestrator.cli", *argv]
        try:
            with self.lock:
                self.proc.stdin.write(req.encode())
                self.proc.stdin.flush()
            rc = self._wait(d, time.monotonic() + timeout)
            if rc is None:
                self._kill(d)
                raise subprocess.TimeoutExpired(cmd, timeout, self._read(d, "out"), self._read(d, "err"))
            return subprocess.CompletedProcess(cmd, rc, self._read(d, "out"), self._read(d, "err"))
        finally:
            for name in ("out", "err", "pid", "rc"):
                try:
                    os.unlink(os.path.join(d, name))
                except FileNotFoundError:
                    pass
            os.rmdir(d)

    def _wait(self, d: str, deadline: float) -> int | None:
        pause = 0.002
        rc = os.path.join(d, "rc")
        while not os.path.exists(rc):
            if time.monotonic() > deadline:
                return None
            if not self.alive():
                raise RuntimeError(f"orchzygote died (exit {self.proc.returncode}; log {self.log.name})")
            time.sleep(pause)
            pause = min(pause * 1.5, 0.02)
        with open(rc) as f:
            return int(f.read())

    def _kill(self, d: str) -> None:
        """A run past its timeout: killed as subprocess.run kills its child, and reaped before the files go."""
        try:
            with open(os.path.join(d, "pid")) as f:
                os.kill(int(f.read()), 9)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
        self._wait(d, time.monotonic() + 10)

    @staticmethod
    def _read(d: str, name: str) -> str:
        """A file as ``subprocess.run(text=True)`` decodes a pipe: the locale's encoding, universal newlines."""
        try:
            raw = Path(d, name).read_bytes()
        except FileNotFoundError:
            return ""
        text = raw.decode(locale.getpreferredencoding(False))
        return text.replace("\r\n", "\n").replace("\r", "\n")


_SERVER: list[Zygote] = []
_SERVER_LOCK = threading.Lock()


def run_orch(python: str, argv: list[str], env: dict[str, str], cwd: str, timeout: float,
             standard: dict[str, str]) -> subprocess.CompletedProcess:
    """``subprocess.run([python, "-m", "orchestrator.cli", *argv], capture_output=True, text=True, ...)``, forked
    from the server where ``env`` starts an interpreter as ``standard`` does (the tests' usual environment; the
    server starts with it); a new interpreter otherwise (``PYTHONPROFILEIMPORTTIME``, another locale, ...)."""
    fresh = (os.environ.get("ORCH_TEST_FRESH") == "1" or python != sys.executable
             or _startup(env) != _startup(standard))
    if not fresh:
        with _SERVER_LOCK:
            if not _SERVER or not _SERVER[0].alive():
                _SERVER[:] = [Zygote(python, standard)]
            z = _SERVER[0]
        return z.run(argv, env, cwd, timeout)
    return subprocess.run([python, "-m", "orchestrator.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


if __name__ == "__main__":
    serve()
