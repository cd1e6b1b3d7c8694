"""WAIT-CP vs Sarathi-like on Figure B's setting under each step model, paired per seed.

    nice -n 10 python scripts/vidur_wait_step_models.py --rates 20,22,24 --seeds 0,1,2 --n 5000

Figure B's setting: workload ``wait_single`` (512 prompt / 20 output tokens, Poisson arrivals),
Llama-3-8B on one A100 (``+experiment=wait_paper``, arms ``wait_sarathi_llama3``: budget 512, and
``wait_cp_llama3``: the authors' WAIT-CP, ``batch_est`` 508), mean end-to-end latency over the central
window (prompts 25-75 % by arrival; ``scripts/wait_check.py``). A third arm is the chunk-cap control
(``wait_cp_control_llama3`` with ``engine.max_prefill_chunk_tokens=256``: Sarathi-like with budget 508,
at most 21 requests holding KV and a 256-token per-request chunk). All arms see the same requests per
seed. For each step model it prints per rate: each arm's mean over seeds and the per-seed paired
differences ``WAIT-CP / Sarathi - 1`` and ``control / Sarathi - 1`` (negative: faster than Sarathi).

Step models (``--models``): ``roofline`` and ``vidur_profile`` (``engine.step_model``), and two
diagnostic variants of ``vidur_profile`` that swap one of its components (not configuration keys; the
script patches the profile for its own runs):

* ``vidur_kvsave_linear``: ``attn_kv_cache_save`` as one cost per token for every token (the prefill
  rows' 1,152-token value / 1,152) instead of Vidur's model pooled over decode and prefill rows by
  ``max(chunk, batch)`` (which prices a step of exactly a profiled chunk size, e.g. 512 tokens, with
  the prefill rows and one of 504 with the decode rows);
* ``vidur_kvsave_decode``: ``attn_kv_cache_save`` from the decode rows alone (a few us per layer at
  any batch; proportional to n past 512 tokens), for every step;
* ``vidur_attn_sum``: prefill attention of a batch as the sum of each chunk's own
  ``attn_prefill(prefix, chunk)`` instead of Vidur's one lookup at ``(sum prefix, sqrt(sum chunk^2))``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from wait_check import run_arm  # noqa: E402

from harness.core import cmdline  # noqa: E402

import harness.sim.perf as perf  # noqa: E402

# Sarathi-like, WAIT-CP, and the chunk-cap control: Sarathi-like with WAIT-CP's budget (batch_est 508), its
# in-flight cap (tl 21) and a 256-token per-request prefill chunk (it matched WAIT-CP within 0.1 point at
# 12-24 prompts/s: "WAIT-CP is Sarathi plus a 256-token per-request chunk")
ARMS = ("wait_sarathi_llama3", "wait_cp_llama3", "wait_cp_control_llama3@engine.max_prefill_chunk_tokens=256")
MODELS = ("roofline", "vidur_profile", "vidur_profile_per_request", "vidur_kvsave_linear", "vidur_kvsave_decode",
          "vidur_attn_sum")


def _patch(model: str):
    """Install the diagnostic variant ``model``; returns an undo function."""
    prof_cls, model_cls = perf.VidurProfile, perf.VidurProfilePerfModel
    saved = (prof_cls.kv_save_ms, model_cls._time_s)
    perf._PROFILE_CACHE.clear()
    if model == "vidur_kvsave_linear":
        def kv_save_ms(self, n):
            return self.save_ms[-1] * n / self.save_tokens[-1] if n > 0 else 0.0
        prof_cls.kv_save_ms = kv_save_ms
    elif model == "vidur_kvsave_decode":
        def kv_save_ms(self, n):
            if not hasattr(self, "_dec_save"):
                import csv
                from harness.core.paths import data_path
                rows = {}
                with open(data_path("docs/data/vidur_llama3_8b_a100_attention_ms.csv"), newline="") as f:
                    for r in csv.DictReader(f):
                        if r["prefill_chunk_size"] == "0":
                            rows.setdefault(int(r["batch_size"]), []).append(float(r["attn_kv_cache_save_ms"]))
                xs = sorted(rows)
                self._dec_save = (xs, [sum(rows[x]) / len(rows[x]) for x in xs])
            xs, ys = self._dec_save
            if n <= 0:
                return 0.0
            return ys[-1] * n / xs[-1] if n > xs[-1] else perf._interp_extrap(n, xs, ys)
        prof_cls.kv_save_ms = kv_save_ms
    elif model == "vidur_attn_sum":
        def _time_s(self, chunks, b, dec_ctx):
            p = self.profile
            n = b + sum(c for c, _ in chunks)
            attn = sum(p.prefill_ms(perf._ceil_to(pre, perf.VIDUR_KV_GRANULARITY), c) for c, pre in chunks)
            if b:
                attn += self._decode_attn(b, dec_ctx)
            return (p.linear_ms(perf._ceil_to(n, 8)) + p.kv_save_ms(n) + attn) * self._scale
        model_cls._time_s = _time_s

    def undo():
        prof_cls.kv_save_ms, model_cls._time_s = saved
        perf._PROFILE_CACHE.clear()
    return undo


def e2e_series(arm: str, rate: float, n: int, seed: int, model: str) -> np.ndarray:
    """End-to-end latency (s) of every prompt of one run, in arrival order (``finish_s - submit_s``)."""
    # a registered step model runs as itself; the diagnostic variants patch vidur_profile (_patch)
    step_model = model if model in ("roofline", "vidur_profile", "vidur_profile_per_request") else "vidur_profile"
    extra = [f"engine.step_model={step_model}"]
    undo = _patch(model)
    try:
        run, res, eng, turns, wall = run_arm(arm, "wait_single", rate, n, seed, extra)
    finally:
        undo()
    if res.error:
        raise RuntimeError(f"{arm} rate {rate} seed {seed} {model}: {res.error}")
    turns = turns.reset_index(drop=True)
    return (turns["finish_s"] - turns["submit_s"]).to_numpy(dtype=float)


def e2e_central_mean(arm: str, rate: float, n: int, seed: int, model: str) -> float:
    """Mean E2E (s) over the central window (prompts 25-75 % by arrival) of one run."""
    e2e = e2e_series(arm, rate, n, seed, model)
    return float(e2e[len(e2e) // 4: 3 * len(e2e) // 4].mean())


def main(argv=None) -> None:
    ap = cmdline.ArgumentParser(prog="scripts/vidur_wait_step_models.py", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 printed; 2 bad input (one line naming the flag); 130 "
                                       "interrupted.")
    ap.add_argument("--rates", type=cmdline.number_list(0, lo_open=True), default="20,22,24",
                    help="prompts/s (> 0), comma-separated")
    ap.add_argument("--seeds", type=cmdline.number_list(0, integer=True), default="0,1,2",
                    help="workload seeds, comma-separated")
    ap.add_argument("--n", type=cmdline.number(8, integer=True), default=5000,
                    help="prompts per run (>= 8; Figure B: 5000)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"step models, comma-separated, of {MODELS}")
    a = ap.parse_args(argv)
    bad = [m for m in a.models.split(",") if m not in MODELS]
    if bad:
        ap.error(f"--models: unknown step model {bad[0]!r}; one of {MODELS}")
    rates, seeds = a.rates, a.seeds
    print(f"wait_single (512/20), Llama-3-8B, 1 x A100, n={a.n}, seeds {seeds}; E2E = central-window mean (s)")
    print("| step model | rate (/s) | Sarathi-like E2E (s) | WAIT-CP E2E (s) | chunk-cap control E2E (s) | "
          "WAIT-CP vs Sarathi per seed | mean | control vs Sarathi per seed | mean |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in a.models.split(","):
        for rate in rates:
            vals = {arm: [e2e_central_mean(arm, rate, a.n, s, model) for s in seeds] for arm in ARMS}
            sar, wcp, ctl = (np.array(vals[arm]) for arm in ARMS)
            d, dc = wcp / sar - 1.0, ctl / sar - 1.0
            print(f"| {model} | {rate:g} | {sar.mean():.3f} | {wcp.mean():.3f} | {ctl.mean():.3f} | "
                  f"{' / '.join(f'{x:+.2%}' for x in d)} | {d.mean():+.2%} | "
                  f"{' / '.join(f'{x:+.2%}' for x in dc)} | {dc.mean():+.2%} |", flush=True)


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
