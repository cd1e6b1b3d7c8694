"""The command-line contract every tool holds, as ``run.py`` does (issue 50; ``harness/core/cmdline.py``): a bad
argument -- a number that is not finite or out of its range, a bad profile, overrides that do not compose, an output
path that cannot be written -- is one ``error:`` line naming the flag (or file), exit status 2, no traceback, and is
refused before any work (no output directory, no run, no server); Ctrl-C exits 130 without a traceback. Each tool runs
as a subprocess, as a user runs it. On main 8d1e9e4 each case below was accepted (a NaN bound switching off the
contention refusal, ``--skip-steps -5``), exited 1 with a traceback (a bad profile for ``fidelity steps``, ``--heldout
workload.bogus=1``, ``calibrate --out`` under a file, Ctrl-C of ``wait_table`` / ``seeds``), or printed argparse's
usage block and ``prog: error:`` instead of one ``error:`` line.

The bad-argument cases run each tool's ``main(argv)`` in the test's process under ``cmdline.run``, which is what
the tool's ``if __name__ == "__main__": sys.exit(cmdline.run(main))`` runs (checked from the sources for every tool
named here, :func:`test_every_tool_named_here_exits_through_cmdline_run`), with stdout and stderr captured: one
import per worker instead of a Python start-up with numpy, pandas and Hydra per case (37 of them took ~150 s of the
suite). Real subprocesses stay where the contract is the process's: a few bad-argument cases end to end
(``SUBPROCESS``), the driver whose child refuses its arm (seeds), and Ctrl-C (a signal to the process group)."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.core import cmdline
from harness.core.paths import PROJECT_ROOT

SCRIPTS = PROJECT_ROOT / "scripts"
SHIPPED = PROJECT_ROOT / "traces" / "swebench_verified_mini_gemini3pro.jsonl.gz"


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), HARNESS_CACHE_DIR="off")
    env.pop("HARNESS_TEST_INTERRUPT", None)
    return env


def tool(*args, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python <args>`` (``-m module ...`` or a script path) in a subprocess, from ``cwd``."""
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=_env())


_SCRIPTS_LOADED: dict = {}


def _tool_module(args: list):
    """The module a command line ``python <args>`` runs (``-m module ...`` or a script path) and the tool's
    arguments. A script is loaded once per process from its path, under the name ``_cli_<stem>`` (its own
    ``sys.path`` inserts, the project root and scripts/, are what it does when run)."""
    if args[0] == "-m":
        return importlib.import_module(args[1]), args[2:]
    path = Path(args[0])
    if path not in _SCRIPTS_LOADED:
        spec = importlib.util.spec_from_file_location(f"_cli_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _SCRIPTS_LOADED[path] = mod
    return _SCRIPTS_LOADED[path], args[1:]


def in_process(*args, cwd: Path, monkeypatch, capsys) -> subprocess.CompletedProcess:
    """``python <args>`` run in this process, as its ``__main__`` block does (``sys.exit(cmdline.run(main))``):
    the tool's ``main(argv)`` under :func:`harness.core.cmdline.run` from ``cwd`` with :func:`_env`'s
    variables; ``SystemExit`` (argparse's 2) becomes the status as the interpreter would make it. Returns what
    :func:`tool` returns (status, stdout, stderr)."""
    args = [str(a) for a in args]
    monkeypatch.chdir(cwd)
    for k, v in _env().items():
        if os.environ.get(k) != v:
            monkeypatch.setenv(k, v)
    monkeypatch.delenv("HARNESS_TEST_INTERRUPT", raising=False)
    mod, argv = _tool_module(args)
    capsys.readouterr()
    try:
        rc = cmdline.run(mod.main, argv)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            rc = e.code or 0
        else:   # sys.exit("text"): the interpreter prints it to stderr and exits 1
            print(e.code, file=sys.stderr)
            rc = 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out, err)


def one_error_line(p: subprocess.CompletedProcess) -> str:
    """Exit status 2 and the only line of stderr, which starts ``error:`` (no usage block, no traceback)."""
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert p.returncode == 2, (p.returncode, p.stderr[-3000:])
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr[-3000:]
    return lines[0]


# ---- bad numbers, per tool and subcommand: one line naming the flag, exit 2, before any work ---------------

