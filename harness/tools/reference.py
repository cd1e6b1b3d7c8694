"""The reference pages, generated from the code:

    python -m harness.tools.reference            # writes docs/reference/config.md and docs/reference/metrics.md
    python -m harness.tools.reference --check    # exit 1 when a shipped page differs from its regeneration

``config.md``: every config group of the run (the fields of ``harness.run.config.RunConfig``, in order) with its
options (the YAML files of ``conf/<group>/``; for ``scheduler`` and ``backend`` the registry's names), and every
key of its dataclass (nested dataclasses flattened with their parent's prefix, ``predictor.sigma``): type,
default, and the description the dataclass's docstring gives it (:func:`key_description`). ``metrics.md``: every
metric of the catalogue (``harness.analysis.catalog.CATALOG``) with its unit, definition and source, marked
where the main job prints it (``TABLE``). Nothing here is written by hand: a key or metric added to the code
appears on the next regeneration, and ``tests/test_reference.py`` fails until its description exists.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any, Optional

from harness.core.paths import PROJECT_ROOT

PAGES = ("config", "metrics")
MAX_DESCRIPTION = 400
"""Characters of a key's docstring clause shown (longer ones end with an ellipsis), characters."""


def _flat(doc: Optional[str]) -> str:
    return " ".join(inspect.cleandoc(doc or "").split())


