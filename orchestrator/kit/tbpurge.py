"""A resumed attempt's TensorBoard curve replaces what a killed attempt logged after the resume step.

TensorBoard's own mechanism, ``SummaryWriter(purge_step=P)``, is a ``SessionLog.START`` event at step P: when
TensorBoard reads it, it drops every point it read before with a step >= P, in every file of that log dir. orch
writes that event in a file of its own, so that it works whatever writer the program made, and whenever it made it
(HF's TensorBoard callback and Lightning's logger open theirs before orch knows the step the run resumed from).

Why the file's name matters: TensorBoard reads a log dir's event files in the order of their names
(``events.out.tfevents.<unix seconds>.<host>...``). The purge must come after the killed attempt's file and before
every file of this attempt, or it drops the resumed attempt's own points. Its name carries the second before this
process started: every writer of this attempt is younger, every earlier attempt's file older.

The format is written by hand (a TFRecord of one ``Event`` protobuf; stdlib only), so that a program without
TensorBoard installed pays nothing, and the wrapper-free kit stays framework-free.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

from orchestrator import protocol

_IMPORTED_AT = time.time()
_CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected: TFRecord's checksum


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _CRC32C_POLY if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _record(payload: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the payload, its masked CRC."""
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", _masked_crc(length)) + payload + struct.pack("<I", _masked_crc(payload))


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1  # int64 as protobuf encodes it
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _event(wall_time: float, step: int, *, file_version: str | None = None, session_start: bool = False) -> bytes:
    """An ``Event`` protobuf: wall_time (1, double), step (2, int64), file_version (3) or session_log (7)."""
    out = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
    if file_version is not None:
        raw = file_version.encode()
        out += b"\x1a" + _varint(len(raw)) + raw
    if session_start:
        session_log = b"\x08\x01"  # SessionLog.status (1) = START (1)
        out += b"\x3a" + _varint(len(session_log)) + session_log
    return out


def process_start() -> float:
    """When this process started (Linux ``/proc``), else when this module was imported."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22, starttime, in clock ticks since boot
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return _IMPORTED_AT


def has_event_files(log_dir: Path) -> bool:
    try:
        return any("tfevents" in p.name for p in log_dir.iterdir())
    except OSError:
        return False


def write_purge(log_dir: Path, purge_step: int, attempt: int) -> Path | None:
    """Hide, in TensorBoard, what earlier attempts logged in ``log_dir`` at steps >= ``purge_step``. Only where an
    earlier attempt left event files (a first attempt writes nothing). Returns the file written, or None."""
    if log_dir.is_symlink() or not has_event_files(log_dir):  # a symlinked dir could point anywhere: not ours
        return None
    second = int(process_start()) - 1
    path = log_dir / f"events.out.tfevents.{second:010d}.{socket.gethostname()}.orch-resume-{int(attempt)}"
    now = time.time()
    data = _record(_event(now, purge_step, file_version="brain.Event:2")) + \
        _record(_event(now, purge_step, session_start=True))
    protocol.atomic_write(path, data)
    return path
