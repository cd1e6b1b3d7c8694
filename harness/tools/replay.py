"""Replaying a real run on the simulator, like for like: its config turned into a simulated run's
(:func:`sim_config`), the replay itself (:func:`simulate_run`) and the per-request comparison on vLLM's engine clock
(:func:`engine_request_rows`). Used by ``harness.tools.fidelity`` (which re-exports them), ``harness.tools.insample``
and ``harness.tools.connector``'s callers; one module so that neither tool imports the other."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from harness.core import evidence
from harness.core.profiles import HardwareConfig, ModelConfig
from harness.tools.calibrate import kv_mem_bytes, load_run_config


def engine_request_rows(real_dir: Path, sim_dir: Path) -> dict:
    """Per-request comparison on vLLM's engine clock, like for like: the real requests whose engine-side times
    ``server_metrics.json`` holds (spans; ``harness.tools.calibrate.match_engine_requests``) against the same turns
    in the simulator. Both sides count from vLLM's QUEUED event (``queued_ts``: the engine core adds a request
    between steps, so a request that arrives during a step is queued when it ends; the simulator records the same
    event, ``turns.parquet`` ``engine_queued_s``, ``harness.sim.engine._stamp_queued``). Real engine TTFT =
    ``queue_s + prefill_s`` (queued to first token), sim = first token - engine_queued_s; real ITL = ``decode_s /
    (output - 1)``, sim = its TPOT; real engine E2E = queue + prefill + decode (queued to last token), sim = finish
    - engine_queued_s. A simulated run without ``engine_queued_s`` (written before it existed) counts from its
    arrival (``start_s``) and its rows say so (``origin``: mixed clocks). Mean, p50 and p90 of each (s), and the number
    of requests."""
    from harness.tools.calibrate import _engine_requests, match_engine_requests
    sm = evidence.server_metrics(real_dir)
    if sm is None:
        return {}
    eng = _engine_requests(sm)
    real_t = pd.read_parquet(Path(real_dir) / "turns.parquet")
    parts = [match_engine_requests(real_t[real_t.decode_instance == inst], eng[eng.instance == inst])
             for inst in eng.instance.unique()]
    if not parts:
        return {}
    m = pd.concat(parts)
    sim_t = pd.read_parquet(Path(sim_dir) / "turns.parquet")
    queued = "engine_queued_s" in sim_t.columns and bool(sim_t.engine_queued_s.notna().any())
    cols = ["conversation_id", "turn", "first_token_s", "start_s", "finish_s", "tpot_s"]
    sim_t = sim_t[sim_t.status == "ok"][cols + (["engine_queued_s"] if queued else [])]
    j = m.merge(sim_t, on=["conversation_id", "turn"], how="inner")
    if j.empty:
        return {}
    t0 = (j.engine_queued_s if queued else j.start_s).to_numpy(float)
    real_pre, sim_pre = (j.queue_s + j.prefill_s).to_numpy(), j.first_token_s.to_numpy(float) - t0
    real_e2e, sim_e2e = (j.queue_s + j.prefill_s + j.decode_s).to_numpy(), j.finish_s.to_numpy(float) - t0
    dec = j[j.output > 1]
    real_itl, sim_itl = (dec.decode_s / (dec.output - 1)).to_numpy(), dec.tpot_s.to_numpy()
    out = {"engine_requests": {"real": float(len(j)), "sim": float(len(j))}}
    for name, r, s_ in (("engine_ttft", real_pre, sim_pre), ("engine_itl", real_itl, sim_itl),
                        ("engine_e2e", real_e2e, sim_e2e)):
        out[f"{name}_mean_s"] = {"real": float(np.mean(r)), "sim": float(np.mean(s_))}
        out[f"{name}_p50_s"] = {"real": float(np.median(r)), "sim": float(np.median(s_))}
        out[f"{name}_p90_s"] = {"real": float(np.percentile(r, 90)), "sim": float(np.percentile(s_, 90))}
    pd_ = bool(real_t.disaggregated.any()) if "disaggregated" in real_t.columns else False
    for v in out.values():
        v["sim_queued"] = queued
        v["pd"] = pd_
    return out


def sim_config(real_dir: Path, profile: HardwareConfig, keys: Optional[Sequence[str]] = None,
               link: Optional[dict] = None, role_profiles: Optional[dict] = None) -> tuple:
    """The real run's config with ``backend=sim`` (its defaults), ``logger.steps=true``, no progress bar, ``link``
    (a ``cluster.link`` mapping, ``harness.core.profiles.LinkConfig``; e.g. a fitted connector profile,
    ``harness.tools.connector``) in place of the run's own cluster link where given, ``role_profiles`` (``{role:
    HardwareConfig}``: the instances of that role get that profile under a key of their own, ``<key>_<role>``, e.g. a
    P/D pair's two instances at their own measured speeds) and
    ``profile`` under every hardware key its cluster uses (or ``keys``; its ``mem_bytes`` sized so the simulated
    KV capacity equals the real servers', ``kv_capacity_tokens`` in ``instances.parquet``, where all instances
    report the same), and ``model.max_model_len`` set to
    the real run's context limit (a server's ``--max-model-len``; ``workload.context_overflow`` then keeps
    the same turns): ``(Resolved, resolved yaml)``.

    Raises:
        harness.run.config.ConfigError: the resulting config is invalid, or the real run's model or backend section
            (the parts its context is read from, :func:`_context_limit`; the rest of the real run is not resolved).
    """
    d = load_run_config(real_dir)
    limit = _context_limit(d)        # the servers' context (--max-model-len): the same turns fit on both sides
    d["backend"] = {"name": "sim"}
    if limit:
        d["model"]["max_model_len"] = int(limit)
    d["logger"] = {**d.get("logger", {}), "steps": True, "progress": False, "name": "parquet"}
    if link is not None:
        d["cluster"]["link"] = dict(link)
    used = keys or sorted({g["hardware"] for g in d["cluster"]["instances"]})
    hw = dataclasses.asdict(profile)
    inst_p = Path(real_dir) / "instances.parquet"
    if inst_p.is_file():   # the simulated KV cache as large as the real servers' (their /metrics)
        cap = pd.read_parquet(inst_p).kv_capacity_tokens
        if len(cap) and cap.nunique() == 1:
            hw["mem_bytes"] = kv_mem_bytes(int(cap.iloc[0]), ModelConfig(**d["model"]), d["engine"])
    for k in used:
        d["hardware"][k] = {**hw, "name": k}
    for role, prof in (role_profiles or {}).items():
        groups = [g for g in d["cluster"]["instances"] if g["role"] == role]
        if not groups:
            raise ValueError(f"--role-profile {role}: the run's cluster has no {role} instance")
        for g in groups:
            key = f"{g['hardware']}_{role}"
            d["hardware"][key] = {**dataclasses.asdict(prof), "mem_bytes": d["hardware"][g["hardware"]]["mem_bytes"],
                                  "name": key}
            g["hardware"] = key
    return _resolve(d)


def _context_limit(d: dict) -> Optional[int]:
    """The context of the run whose plain config dict is ``d``, tokens: ``harness.run.config.served_context`` of its
    model section (``ModelConfig``'s schema) and its backend plug-in's config, the only two parts it reads; the
    whole run is not resolved for it (issue 54: that cost ~0.4 CPU s per replay, and the replayed config is resolved
    anyway, :func:`_resolve`).

    Raises:
        harness.run.config.ConfigError: the model or backend section is invalid (naming the key).
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from harness.run.config import ConfigError, _omegaconf_message, _plugin_choice, backend_config, served_context
    try:
        model = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), d.get("model") or {}))
    except OmegaConfBaseException as e:
        raise ConfigError(_omegaconf_message(e, "model.")) from None
    _, backend = _plugin_choice(d.get("backend"), "backend", backend_config)
    return served_context(model, backend)


def _resolve(d: dict) -> tuple:
    """``(Resolved, resolved yaml)`` of a plain config dict (merged into the schema, then validated)."""
    from omegaconf import OmegaConf

    from harness.run.config import RunConfig, register_configs, resolve
    register_configs()
    dcfg = OmegaConf.merge(OmegaConf.structured(RunConfig), d)
    return resolve(dcfg), OmegaConf.to_yaml(dcfg)


def simulate_run(real_dir: Path, profile: HardwareConfig, out_dir: Path, link: Optional[dict] = None,
                 role_profiles: Optional[dict] = None) -> Path:
    """Replay the real run's workload on the simulator with ``profile`` (and ``link``, :func:`sim_config`) into
    ``out_dir``; returns it."""
    from harness.run.runner import execute
    run, text = sim_config(real_dir, profile, link=link, role_profiles=role_profiles)
    out_dir.mkdir(parents=True, exist_ok=True)
    execute(run, out_dir, text)
    return out_dir
