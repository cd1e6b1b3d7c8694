"""Fit the step-time model's coefficients to Vidur's published Llama-2-7B kernel profiles.

Reads the two derived tables in ``docs/data/`` (see ``docs/calibration.md`` for their provenance:
Vidur, microsoft/vidur, MIT licence), composes measured step times the way Vidur's execution-time
predictor does (32 x per-layer operator medians + embedding + LM head), writes them to
``docs/data/vidur_llama2_7b_steps_ms.csv`` and prints the least-squares fit of the coefficients of
``harness.sim.perf.PerfModel`` per GPU, with the per-case errors of the fitted model.

Usage: ``python scripts/fit_step_model.py [--write]`` (``--write`` rewrites the steps table).
Other tables of the same layout (``scripts/gpu_step_profile.py`` writes them for any ``conf/model`` model,
e.g. on a lent H200): ``--mlp FILE --attention FILE --model NAME --peak LABEL=FLOP/s --bw LABEL=B/s``.
Needs numpy, pandas and scipy; not used at run time.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from harness.core import cmdline  # noqa: E402  (standard library only)
DATA = ROOT / "docs" / "data"

# meta-llama/Llama-2-7b-hf config.json (set_model replaces these for another model)
L, H, D, HID, INTER, V = 32, 32, 128, 4096, 11008, 32000
HKV = H
LIN = 4 * HID * HID + 3 * HID * INTER            # matmul parameters per layer (q, k, v, o, gate, up, down)
KVB_LAYER = 2 * H * D * 2                         # KV bytes per token per layer (fp16)


def set_model(m: dict) -> None:
    """Use the shape of a ``conf/model`` dict instead of Llama-2-7B's: q / o ``HID x H*D``, k / v
    ``HID x HKV*D``, gate / up / down ``HID x INTER``; KV ``2 x HKV x D x dtype_bytes`` per token per layer."""
    global L, H, D, HID, INTER, V, HKV, LIN, KVB_LAYER
    L, H, D, HID, INTER, V = (m["num_layers"], m["num_heads"], m["head_dim"], m["hidden_size"],
                              m["intermediate_size"], m["vocab_size"])
    HKV = m["num_kv_heads"]
    LIN = 2 * HID * H * D + 2 * HID * HKV * D + 3 * HID * INTER
    KVB_LAYER = 2 * HKV * D * m.get("dtype_bytes", 2)
PEAK = {"a100": 312e12, "a40": 149.7e12, "h100": 989e12}
BW = {"a100": 2039e9, "a40": 696e9, "h100": 3350e9}
ELEMENTWISE = ["input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act"]
GEMMS = ["attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"]


def layer_linear_ms(mlp: pd.DataFrame) -> pd.Series:
    """Per-layer time of everything but attention, ms: 4 GEMMs + 2 norms + rope + SiLU-mul + 2 adds
    (a decoder layer has two residual adds; Vidur profiles one ``add``)."""
    return mlp[GEMMS].sum(axis=1) + mlp[ELEMENTWISE].sum(axis=1) + 2 * mlp["add"]


def compose_steps(mlp: pd.DataFrame, attn: pd.DataFrame) -> pd.DataFrame:
    """Measured step time (ms) of each attention row: L x (linear ops at the step's token count +
    attention kernel + reshape) + embedding + LM head.

    The LM head is not in Vidur's operator profiles; it is estimated from the same file as the
    ``mlp_up_proj`` GEMM (hidden x 2*intermediate) at the LM head's row count, scaled by
    vocab / (2 * intermediate) = 32000 / 22016 (same M and K, N scaled). Token counts between
    profiled ones are interpolated linearly.
    """
    out = []
    for gpu, a in attn.groupby("gpu", sort=False):
        m = mlp[mlp.gpu == gpu].sort_values("num_tokens")
        x = m.num_tokens.to_numpy(float)
        lin = np.interp  # piecewise-linear in the token count
        lin_ms = layer_linear_ms(m).to_numpy()
        for r in a.itertuples():
            prefill = r.phase == "prefill"
            tokens = r.prefill_chunk_size if prefill else r.batch_size
            head_rows = 1 if prefill else r.batch_size
            layer = lin(tokens, x, lin_ms) + r.attn_ms + r.reshape_ms
            emb = lin(tokens, x, m.emb.to_numpy())
            head = lin(head_rows, x, m.mlp_up_proj.to_numpy()) * V / (2 * INTER)
            out.append(dict(gpu=gpu, phase=r.phase, batch_size=r.batch_size,
                            prefill_tokens=r.prefill_chunk_size if prefill else 0,
                            context_tokens=r.kv_cache_size,
                            measured_ms=round(L * layer + emb + head, 4),
                            attention_ms=round(L * (r.attn_ms + r.reshape_ms), 4),
                            lm_head_ms=round(head, 4)))
    return pd.DataFrame(out)


def elementwise_floor_s(mlp: pd.DataFrame, gpu: str) -> float:
    """Per-layer time of the elementwise operators (norms, rope, SiLU-mul, adds) at <= 8 tokens, s:
    the fixed per-layer cost that does not scale with the token count (median)."""
    m = mlp[(mlp.gpu == gpu) & (mlp.num_tokens <= 8)]
    return float(np.median(m[ELEMENTWISE].sum(axis=1) + 2 * m["add"])) * 1e-3


def model_linear(p, n, gpu, floor_s):
    """Per-layer linear part of the model, s: soft roofline ``(c**k + m**k)**(1/k)`` of GEMM FLOPs
    (c) and weight bytes (m), plus the elementwise floor."""
    eff_c, eff_m, k = p
    c = 2 * LIN * n / (PEAK[gpu] * eff_c)
    m = LIN * 2 / (BW[gpu] * eff_m)
    return (c ** k + m ** k) ** (1 / k) + floor_s


def fit_linear(mlp: pd.DataFrame, gpu: str):
    m = mlp[mlp.gpu == gpu]
    n = m.num_tokens.to_numpy(float)
    y = layer_linear_ms(m).to_numpy() * 1e-3
    floor_s = elementwise_floor_s(mlp, gpu)
    res = least_squares(lambda p: model_linear(p, n, gpu, floor_s) / y - 1, [0.65, 0.75, 3.0],
                        bounds=([0.1, 0.1, 1.0], [1.0, 1.0, 20.0]))
    return (*res.x, floor_s), model_linear(res.x, n, gpu, floor_s) / y - 1


def model_attn(p, a, gpu):
    """Per-layer attention, s: prefill FLOPs at attention efficiency + KV bytes at KV efficiency
    + per decode sequence + per prefill token + a fixed kernel time."""
    eff_a, eff_kv, seq, tok, a0 = p
    n = a.prefill_chunk_size.to_numpy(float)
    prefill = (a.phase == "prefill").to_numpy()
    ctx = a.kv_cache_size.to_numpy(float)
    b = a.batch_size.to_numpy(float)
    pairs = np.where(prefill, n * ctx + n * (n + 1) / 2, 0.0)
    kv_tokens = np.where(prefill, ctx + n, b * (ctx + 1))
    return (4 * H * D * pairs / (PEAK[gpu] * eff_a) + kv_tokens * KVB_LAYER / (BW[gpu] * eff_kv)
            + np.where(prefill, 0.0, b) * seq + np.where(prefill, n, 0.0) * tok + a0)


def fit_attention(attn: pd.DataFrame, gpu: str):
    a = attn[attn.gpu == gpu]
    y = (a.attn_ms + a.reshape_ms).to_numpy() * 1e-3
    res = least_squares(lambda p: model_attn(p, a, gpu) / y - 1, [0.4, 0.9, 1e-6, 2e-7, 5e-6],
                        bounds=([0.05, 0.1, 0.0, 0.0, 0.0], [1.0, 1.0, 1e-4, 1e-5, 1e-4]))
    return res.x, model_attn(res.x, a, gpu) / y - 1


def main(argv=None) -> None:
    ap = cmdline.ArgumentParser(prog="scripts/fit_step_model.py", description=__doc__.splitlines()[0],
                                epilog="Exit status: 0 printed; 2 bad input; 130 interrupted.")
    ap.add_argument("--write", action="store_true", help="rewrite docs/data/vidur_llama2_7b_steps_ms.csv")
    ap.add_argument("--mlp", type=Path, default=DATA / "vidur_llama2_7b_mlp_ms.csv", help="linear-operator table")
    ap.add_argument("--attention", type=Path, default=DATA / "vidur_llama2_7b_attention_ms.csv", help="attention table")
    ap.add_argument("--model", default=None, help="conf/model name of the tables (default: Llama-2-7B)")
    ap.add_argument("--peak", action="append", default=[], help="LABEL=FLOP/s for a gpu label not built in")
    ap.add_argument("--bw", action="append", default=[], help="LABEL=bytes/s for a gpu label not built in")
    args = ap.parse_args(argv)
    for opt, table in (("peak", PEAK), ("bw", BW)):
        for item in getattr(args, opt):
            label, _, value = item.partition("=")
            try:
                table[label] = cmdline.parse_number(value, 0, lo_open=True)
            except ValueError as e:
                ap.error(f"--{opt} {item!r}: expected LABEL=number, the number {e}")
    if args.model is not None:
        p = ROOT / "conf" / "model" / f"{args.model}.yaml"
        if not p.is_file():
            ap.error(f"--model {args.model!r}: no {p}")
        import yaml
        set_model(yaml.safe_load(p.read_text()))
    mlp = pd.read_csv(args.mlp)
    attn = pd.read_csv(args.attention)
    steps = compose_steps(mlp, attn)
    if args.write:
        steps.to_csv(DATA / "vidur_llama2_7b_steps_ms.csv", index=False)
    gpus = [g for g in dict.fromkeys(mlp.gpu)]
    missing = [g for g in gpus if g not in PEAK or g not in BW]
    if missing:
        ap.error(f"no peak/bandwidth for gpu label(s) {missing}: pass --peak {missing[0]}=... --bw {missing[0]}=...")
    for gpu in gpus:
        p, err = fit_linear(mlp, gpu)
        print(f"{gpu} linear: gemm_eff={p[0]:.3f} mem_eff={p[1]:.3f} k={p[2]:.2f} "
              f"elementwise_floor={p[3] * 1e6:.2f} us  |err| max {np.abs(err).max():.3f} "
              f"median {np.median(np.abs(err)):.3f}")
        if gpu in set(attn.gpu):
            q, e2 = fit_attention(attn, gpu)
            print(f"{gpu} attention: attn_eff={q[0]:.3f} kv_eff={q[1]:.3f} seq={q[2] * 1e6:.3f} us "
                  f"tok={q[3] * 1e6:.4f} us a0={q[4] * 1e6:.2f} us |err| max {np.abs(e2).max():.3f} "
                  f"median {np.median(np.abs(e2)):.3f}")
    print(steps.to_string())


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
