"""Vidur's own predicted step times for a fixed set of batch compositions (the reference table of
``tests/test_step_model_vidur.py``).

Runs Vidur's execution-time predictor (``vidur.execution_time_predictor``, random forest, the predictor
Vidur's simulator uses by default) trained on the profile rows this repository ships
(``docs/data/vidur_llama3_8b_a100_{mlp,attention}_ms.csv``, rewritten into Vidur's CSV layout), then asks
it for the execution time of each composition below (``ExecutionTime.total_time``: every layer's
operators x 32 layers; CPU overhead skipped, Vidur's default) and writes them to
``tests/data/vidur_step_predictions.csv``.

Vidur is not a dependency of this project: install it beside it, in its own environment, e.g.::

    python3 -m venv /work/vidur-venv && /work/vidur-venv/bin/pip install numpy pandas scikit-learn fasteners pyyaml
    # a checkout of microsoft/vidur (commit 7d47513363ec) at /work/vidur-src (only its vidur/ package is used)
    nice -n 19 /work/vidur-venv/bin/python scripts/vidur_reference_predictions.py --vidur-src /work/vidur-src

The random forests' grid search is reduced from Vidur's default (n_estimators 250/500/750 x max_depth
8/16/32 x min_samples_split 2/5/10, 10-fold CV) to ``--estimators`` trees, depth 32, split 2, 2-fold CV
(the default grid takes hours on two cores); a forest with these settings on one feature reproduces
the per-value mean of the training rows, which is what the larger grid selects on these tables too. The
forests are seeded (``--forest-seed``, default 0; Vidur's own are unseeded), so a rerun reproduces the table.
"""

from __future__ import annotations

import csv
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from harness.core import cmdline  # noqa: E402  (standard library only)
DATA = ROOT / "docs" / "data"
OUT = ROOT / "tests" / "data" / "vidur_step_predictions.csv"

# name, kind, prefill chunks "tokens@kv_prefix;..." ("" none), decode "count x kv" groups ";"-separated
COMPOSITIONS = [
    ("decode_1", "decode-only", "", "1x540"),
    ("decode_32", "decode-only", "", "32x530"),
    ("decode_128_long", "decode-only", "", "128x1300"),
    ("decode_256", "decode-only", "", "256x550"),
    ("prefill_512", "prefill-only", "512@0", ""),
    ("prefill_256", "prefill-only", "256@0", ""),
    ("prefill_2x256", "prefill-only", "256@0;256@0", ""),
    ("prefill_4x128", "prefill-only", "128@0;128@0;128@0;128@0", ""),
    ("prefill_1024", "prefill-only", "1024@0", ""),
    ("mixed_40d_472", "mixed", "472@0", "40x530"),
    ("mixed_100d_412", "mixed", "412@0", "100x560"),
    ("mixed_wait_cp", "mixed", "256@256;228@0", "24x540"),
    ("chunked_cached_512_4096", "chunked-long-prefix", "512@4096", ""),
    ("chunked_cached_256_3072_20d", "chunked-long-prefix", "256@3072", "20x1340"),
    ("chunked_cached_512_2048_8d", "chunked-long-prefix", "512@2048", "8x560"),
]

MLP_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "mlp_act", "input_layernorm",
           "post_attention_layernorm", "attn_rope", "add")


def parse_chunks(s: str) -> list[tuple[int, int]]:
    """``"512@0;256@256"`` -> ``[(512, 0), (256, 256)]`` (tokens, KV prefix tokens)."""
    return [(int(a), int(b)) for a, b in (x.split("@") for x in s.split(";") if x)]


def parse_decode(s: str) -> list[int]:
    """``"40x530;2x600"`` -> the decode sequences' KV contexts (tokens)."""
    out: list[int] = []
    for g in (x for x in s.split(";") if x):
        n, kv = g.split("x")
        out += [int(kv)] * int(n)
    return out


def write_vidur_inputs(d: Path) -> tuple[Path, Path]:
    """Vidur-layout mlp.csv / attention.csv (Meta-Llama-3-8B shapes, TP 1, block 16) from docs/data."""
    mlp, attn = d / "mlp.csv", d / "attention.csv"
    with open(DATA / "vidur_llama3_8b_a100_mlp_ms.csv", newline="") as f, open(mlp, "w", newline="") as g:
        w = csv.writer(g)
        w.writerow([f"time_stats.{o}.median" for o in MLP_OPS] + ["n_head", "n_kv_head", "n_embd",
                   "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens", "num_tensor_parallel_workers"])
        for r in csv.DictReader(f):
            w.writerow([r[o] for o in MLP_OPS] + [32, 8, 4096, 14336, 128256, True, r["num_tokens"], 1])
    with open(DATA / "vidur_llama3_8b_a100_attention_ms.csv", newline="") as f, open(attn, "w", newline="") as g:
        w = csv.writer(g)
        w.writerow(["time_stats.attn_prefill.median", "time_stats.attn_decode.median",
                    "time_stats.attn_kv_cache_save.median", "n_embd", "n_q_head", "n_kv_head", "block_size",
                    "num_tensor_parallel_workers", "max_model_len", "batch_size", "prefill_chunk_size",
                    "kv_cache_size", "is_prefill"])
        for r in csv.DictReader(f):
            w.writerow([r["attn_prefill_ms"], r["attn_decode_ms"], r["attn_kv_cache_save_ms"], 4096, 32, 8, 16, 1,
                        16384, r["batch_size"], r["prefill_chunk_size"], r["kv_cache_size"], r["is_prefill"]])
    return mlp, attn