# (case id, the command after `python`, the flag the line must name); RUN: a run directory (not needed: every
# case is refused while parsing), OUT: where the tool would write (must not exist afterwards)
BAD = [
    ("fidelity-steps-skip-steps", ["-m", "harness.tools.fidelity", "steps", "RUN", "--profile", "cpu", "--out", "OUT",
                                   "--skip-steps", "-5"], "--skip-steps"),
    ("fidelity-steps-load-nan", ["-m", "harness.tools.fidelity", "steps", "RUN", "--profile", "cpu", "--out", "OUT",
                                 "--max-load-per-cpu", "nan"], "--max-load-per-cpu"),
    ("fidelity-steps-dispersion-nan", ["-m", "harness.tools.fidelity", "steps", "RUN", "--profile", "cpu", "--out",
                                       "OUT", "--max-dispersion", "nan"], "--max-dispersion"),
    # the protocol's cases carry an override Hydra refuses, so that on 8d1e9e4 (which accepted the NaN) the
    # command stopped at the composition and never launched a server
    ("protocol-load-nan", ["-m", "harness.tools.fidelity", "protocol", "--profile", "cpu", "--out", "OUT",
                           "--heldout", "backend=vllm", "workload.bogus=1", "--max-load-per-cpu", "nan"],
     "--max-load-per-cpu"),
    ("protocol-dispersion-nan", ["-m", "harness.tools.fidelity", "protocol", "--profile", "cpu", "--out", "OUT",
                                 "--heldout", "backend=vllm", "workload.bogus=1", "--max-dispersion", "nan"],
     "--max-dispersion"),
    ("protocol-skip-steps", ["-m", "harness.tools.fidelity", "protocol", "--profile", "cpu", "--out", "OUT",
                             "--heldout", "backend=vllm", "workload.bogus=1", "--skip-steps", "-5"], "--skip-steps"),
    ("calibrate-rel-se-bound-nan", ["-m", "harness.tools.calibrate", "RUN", "--out", "OUT/p.yaml", "--from-steps",
                                    "--rel-se-bound", "nan"], "--rel-se-bound"),
    ("seeds-margin-nan", ["-m", "harness.analysis.seeds", "OUT", "--a", "scheduler=conserve", "--b", "scheduler=ampd",
                          "--metric", "ttft_mean_s", "--margin", "nan"], "--margin"),
    ("seeds-halfwidth-inf", ["-m", "harness.analysis.seeds", "OUT", "--a", "scheduler=conserve", "--b",
                             "scheduler=ampd", "--metric", "ttft_mean_s", "--target-halfwidth", "inf"],
     "--target-halfwidth"),
    ("seeds-paper-effect-nan", ["-m", "harness.analysis.seeds", "OUT", "--a", "scheduler=conserve", "--b",
                                "scheduler=ampd", "--metric", "ttft_mean_s:nan"], "--metric"),
    ("tracestats-block-size-nan", ["-m", "harness.tools.tracestats", "stats", str(SHIPPED), "--block-size", "nan"],
     "--block-size"),
    ("tracestats-cache-tokens-zero", ["-m", "harness.tools.tracestats", "stats", str(SHIPPED), "--cache-tokens", "0"],
     "--cache-tokens"),
    ("report-margin-nan", ["-m", "harness.analysis.report", "RUN", "--out", "OUT", "--margin", "nan"], "--margin"),
    ("wait-table-cap-tol-nan", [SCRIPTS / "wait_table.py", "--out", "OUT", "--cap-tol", "nan"], "--cap-tol"),
    ("wait-table-rate-nan", [SCRIPTS / "wait_table.py", "--out", "OUT", "--rates", "20,nan"], "--rates"),
    ("wait-table-rate-negative", [SCRIPTS / "wait_table.py", "--out", "OUT", "--rates", "-1"], "--rates"),
    ("wait-table-cap-arms", [SCRIPTS / "wait_table.py", "--out", "OUT", "--cap-arms", "sarathi,bogus"], "--cap-arms"),
    ("wait-memory-rate-nan", [SCRIPTS / "wait_memory.py", "--out", "OUT", "--rates", "4,nan"], "--rates"),
    ("wait-memory-above-1", [SCRIPTS / "wait_memory.py", "--out", "OUT", "--memory", "0.99,1.5"], "--memory"),
    ("wait-memory-arm", [SCRIPTS / "wait_memory.py", "--out", "OUT", "--arms", "sarathi,bogus"], "--arms"),
    ("wait-memory-capacity-order", [SCRIPTS / "wait_memory.py", "--out", "OUT", "--capacity", "2.5,1.5"], "--capacity"),
    ("wait-memory-fractions-alone", [SCRIPTS / "wait_memory.py", "--out", "OUT", "--fractions", "0.8"], "--fractions"),
    ("wait-memory-cap-arm", [SCRIPTS / "wait_memory.py", "--out", "OUT", "--cap-arms", "bogus"], "--cap-arms"),
    ("wait-check-rate-nan", [SCRIPTS / "wait_check.py", "--rates", "nan"], "--rates"),
    ("vidur-wait-step-models-n", [SCRIPTS / "vidur_wait_step_models.py", "--n", "-3"], "--n"),
    ("fit-power-model-prompt-nan", [SCRIPTS / "fit_power_model.py", "--prompt", "nan"], "--prompt"),
    ("fit-step-model-peak-nan", [SCRIPTS / "fit_step_model.py", "--peak", "x=nan"], "--peak"),
    ("gpu-step-profile-fracs", [SCRIPTS / "gpu_step_profile.py", "--model", "tiny", "--label", "cpu", "--out", "OUT",
                                "--prefix-fracs", "0,nan"], "--prefix-fracs"),
]


