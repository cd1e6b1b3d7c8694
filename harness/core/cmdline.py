"""The command-line layer every tool shares: ``python -m harness.tools.fidelity`` (and its ``steps``,
``protocol``), ``harness.tools.calibrate``, ``harness.tools.tracestats``, ``harness.analysis.seeds``,
``harness.analysis.export``, ``harness.analysis.report`` and the scripts users run (``scripts/wait_table.py``
...). It holds the contract ``run.py`` holds (``harness.run.cli``; docs/outputs.md, "Exit status"):

* every argument is checked before any work (a server launched, a simulation run, a file written): numbers
  finite and in their range (:func:`number`, :func:`number_list`; ``nan``, ``inf``, a negative bound, a
  negative count are refused), an output path that can be written (:func:`writable`);
* bad input is one line, ``error: <what>`` naming the flag (or the file and field), and exit status 2
  (:data:`BAD_INPUT`), no usage block and no traceback (:class:`ArgumentParser`);
* Ctrl-C (SIGINT) and SIGTERM stop the tool with one ``interrupted`` line and exit status 130
  (:data:`INTERRUPTED`, 128 + SIGINT, what shells report for a SIGINT death) and no traceback (:func:`run`); a
  tool's own handler may say first what it had written;
* exit status 1 (:data:`MISSED`) is left to the tools that judge targets (``fidelity``: a target missed); a
  defect of the tool itself (an exception no tool expects) prints its traceback and exits 70
  (:data:`INTERNAL`, ``EX_SOFTWARE`` of BSD's sysexits.h), never 1;
* a file that cannot be read or written at run time (a full disk, a permission) is one ``error:`` line naming
  the file, exit status 2, as in ``run.py``.

A tool's module ends with ``sys.exit(cmdline.run(main))``; its ``main(argv)`` builds an :class:`ArgumentParser`
and returns its own statuses (0, 1 where it judges targets, 2, 3 ...). Worker pools get :func:`quiet_pool`, whose
workers leave Ctrl-C to the parent (no traceback per worker) and stop when it stops.

This module imports only the standard library: every tool (and ``harness.core``'s neighbours) can use it.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

OK, MISSED, BAD_INPUT, INTERRUPTED, INTERNAL = 0, 1, 2, 130, 70
"""Exit statuses: done; a target missed (only tools that judge targets); bad input (one ``error:`` line);
interrupted (Ctrl-C / SIGTERM); a defect of the tool (its traceback printed; sysexits.h ``EX_SOFTWARE``)."""

Number = Union[int, float]


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line, ``error: <message> (<prog> --help)``, exit status 2
    (:data:`BAD_INPUT`): argparse's own (an unknown flag, a missing one, a type error naming the flag, e.g.
    ``argument --skip-steps: must be an integer >= 0, got '-5'``) and a tool's ``ap.error(...)``. Its
    subcommands' parsers (``add_subparsers``) are of the same class."""

    def error(self, message: str):
        """Print ``error: <message>`` and exit 2 (argparse's hook; never returns).

        Raises:
            SystemExit: always, code 2.
        """
        self.exit(BAD_INPUT, f"error: {' '.join(str(message).split())} (see {self.prog} --help)\n")


def _range_text(lo: Optional[Number], hi: Optional[Number], lo_open: bool, hi_open: bool) -> str:
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi:g}")
    return " and ".join(parts)


def _in_range(v: Number, lo, hi, lo_open: bool, hi_open: bool) -> bool:
    return ((lo is None or (v > lo if lo_open else v >= lo))
            and (hi is None or (v < hi if hi_open else v <= hi)))


