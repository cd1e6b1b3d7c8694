"""Fit the power model's constants to ML.ENERGY's batch-resolved H100 serving measurements.

Reads ``docs/data/mlenergy_v3_h100_lm_arena_power.csv`` (provenance: ``docs/calibration.md``, "Power"):
steady-state GPU power of vLLM serving LM-Arena chat prompts on one H100 80GB HBM3 (700 W), for
Llama-3.1-8B, Qwen3-8B, Qwen3-14B and Qwen3-32B at max_num_seqs 8 ... 768. For every row it builds the
steady state of a full batch the way ``harness.sim.perf.PerfModel`` costs it (below), predicts the
average power, and fits by least squares on relative error:

* ``memory_power_frac`` (m): dynamic power of byte time, as a fraction of ``tdp_w - idle_w``;
* ``overhead_power_frac`` (o): the same for the fixed per-layer / per-step / per-sequence time.

Steady state of one row (B = avg_batch_size, O = avg_output_len, O_live = E[O^2] / (2 E[O]) from the
row's output-length histogram: the mean tokens generated so far by a running request; P = the mean
prompt, ``--prompt`` tokens, not published): a decode step of B sequences whose KV holds
B * (P + O_live) tokens; every O / B steps one new prompt of P tokens is prefilled in one of them
(vLLM V1 mixes it into a decode step; B / O prompts per step when B > O). Average power = energy of
that cycle / its duration.

Usage: ``python scripts/fit_power_model.py [--prompt 200]``. Needs numpy, pandas, scipy; not used at
run time.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf
from scipy.optimize import least_squares

from harness.core import cmdline
from harness.core.profiles import HardwareConfig, ModelConfig
from harness.sim.perf import PerfModel

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data" / "mlenergy_v3_h100_lm_arena_power.csv"

# the models' config.json (Hugging Face): layers, hidden, heads, KV heads, head_dim, intermediate, vocab
SHAPES = {
    "meta-llama/Llama-3.1-8B-Instruct": (32, 4096, 32, 8, 128, 14336, 128256),
    "Qwen/Qwen3-8B": (36, 4096, 32, 8, 128, 12288, 151936),
    "Qwen/Qwen3-14B": (40, 5120, 40, 8, 128, 17408, 151936),
    "Qwen/Qwen3-32B": (64, 5120, 64, 8, 128, 25600, 151936),
}


def load_hw(name: str, **over) -> HardwareConfig:
    """A shipped hardware profile (``conf/hardware/<name>.yaml``) with fields overridden."""
    raw = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "hardware" / f"{name}.yaml"))
    raw = {k: v for k, v in raw.items() if k != "defaults"}
    hw = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(HardwareConfig), raw))
    return dataclasses.replace(hw, **over)


def model(mid: str) -> ModelConfig:
    L, h, nh, kvh, d, inter, v = SHAPES[mid]
    return ModelConfig(name=mid, num_layers=L, hidden_size=h, num_heads=nh, num_kv_heads=kvh, head_dim=d,
                       intermediate_size=inter, vocab_size=v, tied_embeddings=False, dtype_bytes=2)


def steady_state(perf: PerfModel, b: float, out_len: float, live: float, prompt: float) -> tuple[float, float, float]:
    """(average power W, decode step s, mean step s) of a full batch of ``b`` sequences (module doc)."""
    bi = max(1, round(b))
    ctx = int(round(bi * (prompt + live)))
    dec = perf.decode_step(bi, ctx)
    p = int(round(prompt))
    per_step = bi / out_len                      # prompts started per step
    k = max(1, round(per_step))                  # prompts in a mixed step
    mixed = perf.step(k * p, k * p * (p + 1) / 2, 0, k, bi - k, ctx - k * p)
    n = k / per_step                             # steps per cycle (one of them mixed)
    e = (n - 1) * dec.energy_j + mixed.energy_j
    t = (n - 1) * dec.time_s + mixed.time_s
    return e / t, dec.time_s, t / n


def predict(df: pd.DataFrame, mpf: float, opf: float | None, prompt: float) -> pd.DataFrame:
    """Model power and decode-step time per row, with ``memory_power_frac`` mpf and ``overhead_power_frac``
    opf (None: the profile's)."""
    rows = []
    for r in df.itertuples():
        over = {"memory_power_frac": mpf}
        if opf is not None:
            over["overhead_power_frac"] = opf
        perf = PerfModel(load_hw("h100", **over), model(r.model_id))
        pw, dec_s, mean_s = steady_state(perf, r.avg_batch_size, r.avg_output_len, r.live_output_len, prompt)
        rows.append((pw, dec_s * 1e3, mean_s * 1e3))
    out = df.copy()
    out["model_w"], out["model_itl_ms"], out["model_mean_step_ms"] = zip(*rows)
    out["err"] = out.model_w / out.avg_power_w - 1
    out["measured_mean_step_ms"] = out.avg_batch_size / out.output_tokens_per_s * 1e3
    return out


def fit(df: pd.DataFrame, prompt: float, free_overhead: bool) -> tuple[float, float, pd.DataFrame]:
    """Least squares on relative power error; returns (mpf, opf, table)."""
    def resid(x):
        mpf = x[0]
        opf = x[1] if free_overhead else 0.0
        return predict(df, mpf, opf, prompt)["err"].to_numpy()
    x0 = [0.7, 0.3] if free_overhead else [0.7]
    sol = least_squares(resid, x0, bounds=([0.0] * len(x0), [1.0] * len(x0)))
    mpf = float(sol.x[0])
    opf = float(sol.x[1]) if free_overhead else 0.0
    return mpf, opf, predict(df, mpf, opf, prompt)


def main(argv=None) -> None:
    ap = cmdline.ArgumentParser(prog="scripts/fit_power_model.py", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 printed; 2 bad input; 130 interrupted.")
    ap.add_argument("--prompt", type=cmdline.number(0, lo_open=True), default=200.0,
                    help="mean prompt tokens (> 0; not published)")
    ap.add_argument("--overhead", action="store_true", help="also fit overhead_power_frac (default: 0, idle)")
    a = ap.parse_args(argv)
    df = pd.read_csv(DATA)
    pd.set_option("display.width", 200)
    for free in (False, True) if a.overhead else (False,):
        mpf, opf, t = fit(df, a.prompt, free)
        e = t["err"].abs()
        print(f"prompt {a.prompt:g}: memory_power_frac {mpf:.3f} overhead_power_frac {opf:.3f}  "
              f"|err| median {e.median():.1%} max {e.max():.1%}  mean {t['err'].mean():+.1%}")
        for m, g in t.groupby("model_id"):
            print(f"   {m}: mpf fit alone -> ", end="")
            mm, oo, _ = fit(g, a.prompt, free)
            print(f"{mm:.3f} / {oo:.3f}")
        if free == a.overhead:
            print(t[["model_id", "max_num_seqs", "avg_power_w", "model_w", "err", "median_itl_ms", "model_itl_ms",
                     "measured_mean_step_ms", "model_mean_step_ms"]].round(3).to_string(index=False))
    base = predict(df, 0.55, 0.0, a.prompt)
    print(f"shipped form (memory_power_frac 0.55, overheads at idle): mean error {base['err'].mean():+.1%}, "
          f"median |err| {base['err'].abs().median():.1%}")


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
