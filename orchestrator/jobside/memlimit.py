"""The local backend's ``--mem``: a memory cgroup per attempt, and its count of kernel OOM kills.

A local job the kernel OOM killer ended looked exactly like a ``kill -9`` (a bare SIGKILL), so
it could never be classified ``oom`` and get more memory. The wrapper now runs the program in a memory
cgroup of its own, limited to ``--mem``, and records the cgroup's OOM-kill counter in ``exit.json``
(``oom_kill``); ``classify`` turns a count > 0 into ``oom``.

* cgroup v2 (``memory.max``, ``memory.events``' ``oom_kill``), where the memory controller is delegated
  to the wrapper's own cgroup (listed in its ``cgroup.subtree_control``);
* cgroup v1 (``memory.limit_in_bytes``, ``memory.oom_control``'s ``oom_kill N`` line), as on hybrid
  hosts whose v2 hierarchy has no memory controller.

The cgroup is created under the wrapper's own memory cgroup (the local backend's wrapper is forked from
orch's process, so: under orch's), named ``orch-<attempt token>``, and removed when the attempt is over.
Where none can be created (no controller, no permission) the program runs without one: ``--mem`` is then
not enforced locally, ``oom_kill`` is absent, and a kernel OOM kill is classified ``killed``.
Stdlib only: the wrapper imports it on every node.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

PREFIX = "orch-"
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class MemCgroup:
    """One attempt's memory cgroup: its dir and the hierarchy version (1 or 2)."""

    path: Path
    version: int

    def join_self(self) -> None:
        """Move the calling process into this cgroup (run in the child between fork and exec). A failure
        leaves the program outside it (``--mem`` then not enforced), never unstarted."""
        try:
            with open(self.path / "cgroup.procs", "w") as f:
                f.write("0")
        except OSError:
            pass

    def oom_kills(self) -> int | None:
        """The kernel's count of OOM kills in this cgroup, or None when it cannot be read."""
        name, key = ("memory.events", "oom_kill") if self.version == 2 else ("memory.oom_control", "oom_kill")
        try:
            text = (self.path / name).read_text()
        except OSError:
            return None
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == key and v.strip().isdigit():
                return int(v)
        return None

    def remove(self) -> str | None:
        """Remove the cgroup (empty once the attempt's processes are gone); None or why not."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return None
        except OSError as e:
            return f"cannot remove {self.path}: {e.strerror or e}"
        return None


def _mounts(text: str | None = None) -> list[tuple[str, str, str, str]]:
    """(root, mount point, fstype, super options) of every cgroup mount of this process (``text``: a
    mountinfo to read instead of /proc/self/mountinfo)."""
    out: list[tuple[str, str, str, str]] = []
    try:
        lines = (Path("/proc/self/mountinfo").read_text() if text is None else text).splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) >= 5 and len(r) >= 3 and r[0] in ("cgroup", "cgroup2"):
            out.append((f[3], f[4], r[0], r[2]))
    return out


def _own_paths(text: str | None = None) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory path) of this process, from /proc/self/cgroup (or ``text``)."""
    v2 = v1 = None
    try:
        lines = (Path("/proc/self/cgroup").read_text() if text is None else text).splitlines()
    except OSError:
        return None, None
    for line in lines:
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _under(mount_root: str, mount_point: str, path: str) -> Path | None:
    """The dir of cgroup ``path`` below a mount of hierarchy root ``mount_root`` (None: not visible)."""
    root = mount_root.rstrip("/")
    if root and not (path == root or path.startswith(root + "/")):
        return None
    return Path(mount_point) / path[len(root):].lstrip("/")


def own_memory_cgroup(cgroup_text: str | None = None, mountinfo_text: str | None = None) -> tuple[Path, int] | None:
    """(dir, version) of this process's memory cgroup where children with a memory limit can be made; v2
    first, where the memory controller is delegated. The texts stand in for /proc/self/{cgroup,mountinfo}."""
    v2, v1 = _own_paths(cgroup_text)
    mounts = _mounts(mountinfo_text)
    if v2 is not None:
        for root, point, fstype, _opts in mounts:
            if fstype == "cgroup2" and (d := _under(root, point, v2)) is not None:
                try:
                    delegated = "memory" in (d / "cgroup.subtree_control").read_text().split()
                except OSError:
                    delegated = False
                if delegated:
                    return d, 2
    if v1 is not None:
        for root, point, fstype, opts in mounts:
            if fstype == "cgroup" and "memory" in opts.split(",") and (d := _under(root, point, v1)) is not None:
                if (d / "memory.limit_in_bytes").exists():
                    return d, 1
    return None


def create(token: str, mem_mb: int, own: tuple[Path, int] | None = None) -> tuple[MemCgroup | None, str | None]:
    """The attempt's memory cgroup limited to ``mem_mb`` (under ``own``, default this process's memory
    cgroup), or (None, why there is none)."""
    if not _TOKEN_RE.match(token):
        return None, f"token {token!r} is not a cgroup name"
    own = own or own_memory_cgroup()
    if own is None:
        return None, "no memory cgroup this process can create children in (cgroup v2 memory not delegated, no v1)"
    parent, version = own
    cg = MemCgroup(parent / f"{PREFIX}{token}", version)
    limit = str(mem_mb * 1024 * 1024)
    try:
        os.mkdir(cg.path, 0o755)
    except FileExistsError:
        pass  # a wrapper rerun for the same attempt (Slurm requeue in place does not come here; a retry may)
    except OSError as e:
        return None, f"cannot create {cg.path}: {e.strerror or e}"
    try:
        if version == 2:
            (cg.path / "memory.max").write_text(limit)
            _best_effort(cg.path / "memory.swap.max", "0")  # an OOM kill, not a crawl through swap
        else:
            (cg.path / "memory.limit_in_bytes").write_text(limit)
            _best_effort(cg.path / "memory.memsw.limit_in_bytes", limit)
    except OSError as e:
        cg.remove()
        return None, f"cannot set the limit in {cg.path}: {e.strerror or e}"
    return cg, None


def _best_effort(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass


def for_attempt(token: str, mem_mb: int | None, log: BinaryIO) -> MemCgroup | None:
    """The wrapper's entry: the attempt's cgroup when ``--mem`` was given and one can be made; else None,
    with one line in the attempt's stderr.log saying why ``--mem`` is not enforced."""
    if not mem_mb:
        return None
    cg, why = create(token, mem_mb)
    if cg is None:
        log.write(f"orch wrapper: --mem {mem_mb} MB is not enforced here: {why}; a kernel OOM kill will be "
                  "classified killed, not oom\n".encode())
        log.flush()
    return cg


def remove_leftover(token: str) -> None:
    """Remove the cgroup of an attempt whose wrapper was killed before it could (the local backend calls
    this when it finds the attempt gone without an exit record). Best effort; nothing if there is none."""
    own = own_memory_cgroup()
    if own is None or not _TOKEN_RE.match(token):
        return
    path = own[0] / f"{PREFIX}{token}"
    if path.is_dir() and not path.is_symlink():
        MemCgroup(path, own[1]).remove()


def close(cg: MemCgroup | None) -> int | None:
    """After the attempt's processes are gone: the cgroup's OOM-kill count (None: no cgroup), cgroup removed."""
    if cg is None:
        return None
    n = cg.oom_kills()
    cg.remove()
    return n
