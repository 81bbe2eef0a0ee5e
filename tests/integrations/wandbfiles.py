"""Read back what W&B wrote offline: each ``offline-run-*`` dir's ``.wandb`` file, the SDK's own transaction log.

W&B ships no reader for it (its Go service writes it). The format is LevelDB's log: a 7-byte file header
(``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of records, each a 7-byte header (CRC-32C, length, type:
full, first, middle, last) and a protobuf ``Record`` payload. Only what the tests need: the run's id, its
history rows, its summary and the exit record.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    """One attempt's W&B process, as its offline file recorded it."""

    path: Path
    run_id: str | None = None
    rows: list[dict] = field(default_factory=list)  # history rows, in the order logged
    exit_code: int | None = None  # None: the process never reported its end (killed)
    summary: dict = field(default_factory=dict)  # the summary items this process set


def _payloads(data: bytes):
    if data[:4] != b":W&B":
        raise ValueError(f"not a W&B transaction log: {data[:8]!r}")
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0:  # zeroes: the end of what was written
            return
        payload, pos = data[pos + HEADER:pos + HEADER + length], pos + HEADER + length
        if kind == FULL:
            yield payload
        elif kind == FIRST:
            pending = payload
        elif kind == MIDDLE:
            pending += payload
        elif kind == LAST:
            yield pending + payload
            pending = b""


def read_offline_run(run_dir: Path) -> OfflineRun:
    """One ``offline-run-*`` dir."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("*.wandb")
    out = OfflineRun(path)
    for payload in _payloads(path.read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out.run_id = record.run.run_id
        elif kind == "history":
            out.rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                             for i in record.history.item})
        elif kind == "summary":
            out.summary.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                                for i in record.summary.update})
        elif kind == "exit":
            out.exit_code = record.exit.exit_code
    return out


def offline_runs(wandb_dir: Path) -> list[OfflineRun]:
    """Every attempt's offline run under ``wandb_dir``, oldest first (the dir names start with their start time)."""
    return [read_offline_run(d) for d in sorted(wandb_dir.glob("offline-run-*"))]
