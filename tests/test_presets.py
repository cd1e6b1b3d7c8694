"""Every experiment preset (``conf/experiment/*.yaml``) composes with ``+experiment=<name>``, its sweep
parses (fixed seeds, >= 3 repetitions, every swept group option exists), and one point of it runs on a
tiny workload."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from harness.run.config import PROJECT_ROOT
from harness.run.runner import execute
from tests.conftest import compose_cfg, compose_run

CONF = PROJECT_ROOT / "conf"
PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def compose_with_hydra(overrides):
    """The config composed with ``overrides`` and its ``hydra`` node (tests/conftest.py ``compose_cfg``)."""
    return compose_cfg(overrides, return_hydra_config=True)


def sweep_params(name: str) -> dict[str, list[str]]:
    """``hydra.sweeper.params`` of a preset, each parsed by Hydra's own override parser into its values (a copy
    of this process's one parse per preset: both tests of a preset read it, a composition costs ~0.7 s)."""
    return {k: list(v) for k, v in _sweep_params(name).items()}


@functools.lru_cache(maxsize=None)
def _sweep_params(name: str) -> dict[str, list[str]]:
    cfg = compose_with_hydra([f"+experiment={name}"])
    params = cfg.hydra.sweeper.params
    assert params, f"{name}: no hydra.sweeper.params"
    parser = OverridesParser.create()
    out = {}
    for key, value in params.items():
        (ov,) = parser.parse_overrides([f"{key}={value}"])
        out[key] = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.get_value_element_as_str()]
    return out


@functools.lru_cache(maxsize=None)
def cell(name: str) -> dict:
    """``conf/experiment/cell/<name>.yaml`` as ``yaml.safe_load`` reads it, parsed by libyaml's safe loader
    (``yaml.CSafeLoader``: the same constructors, ~7x less CPU than the pure-Python parser) once per process: the
    tests below read ~2,300 cell files (~5 CPU s with ``safe_load``; the two equal on all 938 shipped, measured
    2026-12-06). Not to be modified (shared between the tests)."""
    import yaml
    return yaml.load((CONF / "experiment" / "cell" / f"{name}.yaml").read_text(), Loader=getattr(yaml, "CSafeLoader",
                                                                                             yaml.SafeLoader))