def parse_number(text: str, lo: Optional[Number] = None, hi: Optional[Number] = None, *, lo_open: bool = False,
                 hi_open: bool = False, integer: bool = False) -> Number:
    """``text`` as a finite number (an ``int`` with ``integer``) within ``[lo, hi]`` (an end ``None``: unbounded;
    ``lo_open`` / ``hi_open``: that end excluded).

    Raises:
        ValueError: not a number, not finite (``nan``, ``inf``), not an integer where one is needed, or out of
            range; the message says what was wanted and what was given (no flag: the caller names it).
    """
    rng = _range_text(lo, hi, lo_open, hi_open)
    want = ("an integer" if integer else "a finite number") + (f" {rng}" if rng else "")
    s = str(text).strip()
    try:
        v: Number = int(s) if integer else float(s)
    except ValueError:
        raise ValueError(f"must be {want}, got {text!r}") from None
    if not math.isfinite(v) or not _in_range(v, lo, hi, lo_open, hi_open):
        raise ValueError(f"must be {want}, got {text!r}")
    return v


def check_number(name: str, value: Number, lo: Optional[Number] = None, hi: Optional[Number] = None, *,
                 lo_open: bool = False, hi_open: bool = False) -> Number:
    """``value`` if it is a finite number within ``[lo, hi]`` (as :func:`parse_number`), for a bound a function is
    given rather than parsed (a NaN bound would switch a ``value > bound`` check off: every comparison with NaN is
    false).

    Raises:
        ValueError: naming ``name``, what was wanted and what was given.
    """
    try:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and _in_range(value, lo, hi, lo_open, hi_open)
    except TypeError:
        ok = False
    if not ok:
        rng = _range_text(lo, hi, lo_open, hi_open)
        raise ValueError(f"{name} must be a finite number{' ' + rng if rng else ''}, got {value!r}")
    return value


def number(lo: Optional[Number] = None, hi: Optional[Number] = None, *, lo_open: bool = False,
           hi_open: bool = False, integer: bool = False) -> Callable[[str], Number]:
    """An argparse ``type=``: a finite number in range (:func:`parse_number`); argparse names the flag in the
    error (``argument --margin: must be a finite number >= 0, got 'nan'``). ``number(0, lo_open=True)``: > 0;
    ``number(0, integer=True)``: an integer >= 0."""
    def conv(text: str) -> Number:
        try:
            return parse_number(text, lo, hi, lo_open=lo_open, hi_open=hi_open, integer=integer)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    conv.__name__ = "integer" if integer else "number"
    return conv


def number_list(lo: Optional[Number] = None, hi: Optional[Number] = None, *, lo_open: bool = False,
                hi_open: bool = False, integer: bool = False, min_len: int = 1,
                max_len: Optional[int] = None, ranges: bool = False) -> Callable[[str], list]:
    """An argparse ``type=``: a comma-separated list of :func:`parse_number` values (``"23,22,24"``), at least
    ``min_len`` and at most ``max_len`` of them; with ``ranges`` (integers only) ``"a-b"`` is the integers a..b
    (``"0-9"``). Raises ``argparse.ArgumentTypeError`` naming the bad item (argparse adds the flag)."""
    def conv(text: str) -> list:
        s = str(text).strip()
        try:
            if ranges and integer and "," not in s and "-" in s:
                a, _, b = s.partition("-")
                a_, b_ = (parse_number(x, lo, hi, lo_open=lo_open, hi_open=hi_open, integer=True) for x in (a, b))
                if b_ < a_:
                    raise ValueError(f"range {text!r}: the end is below the start")
                out: list = list(range(int(a_), int(b_) + 1))
            else:
                items = s.split(",")
                if any(not x.strip() for x in items):
                    raise ValueError(f"an empty item in {text!r}")
                out = [parse_number(x, lo, hi, lo_open=lo_open, hi_open=hi_open, integer=integer) for x in items]
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{e} (a comma-separated list{', or a-b' if ranges else ''})") from None
        if len(out) < min_len or (max_len is not None and len(out) > max_len):
            n = f"{min_len}" if max_len == min_len else (f"{min_len} to {max_len}" if max_len else f">= {min_len}")
            raise argparse.ArgumentTypeError(f"needs {n} value(s), got {len(out)} in {text!r}")
        return out
    conv.__name__ = "list"
    return conv


