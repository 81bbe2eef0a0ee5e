"""Local backend: runs an attempt as a detached process on this machine.

Why not submitit's LocalExecutor: its jobs are killed after ``timeout_min`` (2 min by default), and
a ``LocalJob`` re-attached from another process reports done() while the job still runs (see
``shared/notes/submitit.md``) — a cron reconciler is exactly such another process. This launcher
double-forks the job wrapper into its own session (it survives the submitter), and any process can
tell running / exited (with exit code, from the wrapper's ``exit.json``) / vanished, using psutil's
pid + create_time so that a reused pid is never mistaken for the job.

External id: ``"<pid>:<create_time in ms>"`` of the wrapper process.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

import psutil

from orchestrator.backends.base import AttemptRef, Backend, BackendError, Outcome, Phase, SubmitSpec
from orchestrator.wrapper import WRAPPER_FILE, read_exit

_CTIME_SLACK_MS = 20  # create_time is rounded by /proc's clock ticks


def _parse_id(external_id: str | None) -> tuple[int, int] | None:
    try:
        pid, ctime = (external_id or "").split(":")
        return int(pid), int(ctime)
    except ValueError:
        return None


def _alive(pid: int, ctime_ms: int) -> bool:
    try:
        p = psutil.Process(pid)
        if abs(int(p.create_time() * 1000) - ctime_ms) > _CTIME_SLACK_MS:
            return False  # the pid was reused by another process
        return p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class LocalBackend(Backend):
    name = "local"

    def submit(self, spec: SubmitSpec) -> str:
        spec.attempt_dir.mkdir(parents=True, exist_ok=True)
        argv = spec.wrapper_argv(time_limit_s=spec.resources.time_s)
        env = dict(os.environ)
        env.update(spec.env)
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError as e:
            os.close(r)
            os.close(w)
            raise BackendError(f"cannot fork: {e}") from None
        if pid == 0:  # first child: fork the wrapper, report its pid, exit (the wrapper is re-parented)
            try:
                os.close(r)
                gpid = os.fork()
                if gpid == 0:
                    os.setsid()  # own session + process group: killpg(pid) reaches the whole job
                    os.close(w)
                    fd = os.open(os.devnull, os.O_RDWR)
                    log = os.open(spec.attempt_dir / "wrapper.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                                  0o644)
                    os.dup2(fd, 0)
                    os.dup2(log, 1)
                    os.dup2(log, 2)
                    os.chdir(spec.run_dir)
                    os.execve(sys.executable, argv, env)
                os.write(w, str(gpid).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            data = f.read()
        os.waitpid(pid, 0)
        try:
            gpid = int(data)
            ctime = int(psutil.Process(gpid).create_time() * 1000)
        except (ValueError, psutil.NoSuchProcess):
            # It started and already exited (or never started): the exit record or its absence tells.
            if read_exit(spec.attempt_dir) is not None and data:
                return f"{int(data)}:0"
            raise BackendError(f"local launch of {spec.job} attempt {spec.attempt} failed") from None
        return f"{gpid}:{ctime}"

    def poll(self, refs: Sequence[AttemptRef]) -> dict[str, Outcome]:
        out: dict[str, Outcome] = {}
        for ref in refs:
            rec = read_exit(ref.attempt_dir)
            if rec is not None and rec.get("token") in (None, ref.token):
                rc = rec.get("returncode")
                sig = rec.get("signal")
                out[ref.token] = Outcome(Phase.EXITED, exit_code=rc if isinstance(rc, int) else None,
                                         signal=sig if isinstance(sig, int) else None,
                                         backend_state="TIMEOUT" if rec.get("time_limit_reached") is True else None,
                                         reason=str(rec.get("marker_error") or ""))
                continue
            ident = _parse_id(ref.external_id)
            if ident and _alive(*ident):
                out[ref.token] = Outcome(Phase.RUNNING)
            else:
                # Gone without an exit record: killed (SIGKILL, OOM killer, machine reboot).
                out[ref.token] = Outcome(Phase.VANISHED, reason="process gone without an exit record")
        return out

    def cancel(self, refs: Sequence[AttemptRef]) -> None:
        for ref in refs:
            ident = _parse_id(ref.external_id)
            if ident and _alive(*ident):
                try:
                    # SIGTERM to the wrapper, which forwards it: the job checkpoints and exits.
                    os.kill(ident[0], signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def kill(self, refs: Sequence[AttemptRef]) -> None:
        """SIGKILL the whole session of each attempt (a hung job that ignored SIGTERM)."""
        for ref in refs:
            ident = _parse_id(ref.external_id)
            if ident and _alive(*ident):
                try:
                    os.killpg(ident[0], signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def find_by_token(self, refs: Sequence[AttemptRef]) -> dict[str, str]:
        import json

        found: dict[str, str] = {}
        for ref in refs:
            try:
                rec = json.loads((ref.attempt_dir / WRAPPER_FILE).read_text())
            except (OSError, ValueError):
                rec = None
            if isinstance(rec, dict) and rec.get("token") == ref.token and isinstance(rec.get("pid"), int):
                try:
                    ctime = int(psutil.Process(rec["pid"]).create_time() * 1000)
                except psutil.NoSuchProcess:
                    ctime = 0
                found[ref.token] = f"{rec['pid']}:{ctime}"
            elif (read_exit(ref.attempt_dir) or {}).get("token") == ref.token:
                # Only this attempt's own exit record: a run dir reused under a fresh DB still holds
                # the earlier run's attempts/<n>/exit.json, which would hide a lost submission.
                found[ref.token] = "0:0"
        return found