# the cases of BAD also run as real subprocesses (a module's and a script's ``__main__`` end to end)
SUBPROCESS = ("fidelity-steps-skip-steps", "wait-table-rate-nan")


def _bad_args(args: list, tmp_path: Path) -> tuple[list, Path]:
    out = tmp_path / "out"
    return [str(out) if a == "OUT" else str(out / "p.yaml") if a == "OUT/p.yaml" else
            str(tmp_path / "run") if a == "RUN" else a for a in args], out


@pytest.mark.parametrize("args,flag", [pytest.param(a, f, id=i) for i, a, f in BAD])
def test_a_bad_number_is_one_line_naming_the_flag_and_exit_2_before_any_work(tmp_path, monkeypatch, capsys, args,
                                                                               flag):
    args, out = _bad_args(args, tmp_path)
    line = one_error_line(in_process(*args, cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys))
    assert flag in line, line
    assert not out.exists()   # nothing was written: refused while parsing


@pytest.mark.parametrize("args,flag", [pytest.param(a, f, id=i) for i, a, f in BAD if i in SUBPROCESS])
def test_a_bad_number_in_a_real_process_is_one_line_and_exit_2(tmp_path, args, flag):
    """The same contract with the tool as a user runs it: its own interpreter, ``__main__`` block and exit status."""
    args, out = _bad_args(args, tmp_path)
    line = one_error_line(tool(*args, cwd=tmp_path))
    assert flag in line, line
    assert not out.exists()


def _tool_files() -> dict:
    """The source file of every tool a command line of this module runs (``-m module`` or a script)."""
    cmds = [a for _, a, _ in BAD] + [["-m", "harness.tools.fidelity"], ["-m", "harness.tools.calibrate"],
                                      ["-m", "harness.analysis.export"], ["-m", "harness.analysis.seeds"]]
    files = {}
    for a in cmds:
        if a[0] == "-m":
            files[a[1]] = Path(importlib.util.find_spec(a[1]).origin)
        else:
            files[Path(a[0]).name] = Path(a[0])
    return files


def test_every_tool_named_here_exits_through_cmdline_run():
    """What makes the in-process cases the tools' own runs: each tool's module ends with ``if __name__ ==
    "__main__": sys.exit(cmdline.run(main))`` and nothing else in that block (read from the source)."""
    want = ast.dump(ast.parse("sys.exit(cmdline.run(main))").body[0])
    for name, path in _tool_files().items():
        tree = ast.parse(path.read_text())
        blocks = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "__name__ == '__main__'"]
        assert len(blocks) == 1, (name, "no single __main__ block")
        assert [ast.dump(b) for b in blocks[0].body] == [want], (name, ast.unparse(blocks[0]))


# ---- bad input found beyond the numbers ---------------------------------------------------------------------

