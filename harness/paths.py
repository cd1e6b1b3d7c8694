"""Where the project's files are: a leaf module (it imports nothing of the project), so a backend, a
launcher or a tool can find them without importing the config module.

``PROJECT_ROOT``: the directory that holds ``harness/`` -- a git checkout's top level (``conf/``,
``traces/``, ``results/`` beside it), or ``site-packages`` for an installed wheel, whose ``conf/`` and
default traces ship inside the package (:data:`PACKAGE_DIR`; ``harness.cli``).
"""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = Path(__file__).resolve().parent
"""The ``harness`` package's directory. An installed wheel ships the top-level ``conf/`` and ``traces/`` in it
(``setup.py``: packages ``harness.conf`` and ``harness.traces``); a checkout has them at ``PROJECT_ROOT``."""


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


def shipped(rel: str | Path) -> Path:
    """A file or directory the project ships (e.g. ``traces/tokenizer/qwen2.5``): the checkout's copy, else the
    installed package's (:data:`PACKAGE_DIR`); where neither exists, the checkout's path (for the caller's
    error message, which names it)."""
    for base in (PROJECT_ROOT, PACKAGE_DIR):
        if (base / rel).exists():
            return base / rel
    return PROJECT_ROOT / rel
