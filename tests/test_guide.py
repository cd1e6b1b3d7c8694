"""The commands of docs/guide.md compose and resolve as written: every ``python run.py`` line of its ``bash`` blocks
(continuations joined) goes through Hydra and ``harness.run.config.resolve`` (``tests.conftest.compose_run``) with
its own overrides, so a key renamed, removed or given a value the code refuses fails here rather than in a new
user's hands. ``hydra/...`` and ``hydra.*`` overrides are left out (they configure the launcher, which composing a
job does not read); a multirun's swept key is composed at its first value (every registered scheduler composes in
tests/test_config.py; here the six-way comparison's names are checked against the registry). Nothing is run: the
guide states what each command printed when run."""

from __future__ import annotations

import re
import shlex

import pytest

from harness.core.paths import PROJECT_ROOT
from tests.conftest import compose_run

GUIDE = PROJECT_ROOT / "docs" / "guide.md"


def guide_commands(text: str) -> list[list[str]]:
    """The argument lists after ``python run.py`` of every such command in the page's ``bash`` blocks."""
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" # ")[0].strip()
            for part in line.split("&&"):
                words = shlex.split(part.strip(), comments=True)
                if words[:2] == ["python", "run.py"]:
                    cmds.append(words[2:])
    return cmds


def job_overrides(args: list[str]) -> list[str]:
    """One job's overrides for a command: launcher settings left out, a swept key at its first value."""
    keep = [a for a in args if a != "-m" and not a.lstrip("+").startswith(("hydra/", "hydra."))]
    out = []
    for a in keep:
        key, _, value = a.partition("=")
        out.append(f"{key}={value.split(',')[0]}" if "-m" in args and not value.startswith("[") else a)
    return out


def test_the_guide_has_the_five_tasks_commands():
    """The parser finds the commands of the five sections (by hand from the page: 2 main job, 1 six-way, 5 sweeps:
    Ray local and remote, Slurm, and the chunked pool_slurm and pool_ray, 1 vllm-cpu, 2 GPU); the six-way comparison
    names the six variants, each registered."""
    cmds = guide_commands(GUIDE.read_text())
    assert len(cmds) == 11, cmds
    six = [a for c in cmds for a in c if a.startswith("scheduler=") and len(a.split(",")) == 6]
    assert len(six) == 1
    from harness.core.schedulers import registered
    names = six[0].partition("=")[2].split(",")
    assert names == ["conserve", "ampd", "collocated", "disaggregated", "wait", "nested_wait"]
    assert set(names) <= set(registered())


@pytest.mark.parametrize("args", guide_commands(GUIDE.read_text()), ids=lambda a: " ".join(a)[:60])
def test_every_guide_command_composes_and_resolves(args):
    compose_run(job_overrides(args))
