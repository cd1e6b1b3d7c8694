"""``harness.core.yamlfile.read_yaml_container``: a run's ``config.yaml`` read as
``OmegaConf.to_container(OmegaConf.load(path))`` reads it, without an OmegaConf tree where the text has no
interpolation. The expected values are written by hand from OmegaConf's YAML rules (its loader,
``omegaconf._utils.get_yaml_loader``: ``1e3`` is a float, which plain YAML 1.1 reads as a string; no timestamps;
a repeated key refused), and each is also compared with OmegaConf's own reading."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from harness.analysis.report import load_config
from harness.core import yamlfile
from harness.core.yamlfile import read_yaml_container
from tests.conftest import compose_cfg

TEXT = """\
a: 1e3
b: 2026-01-01
c: .5
d: null
e: '???'
f: [1, two, 3.0, true]
g:
  h: 'x: y'
  i: -7
  j: ~
k: 1_000
l: .inf
"""
BY_HAND = {"a": 1000.0, "b": "2026-01-01", "c": 0.5, "d": None, "e": "???", "f": [1, "two", 3.0, True],
           "g": {"h": "x: y", "i": -7, "j": None}, "k": 1000, "l": float("inf")}


def omegaconf_reads(p: Path, resolve: bool = True):
    cfg = OmegaConf.load(p)
    try:
        return OmegaConf.to_container(cfg, resolve=resolve)
    except Exception:
        return OmegaConf.to_container(cfg, resolve=False)


def test_values_types_and_order_as_omegaconf_reads_them_without_building_its_tree(tmp_path, monkeypatch):
    p = tmp_path / "config.yaml"
    p.write_text(TEXT)
    want = omegaconf_reads(p)
    assert repr(want) == repr(BY_HAND)    # (the hand-written reading is OmegaConf's: types and key order)
    monkeypatch.setattr(OmegaConf, "load", lambda *a, **k: pytest.fail("OmegaConf.load on a text without ${"))
    got = read_yaml_container(p)
    assert repr(got) == repr(BY_HAND)
    assert load_config(tmp_path)["g.i"] == -7 and load_config(tmp_path)["f"] == '[1, "two", 3.0, true]'
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert read_yaml_container(empty) == {}


def test_a_repeated_key_is_refused_and_interpolations_go_through_omegaconf(tmp_path, monkeypatch):
    dup = tmp_path / "dup.yaml"
    dup.write_text("a: 1\nb: 2\na: 3\n")
    with pytest.raises(yaml.YAMLError, match="duplicate key a"):
        read_yaml_container(dup)
    with pytest.raises(yaml.YAMLError, match="duplicate key a"):
        OmegaConf.load(dup)
    ip = tmp_path / "interp.yaml"
    # resolved where it can be; an interpolation that cannot be resolved (an unset variable here: whether
    # ${hydra:...} resolves depends on Hydra's global state in the process) keeps the whole file unresolved
    monkeypatch.delenv("HARNESS_TEST_UNSET", raising=False)
    ip.write_text("a: 2\nb: ${a}\nc: ${oc.env:HARNESS_TEST_UNSET}\n")
    assert read_yaml_container(ip) == omegaconf_reads(ip) == {"a": 2, "b": "${a}", "c": "${oc.env:HARNESS_TEST_UNSET}"}
    with pytest.raises(Exception, match="HARNESS_TEST_UNSET"):   # strict (load_run_config): OmegaConf's error
        read_yaml_container(ip, strict=True)
    ip.write_text("a: 2\nb: ${a}\n")
    assert read_yaml_container(ip) == {"a": 2, "b": 2} and read_yaml_container(ip, resolve=False) == {"a": 2, "b": "${a}"}


def test_a_composed_run_config_reads_as_omegaconf_reads_it(tmp_path):
    """The project's config, composed and resolved as a run writes it (``config.yaml``), and the unresolved one:
    the same containers, types and order included."""
    cfg = compose_cfg(["scheduler=wait", "workload.rate_per_s=1e-2"])
    for name, text in (("resolved", OmegaConf.to_yaml(cfg, resolve=True)), ("unresolved", OmegaConf.to_yaml(cfg))):
        p = tmp_path / f"{name}.yaml"
        p.write_text(text)
        for resolve in (True, False):
            assert repr(read_yaml_container(p, resolve)) == repr(omegaconf_reads(p, resolve)), (name, resolve)
    assert "${" not in (tmp_path / "resolved.yaml").read_text()   # (the fast path was the one compared)


def test_without_libyaml_omegaconfs_own_loader_reads_it(tmp_path, monkeypatch):
    p = tmp_path / "config.yaml"
    p.write_text(TEXT)
    monkeypatch.setattr(yamlfile, "_YAML_LOADER", [])
    monkeypatch.delattr(yaml.cyaml, "CParser")
    assert repr(read_yaml_container(p)) == repr(BY_HAND)
    assert yamlfile._YAML_LOADER[0].__module__.startswith("omegaconf")
