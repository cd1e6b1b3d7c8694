"""Shared fixtures: compose the real Hydra config, build tiny synthetic traces."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from harness.config import PROJECT_ROOT, register_configs, resolve
from harness.trace import ConversationRecord, TurnRecord

SHARED = Path(__file__).resolve().parents[2] / "shared"


def compose_cfg(overrides=()):
    """The project's real config (conf/config.yaml) with Hydra overrides, unresolved DictConfig."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def compose_run(overrides=()):
    """A validated ``Resolved`` run for the given overrides."""
    return resolve(compose_cfg(overrides))


def conversation(cid: str, turns: list[tuple[int, int, int, float]]) -> ConversationRecord:
    """A conversation from ``(reused, new, output, tool_time_s)`` per turn; the last turn is visible."""
    recs = []
    for k, (reused, new, out, tool) in enumerate(turns):
        recs.append(TurnRecord(new_input_tokens=new, reused_tokens=reused, output_tokens=out,
                               tool_time_s=tool if k < len(turns) - 1 else 0.0,
                               visible=k == len(turns) - 1, output_tokens_raw=out))
    return ConversationRecord(cid, tuple(recs), "synthetic")


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory):
    """The on-disk caches (``harness.session.cache_root``) of the tests' runs go to a fresh directory, never
    to ``results/cache`` (subprocesses inherit it through the environment)."""
    import os
    old = os.environ.get("HARNESS_CACHE_DIR")
    os.environ["HARNESS_CACHE_DIR"] = str(tmp_path_factory.mktemp("harness_cache"))
    yield
    if old is None:
        os.environ.pop("HARNESS_CACHE_DIR", None)
    else:
        os.environ["HARNESS_CACHE_DIR"] = old


@pytest.fixture
def shared_dir():
    if not SHARED.is_dir():
        pytest.skip("../shared not present")
    return SHARED


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie that nobody reaped counts as gone)."""
    import os
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