def key_description(cls: type, key: str) -> str:
    """The clause of ``cls``'s docstring that describes ``key`` (its last dotted part, the leaf): from the leaf's
    definition (``leaf:``, else its first mention as ````leaf````, else as a word; a per-reading key such as ``ttfet_first_mode`` also as
    ``ttfet_<r>_mode``) to the end of its clause (the first ``;`` or sentence end outside brackets), at most
    :data:`MAX_DESCRIPTION` characters. ``""`` when the docstring does not name the key."""
    text = _flat(cls.__doc__)
    leaf = key.rsplit(".", 1)[-1]
    names = [leaf, re.sub(r"_(first|visible|serving)_", "_<r>_", leaf)]
    m = None
    for name in dict.fromkeys(names):
        n = re.escape(name)
        pats = [rf"(?<![\w.<>`]){n}(?=:)", rf"``{n}``", rf"(?<![\w.<>]){n}(?![\w<>])"]
        for pat in pats[:2] if leaf == "name" else pats:   # "name" as a plain word is rarely the key
            m = re.search(pat, text)
            if m:
                break
        if m:
            break
    if not m:
        return ""
    depth, end = 0, len(text)
    for i in range(m.end(), len(text)):
        ch = text[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:          # the clause sat inside brackets: it ends with them
                end = i
                break
            depth -= 1
        elif depth == 0 and text.startswith(", ``", i):    # the next key of a list: ``a`` (...), ``b`` (...)
            end = i
            break
        elif depth == 0 and (ch == ";" or (ch == "." and (i + 1 == len(text) or text[i + 1] == " ")
                                             and not re.search(r"(e\.g|i\.e|etc|vs)$", text[max(0, i - 4):i]))):
            end = i
            break
    clause = text[m.start():end].strip()
    return clause if len(clause) <= MAX_DESCRIPTION else clause[:MAX_DESCRIPTION - 1].rstrip() + "…"


def config_keys(cls: type, prefix: str = "") -> list[tuple[type, str, dataclasses.Field]]:
    """``(owning dataclass, dotted key, field)`` for every key of config dataclass ``cls``; a field whose default is a
    dataclass is flattened into its keys with its name as the prefix."""
    out = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out += config_keys(type(default), f"{prefix}{f.name}.")
        else:
            out.append((cls, prefix + f.name, f))
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default_factory is not dataclasses.MISSING:
        v = f.default_factory()
    elif f.default is dataclasses.MISSING:
        return "required"
    else:
        v = f.default
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _options(group: str) -> list[str]:
    d = PROJECT_ROOT / "conf" / group
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def _key_table(cls: type, group: str, prefix: str = "") -> list[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for owner, key, f in config_keys(cls):
        desc = key_description(owner, key)
        if not desc and key == "name":
            desc = f"the option's name (`{group}=<name>`)"
        lines.append(f"| `{prefix}{key}` | `{_cell(str(f.type))}` | `{_cell(_default(f))}` | {_cell(desc)} |")
    return lines


def shipped(cls: type) -> bool:
    """Whether a registered config class ships with this project (defined under ``harness`` or ``baselines``), not
    in another installed package or a test that registered its own: the reference is the project's."""
    return cls.__module__.split(".")[0] in ("harness", "baselines")


def group_classes() -> list[tuple[str, Any, list[tuple[str, type]]]]:
    """``(group, RunConfig field, [(option or "", dataclass)])`` for every group of the run config: one dataclass
    for most groups; per profile for ``hardware`` (the same class); per registered variant / backend for
    ``scheduler`` and ``backend`` (the registry's config classes, the :func:`shipped` ones); none for a scalar
    (``seed``)."""
    from harness.core.backend import backends
    from harness.core.profiles import HardwareConfig
    from harness.core.schedulers import get_spec, registered
    from harness.run.config import RunConfig
    out = []
    for f in dataclasses.fields(RunConfig):
        if f.name == "hardware":
            out.append((f.name, f, [("", HardwareConfig)]))
        elif f.name == "scheduler":
            out.append((f.name, f, [(n, get_spec(n).config_cls) for n in registered()
                                    if shipped(get_spec(n).config_cls)]))
        elif f.name == "backend":
            out.append((f.name, f, [(n, s.config_cls) for n, s in sorted(backends().items()) if shipped(s.config_cls)]))
        else:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out.append((f.name, f, [("", type(default))] if dataclasses.is_dataclass(default) else []))
    return out


def config_page() -> str:
    """``docs/reference/config.md``: every group, option and key of the run config (module docstring)."""
    out = ["# Config reference (generated)", "",
           "Generated by `python -m harness.tools.reference` from the config dataclasses (`harness.run.config.RunConfig` "
           "and the classes it holds), the scheduler and backend registries and `conf/<group>/*.yaml`: do not edit by "
           "hand (`tests/test_reference.py` checks it is current and that every key has a description). The "
           "description of a key is the clause its dataclass's docstring gives it; the worked examples, units and "
           "allowed values in prose are in [`conf/README.md`](../../conf/README.md). Set any key on the command line: "
           "`python run.py <group>.<key>=<value>`; pick an option: `python run.py <group>=<option>`.", ""]
    for group, f, classes in group_classes():
        out += [f"## {group}", ""]
        opts = _options(group)
        if group in ("scheduler", "backend"):
            opts = [n for n, _ in classes]
        if opts:
            out += ["Options: " + ", ".join(f"`{o}`" for o in opts) + ".", ""]
        if not classes:
            out += [f"`{group}`: `{f.type}`, default `{_cell(_default(f))}`.", ""]
            continue
        for option, cls in classes:
            head = _flat(cls.__doc__).split(". ")[0].rstrip(".")
            where = f"{cls.__module__}.{cls.__qualname__}"
            if option:
                out += [f"### {group}={option}", ""]
            out += [f"`{where}`: {_cell(head)}.", ""]
            prefix = "<profile>." if group == "hardware" else ""
            out += [*_key_table(cls, group, prefix), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def metrics_page() -> str:
    """``docs/reference/metrics.md``: every catalogue metric with unit, definition and source (module docstring)."""
    from harness.analysis.catalog import CATALOG, TABLE
    out = ["# Metric reference (generated)", "",
           "Generated by `python -m harness.tools.reference` from the metric catalogue "
           "(`harness.analysis.catalog.CATALOG`: each entry's `unit`, `definition` and `source`): do not edit by hand "
           "(`tests/test_reference.py`). *Printed*: the main job's table and a sweep's `comparison.md` show it "
           "(`TABLE`); the others are in `summary.json` and the sweep report. Every key is a `summary.json` key; the "
           "table shows it in the label's unit. The formulas in prose, the intervals over seeds and the verdict rule: "
           "[`docs/metrics.md`](../metrics.md).", "",
           "| key | label | unit | printed | definition | source |", "|---|---|---|---|---|---|"]
    for m in CATALOG:
        out.append(f"| `{m.key}` | {_cell(m.label)} | {_cell(m.unit)} | {'yes' if m.key in TABLE else ''} | "
                   f"{_cell(m.definition)} | {_cell(m.source)} |")
    return "\n".join(out) + "\n"


def page(name: str) -> str:
    """The text of reference page ``name`` (:data:`PAGES`).

    Raises:
        ValueError: an unknown name.
    """
    if name == "config":
        return config_page()
    if name == "metrics":
        return metrics_page()
    raise ValueError(f"reference page: unknown name {name!r}; one of {', '.join(PAGES)}")


def main(argv: Optional[list[str]] = None) -> int:
    """Command line: write the pages (default ``docs/reference/``) or, with ``--check``, compare them. Exit status
    0 done / equal, 1 a page differs or is missing (``--check``), 2 bad arguments (argparse)."""
    ap = argparse.ArgumentParser(prog="python -m harness.tools.reference",
                                 description="Write the config and metric reference (docs/reference/) from the code.")
    ap.add_argument("--out", type=Path, default=PROJECT_ROOT / "docs" / "reference",
                    help="directory for the pages (default: docs/reference)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page differs")
    a = ap.parse_args(argv)
    if a.check:
        stale = [n for n in PAGES if not (a.out / f"{n}.md").is_file() or (a.out / f"{n}.md").read_text() != page(n)]
        for n in stale:
            print(f"{a.out / (n + '.md')}: differs from `python -m harness.tools.reference`", file=sys.stderr)
        return 1 if stale else 0
    a.out.mkdir(parents=True, exist_ok=True)
    for n in PAGES:
        (a.out / f"{n}.md").write_text(page(n))
        print(a.out / f"{n}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