def test_fidelity_steps_names_a_bad_profile_and_exits_2(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n  peak_flops: [\n")   # not YAML
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("model: {}\n")
    line = one_error_line(in_process("-m", "harness.tools.fidelity", "steps", tmp_path / "run", "--profile", bad,
                                     cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys))
    assert str(bad) in line and "mapping values are not allowed" in line, line


def test_fidelity_protocol_names_a_heldout_override_that_does_not_compose(tmp_path, monkeypatch, capsys):
    line = one_error_line(in_process("-m", "harness.tools.fidelity", "protocol", "--profile", "cpu", "--out",
                                     tmp_path / "p", "--heldout", "backend=vllm", "workload.bogus=1", cwd=tmp_path,
                                     monkeypatch=monkeypatch, capsys=capsys))
    assert line.startswith("error: --heldout:") and "workload.bogus" in line, line
    assert not (tmp_path / "p" / "calibration").exists()   # nothing was launched


@pytest.mark.parametrize("tool_args", [
    pytest.param(["-m", "harness.tools.calibrate", "RUN", "--out", "FILE/p.yaml"], id="calibrate"),
    pytest.param(["-m", "harness.analysis.export", "RUN", "--format", "vllm-bench", "--out", "FILE/x"], id="export"),
    pytest.param(["-m", "harness.tools.fidelity", "steps", "RUN", "--profile", "cpu", "--out", "FILE/x"],
                 id="fidelity-steps"),
])
def test_an_output_path_that_cannot_be_written_is_refused_before_the_fit(tmp_path, monkeypatch, capsys, tool_args):
    """An ``--out`` under a regular file (root ignores mode bits, so a read-only directory is no test here): one
    line naming ``--out`` and the file in the way, before the run directory is even read."""
    (tmp_path / "file").write_text("")
    args = [str(tmp_path / "run") if a == "RUN" else a.replace("FILE", str(tmp_path / "file")) for a in tool_args]
    line = one_error_line(in_process(*args, cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys))
    assert "--out" in line and f"{tmp_path / 'file'} is not a directory" in line, line


def test_seeds_exits_2_when_run_py_refuses_the_cells_rate(tmp_path):
    """A rate that is not a finite number > 0 in the cell's overrides: run.py refuses every job of the arm before it
    runs one (exit 2), and the driver reports it as bad input (2, one line naming the key), not as a failed run
    (1) with run.py's whole error block."""
    line = one_error_line(tool("-m", "harness.analysis.seeds", tmp_path / "s", "workload.rate_per_s=-1", "--a",
                               "scheduler=conserve", "--b", "scheduler=ampd", "--metric", "ttft_mean_s",
                               "--min-seeds", "2", "--max-seeds", "2", cwd=tmp_path))
    assert "workload.rate_per_s must be a finite number > 0" in line, line
    assert not list((tmp_path / "s").glob("*/*/summary.json"))


# ---- Ctrl-C: 130, no traceback ---------------------------------------------------------------------------------

def _interrupt_when(cmd: list, ready, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """Start ``cmd`` in its own process group (SIGINT at its default: a background shell would have it ignored),
    wait until ``ready(pid)`` (the tool is at work), then send SIGINT to the whole group, as a terminal's Ctrl-C
    does, and collect it."""
    p = subprocess.Popen([sys.executable, *map(str, cmd)], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=_env(), start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + timeout
        while not ready(p.pid):
            assert p.poll() is None, f"exited {p.returncode} before it was at work: {p.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, "never got to work"
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_stops_wait_table_with_130_and_no_traceback(tmp_path, jobs):
    """Ctrl-C while the simulations run (in the tool itself, or in its worker pool: every worker gets the
    terminal's SIGINT too): one ``interrupted`` line, exit 130, no traceback from the tool or a worker."""
    out = tmp_path / "out"
    p = _interrupt_when([SCRIPTS / "wait_table.py", "--out", out, "--rates", "20", "--seeds", "0,1", "--n", "1500",
                         "--jobs", jobs, "--no-capacity"], lambda pid: (out / "runs.csv").exists(), tmp_path)
    assert p.returncode == 130, (p.returncode, p.stderr[-3000:])
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "interrupted" in p.stderr and str(out / "runs.csv") in p.stderr


def test_ctrl_c_stops_seeds_with_130_and_no_traceback(tmp_path):
    """Ctrl-C while the driver waits on its ``run.py -m`` child: exit 130, no traceback."""
    p = _interrupt_when(["-m", "harness.analysis.seeds", tmp_path / "s", "--a", "scheduler=conserve", "--b",
                         "scheduler=ampd", "--metric", "ttft_mean_s", "--min-seeds", "2", "--max-seeds", "2"],
                        lambda pid: bool(_children(pid)), tmp_path)
    assert p.returncode == 130, (p.returncode, p.stderr[-3000:])
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "interrupted" in p.stderr


# ---- the layer itself ---------------------------------------------------------------------------------------

def test_number_checks_finiteness_and_range_by_hand():
    pos = cmdline.number(0, lo_open=True)
    assert pos("0.35") == 0.35 and pos("1e3") == 1000.0
    for bad in ("nan", "inf", "-inf", "0", "-1", "x", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="must be a finite number > 0"):
            pos(bad)
    count = cmdline.number(0, integer=True)
    assert count("0") == 0 and count(" 8 ") == 8
    for bad in ("-5", "1.5", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be an integer >= 0"):
            count(bad)
    frac = cmdline.number(0, 1, hi_open=True)
    assert frac("0") == 0.0 and frac("0.9") == 0.9
    with pytest.raises(argparse.ArgumentTypeError, match=r">= 0 and < 1"):
        frac("1")


def test_number_list_and_seed_ranges_by_hand():
    seeds = cmdline.number_list(0, integer=True, ranges=True, min_len=2)
    assert seeds("0-9") == list(range(10)) and seeds("3,1") == [3, 1]
    for bad in ("0", "5-3", "0,,1", "0,nan", "-1-3"):
        with pytest.raises(argparse.ArgumentTypeError):
            seeds(bad)
    bracket = cmdline.number_list(0, lo_open=True, min_len=2, max_len=2)
    assert bracket("16,28") == [16.0, 28.0]
    with pytest.raises(argparse.ArgumentTypeError, match="needs 2 value"):
        bracket("16,20,28")


def test_writable_finds_a_file_in_the_way_without_creating_anything(tmp_path):
    (tmp_path / "f").write_text("")
    assert cmdline.writable_problem(tmp_path / "new" / "deeper" / "p.yaml") is None
    assert not (tmp_path / "new").exists()
    assert "is not a directory" in cmdline.writable_problem(tmp_path / "f" / "p.yaml")
    assert "is a directory" in cmdline.writable_problem(tmp_path)
    assert "is not a directory" in cmdline.writable_problem(tmp_path / "f", directory=True)


def test_run_maps_interrupts_file_errors_and_defects_to_their_statuses(capsys):
    """130 for Ctrl-C, 2 for a file that cannot be written (one line naming it), 70 for a defect (traceback kept):
    never 1, which a tool that judges targets keeps for a missed target."""
    def interrupted(argv):
        raise KeyboardInterrupt

    def unwritable(argv):
        raise OSError(28, "No space left on device", "/x/summary.json")

    def defect(argv):
        return {}["missing"]
    assert cmdline.run(interrupted) == 130
    assert capsys.readouterr().err.strip() == "interrupted (Ctrl-C)"
    assert cmdline.run(unwritable) == 2
    assert capsys.readouterr().err.strip() == "error: /x/summary.json: No space left on device"
    assert cmdline.run(defect) == cmdline.INTERNAL == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError" in err and err.strip().splitlines()[-1].startswith("error: internal")
    assert cmdline.run(lambda argv: 1) == 1 and cmdline.run(lambda argv: None) == 0


def test_a_nan_or_negative_bound_cannot_switch_the_contention_guards_off(tmp_path):
    """The guards themselves refuse a bound that is not a finite number > 0 (every comparison with NaN is false, so
    ``figure > nan`` would pass any figure), whoever calls them: the protocol before it launches anything."""
    from harness.tools import protocol as pr
    from harness.tools import steps as st
    from harness.tools.fidelity import protocol
    figures = {"ncpu": 2, "loadavg_before": 9.0}
    assert pr.contention_problem(figures).startswith("1-minute load average 9.00")
    for kw in ({"max_load_per_cpu": math.nan}, {"max_dispersion": -0.1}, {"max_load_after_per_cpu": math.inf}):
        with pytest.raises(ValueError, match=f"{next(iter(kw))} must be a finite number > 0"):
            pr.contention_problem(figures, **kw)
    with pytest.raises(ValueError, match="max_dispersion must be a finite number > 0, got nan"):
        st.contention(tmp_path, None, {}, max_dispersion=math.nan)
    launched = []
    for kw in ({"max_load_per_cpu": math.nan}, {"max_dispersion": math.nan}, {"settle_s": -1.0}, {"skip_steps": -5}):
        with pytest.raises(ValueError, match=f"{next(iter(kw))} must be a finite number"):
            protocol(tmp_path / "p", "cpu", ["backend=vllm"], launch=lambda ov, d: launched.append(d), **kw)
    assert launched == [] and not (tmp_path / "p").exists()
