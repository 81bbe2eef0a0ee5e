"""Durable writes and distrustful reads of small files (stdlib only; part of the shared protocol).

Writes: a file exists under its final name only after its bytes were fsynced, it was renamed into
place with ``os.replace`` and the directory was fsynced, so a reader sees the old content or the
new, never a prefix. After a write or fsync error the tmp file is removed and the error raised; a
failed fsync is never retried (the kernel may already have marked the pages clean).

Reads: every file a job can write (exit, failure and progress records, run_config.json, done.json)
is opened with ``O_NONBLOCK | O_NOFOLLOW``, accepted only if it is a regular file, and read up to a
size cap. A job that left a FIFO named ``progress.json`` once blocked every reconcile pass forever;
a symlink to ``/dev/zero`` or a 50 MB file must cost a refusal, not memory or time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

TMP_INFIX = ".tmp-"  # anything being written carries this in its name: never a committed object
MAX_JSON_BYTES = 4 * 1024 * 1024  # hostile or runaway records are refused, not parsed
MAX_INT = 2**63 - 1  # what SQLite's INTEGER holds; larger numbers are refused, not stored
MAX_DB_INT = 2**31 - 1  # what an INTEGER column holds on every SQL DB (PostgreSQL's is 32-bit)


class BadRecord(ValueError):
    """A file that is not what its reader expects: not a regular file, too large, not valid JSON,
    or a value of the wrong type or range. The message names the file and the problem."""


def tmp_name(final_name: str) -> str:
    """A same-directory name for something being written; never matches a committed name."""
    return f"{final_name}{TMP_INFIX}{secrets.token_hex(4)}"


def fsync_dir(path: Path | str) -> None:
    """Persist a directory entry (a rename or create inside ``path``)."""
    fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HashingWriter:
    """File-like wrapper that hashes bytes as they are written (one pass, no re-read)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._h = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = self._f.write(data)
        self._h.update(data)
        self.size += len(data)
        return n if n is not None else len(data)

    def flush(self) -> None:
        self._f.flush()

    @property
    def sha256(self) -> str:
        return self._h.hexdigest()


def write_file_synced(path: Path, chunks: Iterable[bytes]) -> dict[str, Any]:
    """Write ``chunks`` to ``path`` (a new file), fsync it, and return ``{"size", "sha256"}``.

    The caller owns naming: write under a tmp name (or inside a tmp dir) and rename afterwards.
    On any error the partial file is removed and the error re-raised.
    """
    try:
        with open(path, "xb") as f:
            w = HashingWriter(f)
            for chunk in chunks:
                w.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        return {"size": w.size, "sha256": w.sha256}
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def atomic_write(path: Path | str, data: bytes | str, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically and durably (tmp, fsync, ``os.replace``, dir fsync).

    ``mode``: the file's permissions, set before the rename (a file another user's process reads,
    e.g. node_exporter's textfile collector, must not depend on the writer's umask).
    """
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    tmp = path.with_name(tmp_name(path.name))
    write_file_synced(tmp, [data])
    try:
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: Path | str, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def atomic_create(path: Path | str, data: bytes | str) -> bool:
    """``path`` made to hold ``data`` (durably, whole or not at all) only if no file has that name yet: False,
    nothing changed, when one has. A tmp file, fsynced, is hard-linked to the name (``link`` never replaces),
    so whoever writes ``path`` first wins and a reader never sees a prefix."""
    path = Path(path)
    tmp = path.with_name(tmp_name(path.name))
    write_file_synced(tmp, [data.encode() if isinstance(data, str) else data])
    try:
        os.link(tmp, path, follow_symlinks=False)
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    fsync_dir(path.parent)
    return True


def open_regular(path: Path | str, flags: int = os.O_RDONLY, *, follow: bool = False,
                 mode: int = 0o600) -> BinaryIO | None:
    """``path`` opened (binary, unbuffered for writes) if it is a regular file; None for anything else.

    Never blocks and never follows a symlink unless told: O_NONBLOCK, so a FIFO put in a file's place opens at
    once (or fails, for a write with no reader) and is refused after ``fstat``. The check comes before
    ``fdopen``: a directory there made ``fdopen`` raise IsADirectoryError, and `orch report` failed for every
    job over one run dir (hostile pass 4); a FIFO progress.jsonl blocked the kit's heartbeat thread for good.
    Raises OSError from ``open`` (absent, no permission) as ``os.open`` does.
    """
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW), mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        if flags & (os.O_WRONLY | os.O_RDWR):
            os.set_blocking(fd, True)
            return os.fdopen(fd, "ab" if flags & os.O_APPEND else "wb", buffering=0)
        return os.fdopen(fd, "rb")
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def read_tail(path: Path | str, limit: int) -> tuple[bytes, bool] | None:
    """The last ``limit`` bytes of ``path`` and whether the file held more; None when it is absent, unreadable or
    not a regular file (opened as ``open_regular`` opens: a symlink or FIFO there is never followed or blocked on).
    A job's heartbeat history and its logs are read this way."""
    try:
        f = open_regular(path)
    except OSError:
        return None
    if f is None:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - limit))
        return f.read(limit), size > limit


