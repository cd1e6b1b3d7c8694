"""Test helper: read an offline W&B run back from its transaction log (what ``wandb sync`` would upload),
so the logger tests check what was really logged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

_WANDB_MAGIC = b":W&B"
_LOG_HEADER_BYTES = 7          # ":W&B", magic 0xBEE1 (2 bytes), version (1 byte)
_LOG_BLOCK_BYTES = 32768       # LevelDB-log blocks; a record chunk never spans two blocks
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def iter_wandb_records(path: Path) -> Iterator[Any]:
    """The records of a W&B transaction log (``run-<id>.wandb``), parsed with wandb's own protobuf schema
    (``wandb.proto.wandb_internal_pb2.Record``). The file is a LevelDB-style log: a 7-byte header, then
    32 KiB blocks of chunks (CRC (4 bytes), length (2), type (1): full / first / middle / last)."""
    from wandb.proto import wandb_internal_pb2 as pb
    import struct
    data = Path(path).read_bytes()
    if data[:4] != _WANDB_MAGIC:
        raise ValueError(f"{path}: not a W&B transaction log (header {data[:4]!r})")
    pos, pending = _LOG_HEADER_BYTES, b""
    while pos + 7 <= len(data):
        left = _LOG_BLOCK_BYTES - pos % _LOG_BLOCK_BYTES
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + length > len(data):  # a chunk still being written
            break
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:  # zero padding up to the block's end
            pos += left - 7
            continue
        if kind in (_FULL, _LAST):
            rec = pb.Record()
            rec.ParseFromString((pending if kind == _LAST else b"") + chunk)
            pending = b""
            yield rec
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk


def read_offline_run(run_dir: Path) -> dict[str, Any]:
    """``{"config": {...}, "summary": {...}, "history": [{...}, ...], "exit_code": int | None}`` of an
    offline W&B run directory (``.../wandb/offline-run-*``), from its transaction log; values are decoded
    from their JSON. ``exit_code`` is ``None`` while the run is still open."""
    run_dir = Path(run_dir)
    logs = sorted(run_dir.glob("*.wandb"))
    if not logs:
        raise FileNotFoundError(f"{run_dir}: no .wandb transaction log")
    out: dict[str, Any] = {"config": {}, "summary": {}, "history": [], "exit_code": None}

    def key_of(item) -> str:
        return ".".join(item.nested_key) if item.nested_key else item.key

    for rec in iter_wandb_records(logs[0]):
        kind = rec.WhichOneof("record_type")
        if kind in ("config", "run"):
            for it in (rec.config if kind == "config" else rec.run.config).update:
                out["config"][key_of(it)] = json.loads(it.value_json)
        elif kind == "summary":
            for it in rec.summary.update:
                out["summary"][key_of(it)] = json.loads(it.value_json)
            for it in rec.summary.remove:
                out["summary"].pop(key_of(it), None)
        elif kind == "exit":
            out["exit_code"] = int(rec.exit.exit_code)
        elif kind == "history":
            out["history"].append({key_of(it): json.loads(it.value_json) for it in rec.history.item})
    return out