def test_the_four_paper_presets_exist():
    assert {"conserve_rate_sweep", "conserve_energy", "ampd_robustness", "wait_paper"} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_sweep_parses_with_fixed_seeds(name):
    text = (CONF / "experiment" / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_"), "presets are override-only files in the global package"
    params = sweep_params(name)
    seeds = params.get("workload.seed")
    if "+experiment/cell" in params:  # a union of grids: each cell file sets its own seed
        seeds = sorted({str(cell(c)["workload"]["seed"]) for c in params["+experiment/cell"]})
    assert seeds and len(seeds) >= 3 and all(s.isdigit() for s in seeds), f"{name}: >= 3 fixed seeds"
    for key, values in params.items():
        group = key.lstrip("+")
        if (CONF / group).is_dir():  # a group choice: every option must exist
            for v in values:
                assert (CONF / group / f"{v}.yaml").is_file(), f"{name}: {key}={v} has no conf/{group}/{v}.yaml"
    assert 4 <= len(list(itertools.product(*params.values()))) <= 400


def one_point(name: str) -> list[str]:
    """The first value of every swept key."""
    return [f"{k}={v[0]}" for k, v in sweep_params(name).items()]


@pytest.mark.parametrize("name", PRESETS)
def test_one_point_of_each_preset_runs(name, tmp_path: Path):
    point = one_point(name)
    run = compose_run([f"+experiment={name}", *point, "workload.num_conversations=3", "workload.max_turns=3"])
    summary = execute(run, tmp_path)
    # (a preset with workload.context_overflow drop/truncate may drop a sampled conversation that cannot fit:
    # claude_code's Claude Code sessions outgrow the 128 K context)
    assert summary["num_conversations"] + summary["num_conversations_context_dropped"] == 3
    assert not summary["partial"]
    assert (tmp_path / "conversations.parquet").is_file()


def test_ampd_robustness_asks_c5_on_both_rules_at_the_claim_rates():
    """ampd_robustness (issue 31): misroute 0 / 0.1 / 0.3 / 0.5 on AMPD remote_default and cost and ConServe
    at 0.06, 0.075 and 0.09 conv/s, the predictor-error arms on remote_default at 0.06 (error-free decisions), 10
    seeds everywhere (every rate within 0.8 of capacity, harness.analysis.seed_audit); a sample of cells composes."""
    cells = sweep_params("ampd_robustness")["+experiment/cell"]
    # (2 rules x 4 misroute shares + ConServe) x 3 rates x 10 seeds + 8 predictor arms x 10 seeds
    assert len(cells) == len(set(cells)) == 9 * 3 * 10 + 8 * 10 == 350
    grid, pred = {}, {}
    for c in cells:
        y = cell(c)
        groups = {k.split("/")[-1]: v for d in y["defaults"] for k, v in d.items()}
        assert groups["cluster"] == "a40_1p3d", c
        sched, w = y.get("scheduler", {}), y["workload"]
        if "predictor" in sched:
            assert groups["scheduler"] == "ampd" and sched["mode"] == "remote_default" and w["rate_per_s"] == 0.06
            assert "misroute_frac" not in sched
            key = sched["predictor"].get("sigma", sched["predictor"].get("error_rate"))
            pred.setdefault((sched["predictor"]["mode"], key), set()).add(w["seed"])
            continue
        key = (groups["scheduler"], sched.get("mode"), sched.get("misroute_frac"), w["rate_per_s"])
        grid.setdefault(key, set()).add(w["seed"])
    want = {}
    for rate, seeds in ((0.06, set(range(10))), (0.075, set(range(10))), (0.09, set(range(10)))):
        for mode in ("remote_default", "cost"):
            for f in (0.0, 0.1, 0.3, 0.5):
                want[("ampd", mode, f, rate)] = seeds
        want[("conserve", None, None, rate)] = seeds
    assert grid == want
    assert pred == {**{("lognormal", x): set(range(10)) for x in (0.25, 0.5, 1.0, 1.5, 2.0)},
                    **{("rate", x): set(range(10)) for x in (0.1, 0.3, 0.5)}}
    run = compose_run(["+experiment/cell=ar_mis0p3_ampd_cost_r0p09_s7", "+experiment=ampd_robustness"])
    assert (run.scheduler_name, run.scheduler.mode, run.scheduler.misroute_frac) == ("ampd", "cost", 0.3)
    assert run.scheduler.predictor.sigma == 0.0 and run.cfg.workload.seed == 7 and run.cfg.seed == 0
    assert run.cfg.workload.rate_per_s == 0.09 and run.cfg.workload.num_conversations == 200
    assert run.cfg.slo.reference_scheduler == "same"
    run = compose_run(["+experiment/cell=ar_rate0p3_ampd_rd_r0p06_s2", "+experiment=ampd_robustness"])
    assert run.scheduler.predictor.error_rate == 0.3 and run.scheduler.misroute_frac == 0.0


def test_cells_near_capacity_have_ten_seeds():
    """Every claim cell of the ConServe presets at a rate near or past capacity (make_experiment_cells.NEAR_CAPACITY)
    has >= 10 seeds in the shipped cell files, and the generator refuses a grid that has fewer (a cell of
    ampd_robustness at 0.075 conv/s with 5 seeds, the grid that left 4 of 5 cells inconclusive)."""
    import sys

    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    import make_experiment_cells as m
    assert m.MIN_SEEDS_NEAR_CAPACITY == 10
    for preset, rates in m.NEAR_CAPACITY.items():
        groups: dict = {}
        for c in sweep_params(preset)["+experiment/cell"]:
            if not c.startswith(m.SEED_CHECKED):
                continue
            y = cell(c)
            w = y["workload"]
            if w["rate_per_s"] in rates:
                key = (repr(y["defaults"]), repr(y.get("scheduler")), w["rate_per_s"])
                groups.setdefault(key, set()).add(w["seed"])
        assert groups and all(len(s) >= 10 for s in groups.values()), (preset, groups)
    five = [c for c in m.ampd_robustness() if c[0].startswith("ar_mis0p1_ampd_rd_r0p075_s") and int(c[0][-1]) < 5]
    with pytest.raises(ValueError, match="near capacity has 5 seeds"):
        m.check_seeds("ampd_robustness", five)


def test_cell_presets_cover_their_grids():
    """conserve_sensitivity: every variant x tier x rate on 3 seeds, 1-seed sensitivity arms, AMPD error
    arms on 10 seeds (0.06 conv/s is near capacity); pd_split: only valid scheduler x cluster pairs. Cells compose (a sample is resolved)."""
    cells = sweep_params("conserve_sensitivity")["+experiment/cell"]
    assert len(cells) == len(set(cells)) == 252
    main = [c for c in cells if c.startswith("cs_main_")]
    # 3 variants x 2 tiers x (3 seeds at 0.03 + 10 seeds at 0.06 and at 0.09, near saturation)
    assert len(main) == 3 * 2 * (3 + 10 + 10)
    seeds_at = {}
    for c in main:
        y = cell(c)
        seeds_at.setdefault(y["workload"]["rate_per_s"], set()).add(y["workload"]["seed"])
    assert seeds_at == {0.03: {0, 1, 2}, 0.06: set(range(10)), 0.09: set(range(10))}
    assert len([c for c in cells if c.startswith("cs_sens_")]) == 6 * 3 * 2
    assert len([c for c in cells if c.startswith("cs_err_")]) == 7 * 10
    split = sweep_params("pd_split")["+experiment/cell"]
    for c in split:
        y = cell(c)
        groups = {k.split("/")[-1]: v for d in y["defaults"] for k, v in d.items()}
        sched, cluster = groups["scheduler"], groups["cluster"]
        assert (sched == "collocated") == cluster.endswith("x"), c
    for c in ("cs_sens_mpf0p95_ampd_cost_hetero", "cs_err_rate0p3_ampd_rd_s1", split[-1]):
        run = compose_run(["+experiment=" + ("pd_split" if c.startswith("split") else "conserve_sensitivity"),
                           f"+experiment/cell={c}"])
        assert run.cfg.slo.reference_scheduler == "same"
    run = compose_run(["+experiment=conserve_sensitivity", "+experiment/cell=cs_sens_mpf0p95_ampd_cost_hetero"])
    assert run.cfg.hardware["a40_200w"].memory_power_frac == 0.95 and run.scheduler.mode == "cost"


def test_kvbound_preset_asks_the_claims_with_ten_seeds_near_saturation():
    """conserve_kvbound: ConServe and AMPD in both modes on both tiers at 0.03 / 0.045 (3 seeds) and 0.06 conv/s
    (10 seeds), AMPD error arms (error rate 0.1 / 0.3 / 0.5) at 0.06 with 10 seeds each (near capacity:
    harness.analysis.seed_audit); every cell runs with the KV pool cut to 0.3 of the GPU."""
    cells = sweep_params("conserve_kvbound")["+experiment/cell"]
    assert len(cells) == len(set(cells)) == 3 * 2 * (3 + 3 + 10) + 3 * 10
    runs = {}
    for c in cells:
        y = cell(c)
        groups = {k.split("/")[-1]: v for d in y["defaults"] for k, v in d.items()}
        sched = y.get("scheduler", {})
        if "predictor" in sched:
            assert groups["cluster"] == "a40_1p3d" and y["workload"]["rate_per_s"] == 0.06
            continue
        key = (groups["scheduler"], sched.get("mode"), groups["cluster"], y["workload"]["rate_per_s"])
        runs.setdefault(key, set()).add(y["workload"]["seed"])
    for (sched, mode, cluster, rate), seeds in runs.items():
        assert len(seeds) == (10 if rate == 0.06 else 3), (sched, mode, cluster, rate)
    assert {(s, m) for s, m, _, _ in runs} == {("conserve", None), ("ampd", "remote_default"), ("ampd", "cost")}
    assert {c for _, _, c, _ in runs} == {"a40_1p3d", "a40_1p3d_hetero"}
    run = compose_run(["+experiment=conserve_kvbound", f"+experiment/cell={cells[-1]}"])
    assert run.cfg.engine.gpu_memory_utilization == 0.3 and run.cfg.slo.reference_scheduler == "same"


def test_wait_paper_variants_are_the_papers_baselines():
    """The four arms of docs/wait.md: vLLM-like (V0 prefill-first, <= 4096 batched tokens), Sarathi-like
    (512-token mixed steps), WAIT and Nested WAIT (engine batch rules); the paper's engine (no prefix
    caching, 1 % watermark, LIFO eviction, ~1.37e5 KV tokens for Llama-2-7B on an A100 80 GB)."""
    params = sweep_params("wait_paper")
    points = params["+experiment/wait_point"]
    # every workload at 4 rates; the grids span the saturation points stated in docs/wait.md
    by_wl = {}
    for p in points:
        run = compose_run(["+experiment=wait_paper", f"+experiment/wait_point={p}"])
        by_wl.setdefault(run.cfg.workload.name, []).append(run.cfg.workload.rate_per_s)
    assert {w: sorted(r) for w, r in by_wl.items()} == {"wait_single": [12, 16, 20, 24],
                                                        "wait_two_types": [8, 12, 16, 20],
                                                        "wait_long": [1.5, 2, 2.5, 3]}
    assert params["+experiment/arm"][:4] == ["wait_vllm", "wait_sarathi", "wait_wait", "wait_nested"]  # jobs 0-143 kept
    assert set(params["+experiment/arm"]) == {"wait_vllm", "wait_sarathi", "wait_wait", "wait_nested", "wait_cp",
                                              "wait_cp_control", "wait_sarathi_llama3", "wait_cp_llama3",
                                              "wait_cp_control_llama3"}
    expect = {"wait_vllm": ("collocated", "v0_prefill_first", 4096),
              "wait_sarathi": ("collocated", "v1_mixed", 512),
              "wait_wait": ("wait", "v1_mixed", 16384),
              "wait_nested": ("nested_wait", "v1_mixed", 16384),
              "wait_cp": ("wait_cp", "v1_mixed", 16384),
              "wait_cp_control": ("wait_cp_control", "v1_mixed", 16384)}
    for arm, (sched, mode, budget) in expect.items():
        # in the order Hydra's sweeper composes a job: the swept groups first, the preset last
        run = compose_run([f"+experiment/arm={arm}", f"+experiment/wait_point={points[0]}", "+experiment=wait_paper"])
        e = run.cfg.engine
        assert (run.scheduler_name, e.step_mode, e.max_num_batched_tokens) == (sched, mode, budget)
        assert not e.enable_prefix_caching and e.kv_watermark_frac == 0.01
        assert e.preemption_order == "lifo_arrival"
        assert run.cfg.cluster.name == "a100_1x" and run.cfg.model.name == "llama2_7b"
        # KV: (80 GiB x 0.99 - 13.48e9 B of weights) / 0.5 MiB per token = 136,496 tokens (1.37e5)
        from harness.core.profiles import kv_capacity_blocks
        cap = kv_capacity_blocks(run.cfg.hardware["a100"], run.cfg.model, e) * e.block_size
        assert abs(cap - 1.37e5) / 1.37e5 < 0.01
        assert run.cfg.workload.num_conversations >= 5000
    for arm, sched, budget in (("wait_sarathi_llama3", "collocated", 512), ("wait_cp_llama3", "wait_cp", 16384),
                               ("wait_cp_control_llama3", "wait_cp_control", 16384)):
        run = compose_run([f"+experiment/arm={arm}", f"+experiment/wait_point={points[0]}", "+experiment=wait_paper"])
        m, e = run.cfg.model, run.cfg.engine
        # Meta-Llama-3-8B config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads, head dim 128
        assert (m.name, m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.vocab_size,
                m.intermediate_size) == ("llama3_8b", 32, 4096, 32, 8, 128, 128256, 14336)
        assert (run.scheduler_name, e.max_num_batched_tokens) == (sched, budget)
        from harness.core.profiles import kv_capacity_blocks
        cap = kv_capacity_blocks(run.cfg.hardware["a100"], m, e) * e.block_size
        # (80 GiB x 0.99 - 2 x 8.03e9 B) / (2 x 32 x 8 x 128 x 2 = 131,072 B per token) = 5.26e5 tokens
        assert abs(cap - 5.26e5) / 5.26e5 < 0.01


def _wait_arm_files() -> list[str]:
    return sorted(p.stem for p in (CONF / "experiment" / "arm").glob("wait_*.yaml"))


@pytest.mark.parametrize("arm", _wait_arm_files())
def test_a_wait_paper_arm_sets_its_engine_in_either_order(arm):
    """Issue 22: an arm of wait_paper can set engine.gpu_memory_utilization / engine.max_num_seqs. The
    sweeper composes the swept arm first and the preset last (Hydra's BasicSweeper: its params, then the
    command line), scripts/wait_check.py the preset first; the preset body sets neither key, so both orders
    give the arm's values (once the preset's 0.99 / 128 replaced every arm's)."""
    sweep = compose_run([f"+experiment/arm={arm}", "+experiment/wait_point=wait_single_r20", "+experiment=wait_paper"])
    other = compose_run(["+experiment=wait_paper", "+experiment/wait_point=wait_single_r20", f"+experiment/arm={arm}"])
    for run in (sweep, other):
        e = run.cfg.engine
        if arm.endswith(("_exact", "_w3", "_long")):
            # the authors' Llama-3-8B runs: Vidur memory_margin_fraction 0.1; Sarathi batch_size_cap 512,
            # WAIT-CP none given (Vidur's default 128)
            assert e.gpu_memory_utilization == 0.9 and run.cfg.model.name == "llama3_8b"
            assert e.max_num_seqs == (512 if arm.startswith("wait_sarathi") else 128)
        else:
            assert (e.gpu_memory_utilization, e.max_num_seqs) == (0.99, 128)   # Vidur: 1 % margin, cap 128
        assert not e.enable_prefix_caching and e.kv_watermark_frac == 0.01 and e.preemption_order == "lifo_arrival"
        assert run.cfg.cluster.name == "a100_1x" and run.cfg.workload.num_conversations == 5000
    assert (sweep.scheduler_name, sweep.cfg.engine) == (other.scheduler_name, other.cfg.engine)
    assert sweep.cfg.scheduler == other.cfg.scheduler and sweep.cfg.model == other.cfg.model


def test_the_authors_exact_llama3_arms():
    """The authors' Llama-3-8B engine and WAIT-CP configurations (docs/wait.md), values derived by hand."""
    from baselines.wait.wait_cp import CpType, wait_cp_constants
    from harness.core.profiles import kv_capacity_blocks
    run = compose_run(["+experiment/arm=wait_sarathi_llama3_exact", "+experiment/wait_point=wait_single_r20",
                       "+experiment=wait_paper"])
    m, e = run.cfg.model, run.cfg.engine
    cap = kv_capacity_blocks(run.cfg.hardware["a100"], m, e) * e.block_size
    # Meta-Llama-3-8B config.json: per layer q, o 4096^2, k, v 4096 x 1024, MLP 3 x 4096 x 14336; untied
    # embeddings 2 x 128256 x 4096; bf16. KV 2 x 32 x 8 x 128 x 2 = 131,072 B per token.
    weights = 2 * (32 * (2 * 4096 ** 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 2 * 128256 * 4096)
    by_hand = (80 * 2 ** 30 * 0.9 - weights) / 131072            # 467,296 tokens
    assert abs(by_hand - 467296) < 1 and by_hand - 16 < cap <= by_hand
    # the authors' notes: num_blocks 29,952 x 16 = 479,232 tokens (Vidur's own memory planner): within 3 %
    assert abs(cap - 479232) / 479232 < 0.03
    assert (run.scheduler_name, e.step_mode, e.max_num_batched_tokens, e.max_num_seqs) == ("collocated", "v1_mixed",
                                                                                           512, 512)
    for arm, point, tl, cs, gate, batch_est, segs in (
            # 512/20, tl 21, cs 256: K 2, D 22, pi 1.909, batch_est ceil(19.09 + 488.7) = 508; one segment B 21
            ("wait_cp_llama3_exact", "wait_single_r20", 21, 256, True, 508, [(0, 19, 21)]),
            # W3, tl 30, cs 128: K 4, D 33, batch_est 492; n1 = 30 / (20 + 0.3 x 30): B 21 | 9
            ("wait_cp_llama3_w3", "wait_two_types_r22", 30, 128, True, 492, [(0, 19, 21), (20, 49, 9)]),
            # 512/1000, tl 120, cs 128: K 4, D 1004, P 0.11952, pi 0.47809,
            # batch_est ceil(119.522 + 61.195) = 181; one segment of 1000 stages, B 120
            ("wait_cp_llama3_long", "wait_long_r4", 120, 128, False, 181, [(0, 999, 120)])):
        for a in (arm, arm.replace("wait_cp_", "wait_cp_control_")):
            r = compose_run([f"+experiment/arm={a}", f"+experiment/wait_point={point}", "+experiment=wait_paper"])
            s = r.cfg.scheduler
            assert (s.tl, s.cs) == (tl, cs) and r.scheduler_name == ("wait_cp" if a == arm else "wait_cp_control")
            if a == arm:
                assert (s.gate, s.wait_gate, s.seg_margin) == (gate, False, 0.0)
            types = [CpType(t.input_tokens, t.output_tokens, t.weight * r.cfg.workload.rate_per_s)
                     for t in r.cfg.workload.prompt_types]
            c = wait_cp_constants(types, s.tl, s.cs, s.seg_margin)
            assert c.batch_est == batch_est and [(g.start, g.end, g.total) for g in c.segments] == segs


def test_the_paper_rates_above_the_llama2_grid():
    """Optional points at the paper's rates: Figure B's and C's near-boundary 22, 23 (512/20 between the
    grid's 20 and 24; two types past the Llama-2-7B grid) and Figure G's 3.5-5 prompts/s (numerical.tex);
    not in the default sweep."""
    params = sweep_params("wait_paper")
    extra = {"wait_single_r22": ("wait_single", 22), "wait_single_r23": ("wait_single", 23),
             "wait_two_types_r22": ("wait_two_types", 22), "wait_two_types_r23": ("wait_two_types", 23),
             "wait_long_r3p5": ("wait_long", 3.5), "wait_long_r4": ("wait_long", 4),
             "wait_long_r4p5": ("wait_long", 4.5), "wait_long_r5": ("wait_long", 5)}
    for p, (wl, rate) in extra.items():
        assert p not in params["+experiment/wait_point"]
        run = compose_run([f"+experiment/wait_point={p}", "+experiment=wait_paper"])
        assert (run.cfg.workload.name, run.cfg.workload.rate_per_s) == (wl, rate)
    assert not {a for a in _wait_arm_files() if a.endswith(("_exact", "_w3", "_long"))} & set(params["+experiment/arm"])
