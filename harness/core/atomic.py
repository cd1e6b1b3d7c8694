"""Atomic files: written through a temporary file in the same directory, then renamed into place, so an
interrupted write never leaves a truncated file (``harness.core.recorder`` re-exports these beside its parquet
writer). Nothing here imports numpy or pandas: the command line writes its early files (the redacted Hydra
files, ``interrupted.json``) and refuses a bad config before those imports (~0.3-0.5 CPU s; docs/speed.md).
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable


def process_umask() -> int:
    """The process's file-mode creation mask, read without changing it where Linux shows it
    (``/proc/self/status``, ``Umask:``), else by setting and restoring it (``os.umask``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Write through a temporary file in the same directory (``write(tmp_path)``), then rename it into place.
    The file gets the mode a plain ``open(path, "w")`` would give it (``0o666`` less the process umask), not
    ``mkstemp``'s private ``0o600``.

    Raises:
        OSError: the file cannot be written (a full disk, a file-size limit, a read-only directory), its
            ``filename`` the path (not the temporary file's: pyarrow's errors name no file at all).
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e
    try:
        os.fchmod(fd, 0o666 & ~process_umask())
    finally:
        os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.filename != str(path):
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise


def strict_json(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, inf) replaced by ``None``, so the JSON is strict (RFC 8259
    has no NaN; strict parsers reject it): a missing value stays missing, never 0. A numpy scalar becomes its
    Python value (numpy is looked up, never imported: a process without it holds no numpy scalar)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.generic):
        return strict_json(obj.item())
    return obj


def write_json(obj: Any, path: Path) -> None:
    """``obj`` to ``path`` as indented strict JSON (non-finite numbers as ``null``), atomically."""
    def w(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(json.dumps(strict_json(obj), indent=2, allow_nan=False))
    atomic_write(path, w)


def write_text(text: str, path: Path) -> None:
    """``text`` to ``path``, atomically."""
    def w(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(path, w)
