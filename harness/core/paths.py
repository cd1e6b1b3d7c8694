"""Where the project's files are: a leaf module (it imports nothing of the project), so a backend, a
launcher or a tool can find them without importing the config module.

``PROJECT_ROOT``: the directory that holds ``harness/`` -- a git checkout's top level (``conf/``,
``traces/``, ``results/`` beside it), or ``site-packages`` for an installed wheel, whose ``conf/`` and
default traces ship inside the package (:data:`PACKAGE_DIR`; ``harness.run.cli``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[__name__.count(".") - 1]
"""The ``harness`` package's directory (this file's parent, as many levels up as this module's dotted name is
deep below ``harness``, so it stays right wherever the module sits in the package). An installed wheel ships
the top-level ``conf/`` and ``traces/`` in it (``setup.py``: packages ``harness.conf`` and ``harness.traces``);
a checkout has them at ``PROJECT_ROOT``."""
PROJECT_ROOT = PACKAGE_DIR.parent


def in_checkout() -> bool:
    """True when ``harness`` runs from a checkout (``conf/config.yaml`` beside it), False for an installed
    wheel."""
    return (PROJECT_ROOT / "conf" / "config.yaml").is_file()


def results_root() -> Path:
    """The default ``results/`` directory: the checkout's, or for an installed wheel the working directory's
    (never inside ``site-packages``)."""
    return (PROJECT_ROOT if in_checkout() else Path.cwd()) / "results"


def data_path(rel: str | Path) -> Path:
    """A relative path of a shipped file (e.g. ``traces/swebench_verified_mini_gemini3pro.jsonl.gz``) looked up
    in the working directory, under the checkout, then in the installed package (:data:`PACKAGE_DIR`); where
    none has it, the checkout's path (a checkout) or the working directory's (an installed wheel), for the
    caller's error message. An absolute path is returned as is."""
    path = Path(rel)
    if path.is_absolute():
        return path
    bases = [Path.cwd(), PROJECT_ROOT, PACKAGE_DIR]
    for base in bases:
        if (base / path).exists():
            return base / path
    return (PROJECT_ROOT if in_checkout() else Path.cwd()) / path


_CODE_DIGEST: list[str] = []


def code_digest() -> str:
    """Digest of every ``.py`` file under ``harness/`` and ``baselines/`` (what a result may depend on):
    SHA-256 over each file's path (relative to :data:`PROJECT_ROOT`) and bytes in sorted order, the first
    32 hex digits; computed once per process. Read by the SLO baseline's disk cache
    (``harness.run.slo_baseline``) and the run fingerprint (``harness.analysis.provenance.fingerprint``)."""
    if not _CODE_DIGEST:
        h = hashlib.sha256()
        for p in sorted([*PROJECT_ROOT.joinpath("harness").rglob("*.py"), *PROJECT_ROOT.joinpath("baselines").rglob("*.py")]):
            h.update(str(p.relative_to(PROJECT_ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
        _CODE_DIGEST.append(h.hexdigest()[:32])
    return _CODE_DIGEST[0]


def shipped(rel: str | Path) -> Path:
    """A file or directory the project ships (e.g. ``traces/tokenizer/qwen2.5``): the checkout's copy, else the
    installed package's (:data:`PACKAGE_DIR`); where neither exists, the checkout's path (for the caller's
    error message, which names it)."""
    for base in (PROJECT_ROOT, PACKAGE_DIR):
        if (base / rel).exists():
            return base / rel
    return PROJECT_ROOT / rel