def sha256_file(path: Path, bufsize: int = 1 << 20) -> tuple[int, str]:
    """(size, sha256) of a regular file; a FIFO, directory or device is refused (BadRecord), never read."""
    h = hashlib.sha256()
    size = 0
    f = open_regular(path, follow=True)
    if f is None:
        raise BadRecord(f"{Path(path).name} is not a regular file")
    with f:
        while chunk := f.read(bufsize):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def read_bounded(path: Path | str, limit: int, *, follow: bool = False) -> bytes:
    """The bytes of ``path`` if it is a regular file (not a symlink) of at most ``limit`` bytes.

    Raises FileNotFoundError when absent, BadRecord for anything else that is not a small regular
    file. Never blocks: a FIFO is opened non-blocking and refused after ``fstat``. ``follow``: a
    symlink to a regular file is read too (a user's own input, not a file a job wrote).
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == getattr(os, "ELOOP", 40):
            raise BadRecord(f"{path.name} is a symlink") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadRecord(f"{path.name} is not a regular file")
        if st.st_size > limit:
            raise BadRecord(f"{path.name} is larger than {limit} bytes")
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > limit:  # it grew while we read
        raise BadRecord(f"{path.name} is larger than {limit} bytes")
    return b"".join(chunks)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_json_bounded(path: Path | str, limit: int = MAX_JSON_BYTES) -> Any:
    """Parse a JSON file a job may have written; BadRecord for anything not small, regular, strict JSON.

    NaN and Infinity are refused: a NaN step or exit code compared false with everything and left a
    job ``submitted`` forever.
    """
    raw = read_bounded(path, limit)
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as e:
        raise BadRecord(f"{Path(path).name} is not valid JSON: {str(e)[:80]}") from None


def is_int(v: Any, lo: int = -MAX_INT, hi: int = MAX_INT) -> bool:
    """An int (not a bool) within [lo, hi]: what may be stored in an INTEGER column or compared."""
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def finite_number(v: Any) -> float | None:
    """``v`` as a float if it is a finite int/float (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an int too large for a float
        return None
    return f if math.isfinite(f) else None


class SyncBatch:
    """Many ``atomic_write``s made durable together, with the same guarantee (a final name only ever holds
    bytes that reached the disk; a reader sees the old content or the new, never a prefix), at two
    filesystem flushes for N files instead of 2N fsyncs.

    ``write`` puts each file under its tmp name without fsync; ``commit`` flushes every filesystem they
    are on once (``syncfs``), renames them all into place, and flushes once more for the renames. Until
    ``commit`` returns, none of them exists under its final name. A 1,000-task sweep spent 38 s
    of 81 in 6,000 fsyncs (command.json, fence.json and submitted.json per task, each file and its dir).

    The cost: ``syncfs`` writes back every dirty page of that filesystem, other processes' too, so it is
    meant for many files at once. Where ``syncfs`` is missing (not Linux) each file and dir is fsynced.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Path, Path, int | None]] = []  # (tmp, final, mode)

    def __enter__(self) -> SyncBatch:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def __len__(self) -> int:
        return len(self._pending)

    def write(self, path: Path | str, data: bytes | str, mode: int | None = None) -> None:
        """Write ``data`` under a tmp name beside ``path``; it takes ``path``'s name at ``commit``."""
        path = Path(path)
        tmp = path.with_name(tmp_name(path.name))
        try:
            _write_new(tmp, data.encode() if isinstance(data, str) else data)
            if mode is not None:
                os.chmod(tmp, mode)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._pending.append((tmp, path, mode))

    def write_json(self, path: Path | str, obj: Any) -> None:
        # One line: ``indent`` makes json fall back to its pure-Python encoder, 3,000 of them a tenth of a
        # 1,000-task sweep; these records are read by orch, not by eye.
        self.write(path, json.dumps(obj, sort_keys=True) + "\n")

    def commit(self) -> None:
        """Flush, rename into place, flush: on an error before the renames nothing is in place (the tmp
        files are removed); the error is raised."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        try:
            _flush([tmp for tmp, _, _ in pending])
        except BaseException:
            for tmp, _, _ in pending:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise
        for i, (tmp, path, _) in enumerate(pending):
            try:
                os.replace(tmp, path)
            except BaseException:
                for left, _, _ in pending[i:]:
                    with contextlib.suppress(OSError):
                        os.unlink(left)
                raise
        _flush([path.parent for _, path, _ in pending], dirs=True)

    def abort(self) -> None:
        """Remove what was written; nothing takes its final name."""
        pending, self._pending = self._pending, []
        for tmp, _, _ in pending:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _flush(paths: list[Path], dirs: bool = False) -> None:
    """Persist ``paths`` (files, or with ``dirs`` their directory entries): one ``syncfs`` per filesystem
    they are on, or an fsync of each where ``syncfs`` is missing."""
    syncfs = _syncfs()
    if syncfs is None:
        for p in paths:
            fsync_dir(p) if dirs else _fsync_file(p)
        return
    seen: set[int] = set()
    for p in dict.fromkeys(p if dirs else p.parent for p in paths):  # one look per directory, not per file
        if os.stat(p).st_dev in seen:  # one stat, not an open, per directory of a filesystem already flushed
            continue
        fd = os.open(str(p), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            seen.add(os.fstat(fd).st_dev)
            if syncfs(fd) != 0:  # Linux >= 5.8 reports writeback errors of the filesystem here
                import ctypes

                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), str(p))
        finally:
            os.close(fd)


def _write_new(path: Path, data: bytes) -> None:
    """``data`` into a new file ``path`` (exclusive create, not followed), without Python's buffered file object
    (its open asks the kernel whether a file is a terminal: a sweep's 3,000 records)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_SYNCFS: list[Any] = []


def _syncfs() -> Any:
    """libc's ``syncfs(fd)``, or None (not Linux / not found)."""
    if not _SYNCFS:
        fn = None
        if os.uname().sysname == "Linux":
            try:
                import ctypes

                fn = ctypes.CDLL(None, use_errno=True).syncfs
                fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _SYNCFS.append(fn)
    return _SYNCFS[0]
