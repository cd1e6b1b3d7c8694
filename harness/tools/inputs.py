"""Reading what the calibration and fidelity tools take in: a run directory's resolved config and a
hardware profile (a YAML path or a ``conf/hardware/`` name). Shared by ``harness.tools.calibrate``,
``harness.tools.fidelity`` and ``harness.tools.steps`` (one module, so neither tool imports the other's).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.core.profiles import HardwareConfig

HW_FIELDS = [f.name for f in dataclasses.fields(HardwareConfig)]
"""The fields of a hardware profile (``harness.core.profiles.HardwareConfig``)."""


def load_run_config(run_dir: Path) -> dict:
    """The run's resolved ``config.yaml`` as a plain dict (``harness.core.yamlfile.read_yaml_container``: OmegaConf's
    reading, without its tree where the text has no interpolation).

    Raises:
        FileNotFoundError: no ``config.yaml`` in the run directory.
        omegaconf.errors.OmegaConfBaseException: an interpolation that cannot be resolved.
    """
    from harness.core.yamlfile import read_yaml_container
    p = Path(run_dir) / "config.yaml"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: not a run directory (no config.yaml)")
    return read_yaml_container(p, strict=True)


def load_profile(path_or_name: str) -> HardwareConfig:
    """A ``HardwareConfig`` from a YAML path or a profile name under ``conf/hardware/``; every way a profile can be
    bad (not YAML, not a mapping, an unknown, missing or out-of-range field) is one ``ValueError`` line naming the
    profile, so each tool refuses it as bad input (exit 2) before anything runs.

    Raises:
        FileNotFoundError: neither exists. ValueError: the profile is invalid (naming the file and the field).
    """
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from harness.run.config import PROJECT_ROOT
    p = Path(path_or_name)
    if not p.is_file():
        p = PROJECT_ROOT / "conf" / "hardware" / f"{path_or_name}.yaml"
    if not p.is_file():
        raise FileNotFoundError(f"hardware profile {path_or_name!r}: no such file or conf/hardware/ profile")
    try:
        d = OmegaConf.to_container(OmegaConf.load(p), resolve=True)   # YAML 1.2 floats (1.0e11), as Hydra reads
        unknown = set(d) - set(HW_FIELDS)
        if unknown:
            raise ValueError(f"{p}: unknown hardware field(s) {sorted(unknown)}")
        hw = HardwareConfig(**d)
        hw.validate(f"hardware.{hw.name}")
    except (ValueError, TypeError, AttributeError, yaml.YAMLError, OmegaConfBaseException) as e:
        msg = " ".join(str(e).split())
        raise ValueError(msg if str(path_or_name) in msg else f"hardware profile {path_or_name}: {msg}") from None
    return hw