def writable_problem(path: Union[str, Path], directory: bool = False) -> Optional[str]:
    """Why ``path`` (a file to write, or a ``directory`` to create or write into) cannot be written, else None;
    checked without creating anything: the path itself where it exists (a directory for ``directory``, else not a
    directory), and the nearest existing ancestor a writable directory (``os.access``; a read-only file system
    counts: access(2) reports EROFS). The process's user is root in some containers: mode bits are then no
    obstacle and only a file in the way or a read-only mount is found."""
    p = Path(path).expanduser()
    p = p if p.is_absolute() else Path.cwd() / p
    if p.exists():
        if directory and not p.is_dir():
            return f"{path} is not a directory"
        if not directory and p.is_dir():
            return f"{path} is a directory"
        if not os.access(p, os.W_OK | (os.X_OK if directory else 0)):
            return f"{path}: not writable"
        return None
    for anc in p.parents:
        if anc.exists():
            if not anc.is_dir():
                return f"{path}: {anc} is not a directory"
            if not os.access(anc, os.W_OK | os.X_OK):
                return f"{path}: {anc} is not writable"
            return None
    return None


def writable(directory: bool = False) -> Callable[[str], Path]:
    """An argparse ``type=``: a path that can be written (:func:`writable_problem`), as a ``Path``; a file to
    write, or with ``directory`` a directory to create or write into."""
    def conv(text: str) -> Path:
        why = writable_problem(text, directory)
        if why:
            raise argparse.ArgumentTypeError(f"cannot write {why}")
        return Path(text)
    conv.__name__ = "path"
    return conv


def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")


def run(main: Callable[[Optional[Sequence[str]]], Optional[int]], argv: Optional[Sequence[str]] = None) -> int:
    """Run a tool's ``main(argv)`` under the contract of this module and return its exit status (for
    ``sys.exit``): ``main``'s own status (None: 0); SIGTERM raised as ``KeyboardInterrupt`` (as ``run.py`` does,
    so a tool's own handler writes what it measured), and a ``KeyboardInterrupt`` that reaches here one line,
    ``interrupted (...)``, and 130; an ``OSError`` (a file that cannot be read or written) one ``error:`` line
    naming the file, 2; any other exception its traceback and an ``error: internal error`` line, 70 (never 1:
    that is "a target missed"). ``SystemExit`` (argparse's 2, a tool's ``sys.exit``) passes through. The SIGTERM
    handler is set only in the main thread and restored afterwards."""
    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTERM, _sigterm)
    try:
        rc = main(argv)
        return OK if rc is None else int(rc)
    except KeyboardInterrupt as e:
        why = str(e) or "Ctrl-C"
        print(f"interrupted ({why})", file=sys.stderr)
        return INTERRUPTED
    except OSError as e:
        where = e.filename if e.filename is not None else ""
        print(f"error: {where}{': ' if where else ''}{e.strerror or e}", file=sys.stderr)
        return BAD_INPUT
    except Exception as e:   # a defect of the tool: its traceback, and a status that is no verdict
        traceback.print_exc()
        print(f"error: internal error ({type(e).__name__}: {e}); the traceback above is a defect of the tool",
              file=sys.stderr)
        return INTERNAL
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass


def _quiet_worker(initializer: Optional[Callable], initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the parent's: it terminates the pool
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # Pool.terminate() stops a worker at once, silently
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    if initializer is not None:
        initializer(*initargs)


def quiet_pool(processes: int, method: str = "fork", initializer: Optional[Callable] = None,
               initargs: tuple = ()):
    """A ``multiprocessing`` pool of ``processes`` workers (start ``method``) that leave Ctrl-C to the parent:
    SIGINT and SIGTERM are blocked while the workers start (a signal then waits for the parent), each worker
    ignores SIGINT and dies silently on SIGTERM, so a Ctrl-C (sent by a terminal to the whole process group)
    prints no traceback per worker; the parent's ``KeyboardInterrupt`` should end in ``pool.terminate()``
    (stops the workers mid-task) rather than ``close(); join()`` (waits for their tasks)."""
    import multiprocessing as mp
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        return mp.get_context(method).Pool(processes, initializer=_quiet_worker, initargs=(initializer, initargs))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