def seed_forests(seed: int) -> None:
    """Give every random forest Vidur's predictor trains ``random_state=seed`` (Vidur's
    ``RandomForrestExecutionTimePredictor._get_estimator`` builds ``RandomForestRegressor()`` unseeded, so each
    training bags differently); its grid search's folds are unshuffled, so the trained forests are then a
    function of the training rows and the seed. Needs Vidur's ``vidur/`` package and scikit-learn importable."""
    from sklearn.ensemble import RandomForestRegressor
    from vidur.execution_time_predictor.random_forrest_execution_time_predictor import \
        RandomForrestExecutionTimePredictor
    RandomForrestExecutionTimePredictor._get_estimator = lambda self: RandomForestRegressor(random_state=seed)


def main(argv=None) -> None:
    ap = cmdline.ArgumentParser(prog="scripts/vidur_reference_predictions.py", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 written; 2 bad input; 130 interrupted.")
    ap.add_argument("--vidur-src", required=True, help="directory holding Vidur's vidur/ package")
    ap.add_argument("--estimators", type=cmdline.number(1, integer=True), default=100,
                    help="random-forest trees (>= 1; Vidur: 250/500/750)")
    ap.add_argument("--forest-seed", type=cmdline.number(0, integer=True), default=0,
                    help="random_state of Vidur's forests (>= 0; Vidur leaves them unseeded)")
    ap.add_argument("--out", type=cmdline.writable(), default=str(OUT), help="the CSV to write")
    a = ap.parse_args(argv)
    if not (Path(a.vidur_src) / "vidur").is_dir():
        ap.error(f"--vidur-src: no vidur/ package in {a.vidur_src}")
    sys.path.insert(0, a.vidur_src)
    from vidur.config import MetricsConfig, RandomForrestExecutionTimePredictorConfig, ReplicaConfig, \
        SarathiSchedulerConfig
    from vidur.entities import Batch, Request
    from vidur.execution_time_predictor.random_forrest_execution_time_predictor import \
        RandomForrestExecutionTimePredictor
    seed_forests(a.forest_seed)

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        mlp, attn = write_vidur_inputs(d)
        pred_cfg = RandomForrestExecutionTimePredictorConfig(
            compute_input_file=str(mlp), attention_input_file=str(attn), k_fold_cv_splits=2, no_cache=True,
            num_estimators=[a.estimators], max_depth=[32], min_samples_split=[2],
            prediction_max_batch_size=512, prediction_max_tokens_per_request=8192, num_training_job_threads=1)
        replica = ReplicaConfig(model_name="meta-llama/Meta-Llama-3-8B", device="a100")
        sched = SarathiSchedulerConfig(block_size=16, chunk_size=512)
        metrics = MetricsConfig(output_dir=str(d / "out"), cache_dir=str(d / "cache"))
        predictor = RandomForrestExecutionTimePredictor(pred_cfg, replica, sched, metrics)
        rows = []
        for name, kind, chunks, decode in COMPOSITIONS:
            reqs, toks = [], []
            for c, prefix in parse_chunks(chunks):
                r = Request(arrived_at=0.0, num_prefill_tokens=prefix + c + 1, num_decode_tokens=10,
                            num_processed_tokens=prefix)
                reqs.append(r)
                toks.append(c)
            for kv in parse_decode(decode):
                r = Request(arrived_at=0.0, num_prefill_tokens=max(1, kv - 1), num_decode_tokens=1000,
                            num_processed_tokens=kv)
                r._is_prefill_complete = True
                reqs.append(r)
                toks.append(1)
            et = predictor.get_execution_time(Batch(0, reqs, toks), 0)
            rows.append((name, kind, chunks, decode, f"{et.total_time * 1e3:.6f}"))
            print(f"{name:30s} {et.total_time * 1e3:9.3f} ms")
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "kind", "prefill_chunks", "decode", "vidur_ms"])
        w.writerows(rows)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
