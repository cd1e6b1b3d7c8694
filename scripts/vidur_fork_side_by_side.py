"""The WAIT authors' simulator beside ours on Figure B's setting, on the same requests.

    nice -n 10 python scripts/vidur_fork_side_by_side.py --rates 22,24 --seeds 0,1 --n 2000 \
        --forest-seeds 0-4 --fork-variants pool30_all,pool30_meet,kvsave_pool30,public \
        --fork-src /work/vidur-fork-src --vidur-python /work/vidur-venv/bin/python

1. **One trace per (rate, seed)** from this harness's workload generator (``wait_single``: 512 prompt /
   20 output tokens, Poisson arrivals, ``workload.seed``), written in Vidur's trace-replay layout
   (``arrived_at`` s, ``num_prefill_tokens``, ``num_decode_tokens``; floats written with ``repr`` so they
   read back bit for bit) under ``--trace-dir``.
2. **Their simulator**: the WAIT authors' Vidur fork (``Luoxiaogan/vidur_or`` at 011fe971a7cd, a separate
   checkout at ``--fork-src``, run by ``--vidur-python``, an environment with Vidur's dependencies: numpy,
   pandas, scikit-learn, fasteners, pyyaml) replays each trace through Vidur's ``TraceReplayRequestGenerator``
   with the authors' Figure B configuration (``luogan_wait_verification/single/run_single_type_experiments.py``):
   Meta-Llama-3-8B, one A100, ``memory_margin_fraction`` 0.1; WAIT-CP = ``general_nested_chunked``,
   ``total_limit`` 21, ``chunk_size`` 256, ``seg_margin`` 0, ``force_clear``, no ``wait_gate``,
   ``WAIT_CP_GATE=on``, prompt type 512/20 at the trace's rate; Sarathi = Vidur's ``sarathi``,
   ``chunk_size`` 512, ``batch_size_cap`` 512; vLLM-like (``--arms``, default on) = Vidur's ``vllm`` with its
   defaults (``max_tokens_in_batch`` 4096, ``batch_size_cap`` 128: the paper's "default Vidur configurations").
   Step times come from Vidur's random-forest execution-time predictor trained on Vidur's public Llama-3-8B
   A100 profile as this repository ships it
   (``docs/data/vidur_llama3_8b_a100_{mlp,attention}_ms.csv``, rewritten into Vidur's layout by
   ``scripts/vidur_reference_predictions.py``; the attention file is a hand-transcribed subset of Vidur's,
   FlashInfer rows: ``docs/data/SOURCE.md``), seeded and searched as below (the trained forests are cached
   under ``--cache-dir``).
3. **Ours** on the same requests: ``wait_sarathi_llama3``, ``wait_cp_llama3`` and ``wait_vllm_llama3``
   (``+experiment=wait_paper``)
   under ``engine.step_model=roofline``, ``vidur_profile`` and ``vidur_profile_per_request`` (``--ours``); the
   script checks that every run's submit
   times equal the trace's arrival times.

Prints, per rate and comparison (WAIT-CP / Sarathi, WAIT-CP / vLLM-like, Sarathi / vLLM-like), each
simulator's two arms' mean E2E over the central window (prompts 25-75 % by arrival, ``scripts/wait_check.py``'s
window; Vidur: ``completed_at - arrived_at``) averaged over seeds, and the per-seed paired ratio ``a / b - 1``
with its mean, its spread over the forest seeds and a two-sided 95 % Student t interval over workload seeds
(negative: ``a`` faster).

**Forests.** Vidur's random forests are bagged and, in Vidur, unseeded (``RandomForestRegressor()``): two
trainings on the same rows predict differently, most where a feature value has few rows (the shipped
subset's decode KV-write rows: one or two per batch size). ``--forest-seeds`` (default 0-4) trains one
predictor per seed (``random_state``; the grid search's folds are unshuffled, so a seed fixes the forests) and
prints, beside every ratio, its spread over the seeds (min, max) and the value per seed. ``--vidur-grid``:
the grid search, ``reduced`` (default: ``--estimators`` trees, depth 32, split 2, 2-fold CV) or ``vidur``
(Vidur's default grid, 250/500/750 trees x depth 8/16/32 x split 2/5/10, 10-fold CV: hours on two cores).
The prediction grid is Vidur's default (chunk 4,096, 4,096 tokens per request, KV granularity 64) with the
batch bound raised to Sarathi's ``batch_size_cap`` 512 (Vidur's 128 would leave larger batches unpriced).
Vidur's cache keys leave out the attention file and the grids (``_exact_cache_keys``); here they name them,
and the cache holds one directory per forest seed.

**Reference.** The profile files are checked by SHA-256 before anything runs (``PROFILE_SHA256``; exit 2 on a
difference): the full ``attention.csv`` could not be had, so the attention file is the shipped subset. The
fork checkout's git commit (``FORK_COMMIT`` expected) or, for an assembled checkout, its WAIT-CP file's
SHA-256 is printed in the header.

``--fork-variants`` adds runs of their simulator that change its KV-write training rows (Vidur's forests
retrained on them; the 1-3 decode rows per batch size of the shipped subset against the full file's ~32):

* ``pool30_meet``: 30 more decode rows (copies of that batch size's rows) at each decode batch size that is also
  a profiled prefill chunk size (64, 128, 192, 256, 512: where Vidur's pooled KV-write model mixes the two
  kinds of rows); every other decode batch size, 504 included, keeps its one or two rows ("as is");
* ``pool30_all``: 30 more decode rows at every decode batch size, as the full file's grid implies ("made
  consistent": 504 and 508 tokens are then as well supported as 512);

and bisection runs that swap one component of its execution-time predictor (patched in the worker process
only; the fork's files are not changed):

* ``kvsave_linear``: ``attn_kv_cache_save`` of a batch = (the profile's prefill rows at chunk 1152: mean
  ms / 1152) x the batch's tokens, instead of Vidur's forest trained on all attention rows against
  ``max(prefill_chunk_size, batch_size)``;
* ``kvsave_decode``: ``attn_kv_cache_save`` from the decode rows alone (mean per batch size, linear
  interpolation; proportional past the largest profiled batch), for every batch;
* ``kvsave_pool30``: Vidur's pooled ``attn_kv_cache_save`` at the token counts where prefill rows and decode
  rows meet (a profiled chunk size that is also a profiled decode batch size: 64, 128, 192, 256, 512)
  recomputed as the mean over the shipped prefill rows and 30 decode rows at the decode rows' mean there
  -- an estimate of the full ``attention.csv``, which profiles each decode batch size once per decode KV
  size (those read step by 32 from 64 to 960, then by 64 past 1,024; every one read up to 1,088 reaches
  batch 512, 1,344 stops at 328: about 32 KV sizes, 30 taken), where the shipped subset has 1-3 rows per
  batch size; elsewhere Vidur's forest as trained;
* ``attn_sum``: prefill attention of a batch = the sum over its chunks of the predicted
  ``attn_prefill(kv, chunk)`` instead of one lookup at ``(sum kv, sqrt(sum chunk^2))`` (x 1.1 when the
  batch has more than one chunk: Vidur's prefill batching overhead for GQA models).
* ``step_roofline`` / ``step_vidur_profile`` / ``step_vidur_profile_per_request``: the whole predictor replaced
  by our step model (``engine.step_model=<name>`` as the Llama-3-8B WAIT arms build it, pickled from
  this process; ``harness.sim.perf`` needs only numpy there), each Vidur batch priced as
  ``harness/sim/engine.py`` prices a mixed step (``_our_step_time_s``).

Not a run-time dependency of the harness: nothing in ``harness/`` imports this script or Vidur. The fork
checkout must exist at ``--fork-src`` (its ``vidur/`` package with
``scheduler/replica_scheduler/general_nested_chunked_replica_scheduler.py``); the script stops with exit
status 2 and names what is missing otherwise. ``docs/wait_vidur_fork.md`` says how the checkout used for the
recorded table was assembled, and what it printed.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from harness.core import cmdline  # noqa: E402  (standard library only: the fork worker's Python has no harness deps)
FORK_SCHEDULER = Path("vidur/scheduler/replica_scheduler/general_nested_chunked_replica_scheduler.py")
TRACE_FIELDS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
# ours: (label, arm) on the harness side; theirs: (label, scheduler) in the fork
OUR_ARMS = (("sarathi", "wait_sarathi_llama3"), ("wait_cp", "wait_cp_llama3"), ("vllm", "wait_vllm_llama3"))
FORK_ARMS = ("sarathi", "wait_cp", "vllm")
# the table's comparisons (a / b - 1), each printed with its spread over forest seeds
COMPARISONS = (("wait_cp", "sarathi"), ("wait_cp", "vllm"), ("sarathi", "vllm"))
ARM_LABEL = {"sarathi": "Sarathi", "wait_cp": "WAIT-CP", "vllm": "vLLM-like"}
OUR_MODELS = ("roofline", "vidur_profile", "vidur_profile_per_request")
FORK_VARIANTS = ("public", "pool30_meet", "pool30_all", "kvsave_linear", "kvsave_decode", "attn_sum", "kvsave_pool30",
                 "step_roofline", "step_vidur_profile", "step_vidur_profile_per_request")
# the WAIT authors' fork at the commit with WAIT-CP (luogan_wait_verification's Figure B rerun)
FORK_COMMIT = "011fe971a7cd882458fb58021c25ffeb350efa7d"
# the profile this script trains Vidur's forests on, as shipped (docs/data/SOURCE.md): checked before any run.
# Vidur's full attention.csv (git blob aa049dea in microsoft/vidur@7d47513) could not be had (absent from both
# stored snapshots); the attention file is the hand-transcribed subset (FlashInfer rows)
PROFILE_SHA256 = {
    "vidur_llama3_8b_a100_mlp_ms.csv": "e9d6ad9a396ccb25b65c08cc26ff46c7ae1ad310adf3eec2ab486b34930b7487",
    "vidur_llama3_8b_a100_attention_ms.csv": "b7144248e31b6475f70dc55a90efa530e60c077e83a35c16042dc0334b1997db",
}
# kvsave_pool30 / pool30_*: decode rows added per pooled token count (see the module docstring)
POOL_EXTRA_DECODE_ROWS = 30
# training-data variants: which decode batch sizes of the shipped attention subset get POOL_EXTRA_DECODE_ROWS
# copies of their rows before Vidur's forests are trained ("meet": only where a profiled prefill chunk size is
# also a profiled decode batch size; "all": every decode batch size, as the full file's grid implies)
POOL_ROWS = {"pool30_meet": "meet", "pool30_all": "all"}
# Vidur's grid search (RandomForrestExecutionTimePredictorConfig's defaults at microsoft/vidur@7d47513) and the
# reduced one used by default here (--vidur-grid)
VIDUR_GRIDS = {"reduced": {"num_estimators": None, "max_depth": [32], "min_samples_split": [2], "k_fold_cv_splits": 2},
               "vidur": {"num_estimators": [250, 500, 750], "max_depth": [8, 16, 32], "min_samples_split": [2, 5, 10],
                         "k_fold_cv_splits": 10}}
# Vidur's default prediction grid (BaseExecutionTimePredictorConfig at microsoft/vidur@7d47513: chunk 4,096, tokens
# per request 4,096, KV granularity 64) with the batch-size bound raised from Vidur's 128 to Sarathi's
# batch_size_cap 512 (a batch of more requests than the bound has no predicted time: the lookup fails)
PREDICTION_GRID = {"prediction_max_prefill_chunk_size": 4096, "prediction_max_batch_size": 512,
                   "prediction_max_tokens_per_request": 4096, "kv_cache_prediction_granularity": 64}


# ---------------------------------------------------------------------------------------------------
# traces (no harness or Vidur import needed)

def write_trace(path: Path, rows) -> None:
    """Write ``rows`` = ``[(arrived_at_s, prompt_tokens, output_tokens), ...]`` as Vidur's trace-replay CSV
    (columns ``arrived_at`` (s), ``num_prefill_tokens``, ``num_decode_tokens``; arrival floats as ``repr``,
    the shortest string that reads back to the same double). Raises ``ValueError`` on a negative time or a
    length below 1 (Vidur clips such lengths to 1, so they would not round-trip)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TRACE_FIELDS)
        for t, p, o in rows:
            if not (t >= 0.0) or int(p) < 1 or int(o) < 1:
                raise ValueError(f"{path}: bad trace row (arrived_at={t!r}, prompt={p!r}, output={o!r})")
            w.writerow((repr(float(t)), int(p), int(o)))


def read_trace(path: Path) -> list[tuple[float, int, int]]:
    """The rows of a trace written by :func:`write_trace` (arrival s, prompt tokens, output tokens)."""
    with open(path, newline="") as f:
        return [(float(r["arrived_at"]), int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]))
                for r in csv.DictReader(f)]


def central_mean(rows: list[tuple[float, float]]) -> float:
    """Mean E2E (s) over the central window: ``rows`` = ``[(arrival_s, e2e_s), ...]`` sorted by arrival
    (stable), prompts ``k//4 .. 3k//4 - 1`` (``scripts/wait_check.py``'s ``central``)."""
    rows = sorted(rows, key=lambda r: r[0])
    k = len(rows)
    win = rows[k // 4: 3 * k // 4]
    return sum(e for _, e in win) / len(win)


def t_interval(x: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): two-sided 95 % Student t interval of the mean of ``x`` (needs >= 2 values)."""
    from scipy import stats
    n = len(x)
    m = sum(x) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in x) / (n - 1))
    h = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return m, m - h, m + h


PREFILL_COL = "time_stats.attn_prefill.median"   # Vidur's attention.csv column of the prefill-attention time (ms)


def pool_decode_rows(src: Path, dst: Path, where: str, extra: int = POOL_EXTRA_DECODE_ROWS) -> int:
    """Copy Vidur's attention CSV ``src`` to ``dst`` with ``extra`` more decode rows per chosen decode batch size
    (copies of that batch size's own rows, cycled, each made distinct by a tiny value in the decode row's unused
    prefill-attention column: Vidur drops duplicate rows on load; the decode-attention values per (batch, KV)
    stay as they are, only how many rows Vidur's pooled ``attn_kv_cache_save`` model sees at
    ``max(chunk, batch)`` changes).
    ``where``: ``"meet"`` = the decode batch sizes that are also profiled prefill chunk sizes (where the two kinds
    of rows meet, as ``kvsave_pool30`` patches them); ``"all"`` = every decode batch size (the full file profiles
    every decode batch size at about 32 KV sizes: ``docs/wait_vidur_fork.md``). Returns the rows added; raises
    ``ValueError`` on another ``where`` or a file without decode rows."""
    if where not in ("meet", "all"):
        raise ValueError(f"pool_decode_rows: where must be 'meet' or 'all', not {where!r}")
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{src}: no rows")
    dec: dict[int, list[dict]] = {}
    chunks = set()
    for r in rows:
        if int(r["prefill_chunk_size"]) == 0:
            dec.setdefault(int(r["batch_size"]), []).append(r)
        else:
            chunks.add(int(r["prefill_chunk_size"]))
    if not dec:
        raise ValueError(f"{src}: no decode rows (prefill_chunk_size 0)")
    sizes = sorted(dec) if where == "all" else sorted(set(dec) & chunks)
    # Vidur drops duplicate rows when it loads the file (``_load_attention_df``: ``df.drop_duplicates()``), so a
    # verbatim copy would vanish: each copy gets a distinct value in a column no decode model reads (a decode
    # row's prefill-attention time; Vidur trains attn_prefill on prefill rows only)
    added = []
    for b in sizes:
        for i in range(extra):
            r = dict(dec[b][i % len(dec[b])])
            r[PREFILL_COL] = repr((i + 1) * 1e-9)
            added.append(r)
    with open(dst, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows + added)
    return len(added)


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------
# the fork side: runs inside --vidur-python with the fork's vidur/ on sys.path

def _seed_forests(seed: int) -> None:
    """Seed Vidur's forests (``vidur_reference_predictions.seed_forests``, this script's directory)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vidur_reference_predictions import seed_forests
    seed_forests(seed)


def _exact_cache_keys() -> None:
    """Make Vidur's model and prediction cache keys name what they depend on. Vidur keys a trained model by
    ``str(predictor.to_dict())`` + operator + the training rows' hash, and an operator's predictions by
    ``str(to_dict())`` + ``str(estimator)`` only (``_get_model_hash(model, df=None)`` in
    ``sklearn_execution_time_predictor.py``); ``to_dict`` holds neither the attention file, nor the grid search,
    nor the prediction grid's KV granularity and tokens per request. So two trainings on different attention rows
    would share one cached prediction table. Here both keys also hold the grid search and prediction grid, and a
    prediction key holds the hash of the rows its model was trained on (the cache dir holds the forest seed)."""
    import hashlib
    from vidur.execution_time_predictor.sklearn_execution_time_predictor import SklearnExecutionTimePredictor as P
    orig_hash, orig_train, orig_pred = P._get_model_hash, P._train_model, P._get_model_prediction

    def extra(self) -> str:
        c = self._config
        return (f"grid={c.num_estimators},{c.max_depth},{c.min_samples_split},{c.k_fold_cv_splits};"
                f"pred={c.prediction_max_prefill_chunk_size},{c.prediction_max_batch_size},"
                f"{c.prediction_max_tokens_per_request},{c.kv_cache_prediction_granularity}")

    def train(self, model_name, df, feature_cols, target_col):
        self.__dict__.setdefault("_rows_md5", {})[model_name] = hashlib.md5(df.to_json().encode("utf-8")).hexdigest()
        return orig_train(self, model_name, df, feature_cols, target_col)

    def pred(self, model_name, model, X):
        self._predicting = model_name
        try:
            return orig_pred(self, model_name, model, X)
        finally:
            self._predicting = None

    def model_hash(self, model_name, df=None):
        if df is None:
            op = getattr(self, "_predicting", None)
            rows = self.__dict__.get("_rows_md5", {}).get(op)
            if rows is None:
                raise RuntimeError(f"Vidur prediction cache key: no training rows recorded for operator {op!r}")
            return orig_hash(self, f"{model_name}_{extra(self)}_{rows}", None)
        return orig_hash(self, f"{model_name}_{extra(self)}", df)
    P._train_model, P._get_model_prediction, P._get_model_hash = train, pred, model_hash


def _share_predictor() -> None:
    """One trained predictor per worker process: Vidur builds (and, on a cache miss, trains) its predictor in
    every ``Simulator``; its predictions depend on the predictor's config and training rows, and on the
    scheduler only through ``block_size`` and whether it is Orca (``base_execution_time_predictor.py``), so
    the jobs of one worker (one variant, one forest seed, block 16, no Orca) share one."""
    from vidur.execution_time_predictor.execution_time_predictor_registry import ExecutionTimePredictorRegistry
    orig = ExecutionTimePredictorRegistry.get
    memo: dict = {}

    def get(key, **kw):
        sc = kw["replica_scheduler_config"]
        k = (str(key), sc.block_size, str(sc.get_type()) == "orca")
        if k not in memo:
            memo[k] = orig(key, **kw)
        return memo[k]
    ExecutionTimePredictorRegistry.get = staticmethod(get)

def _our_step_time_s(perf, batch) -> float:
    """Our step model's time (s) for a Vidur ``batch``: a request still prefilling contributes a chunk of
    its scheduled tokens after ``num_processed_tokens`` already in the KV cache (samples a token when the
    chunk completes the prompt), a decoding one a decode over ``num_processed_tokens`` of context; the
    arguments as ``harness/sim/engine.py`` passes them for one mixed step."""
    chunks, dec = [], []
    for r, n in zip(batch.requests, batch.num_tokens):
        if r.is_prefill_complete:
            dec.append(r.num_processed_tokens)
        else:
            chunks.append((n, r.num_processed_tokens, r.num_processed_tokens + n >= r.num_prefill_tokens))
    samp = sum(1 for _, _, s in chunks if s)
    if perf.wants_batch:   # harness.sim.step_model.StepModel
        return perf.step_batch([(n, c) for n, c, _ in chunks], dec, samp).time_s
    if not chunks:
        return perf.decode_step(len(dec), sum(dec)).time_s
    p_tok = sum(n for n, _, _ in chunks)
    p_ctx = sum(c for _, c, _ in chunks)
    pairs = sum(n * c + n * (n + 1) / 2 for n, c, _ in chunks)
    return perf.step(p_tok, pairs, p_ctx, samp, len(dec), sum(dec), len(chunks), 0, 0).time_s


def _patch_predictor(variant: str, attn_csv: str, perf_pickle: str | None = None) -> None:
    """Install the bisection ``variant`` of Vidur's predictor (class-level, this process only)."""
    if variant == "public" or variant in POOL_ROWS:    # the latter differ in their training rows only
        return
    if variant.startswith("step_"):
        import pickle
        sys.path.insert(0, str(ROOT))              # harness.sim.perf needs only numpy
        with open(perf_pickle, "rb") as f:
            perf = pickle.load(f)
        from vidur.scheduler.replica_stage_scheduler.replica_stage_schduler import ReplicaStageScheduler
        from vidur.entities import BatchStage

        def on_schedule(self):
            if self._is_busy or not self._batch_queue:
                return None, None, None
            self._is_busy = True
            batch = self._batch_queue.pop(0)
            t = _our_step_time_s(perf, batch)
            return batch, BatchStage(batch.id, self._replica_id, self._stage_id, t, t, batch.requests,
                                     batch.num_tokens), None
        ReplicaStageScheduler.on_schedule = on_schedule
        return
    import numpy as np
    import pandas as pd
    from vidur.execution_time_predictor.sklearn_execution_time_predictor import SklearnExecutionTimePredictor as P
    df = pd.read_csv(attn_csv)
    save = "time_stats.attn_kv_cache_save.median"
    if variant == "kvsave_linear":
        per_tok = df.loc[df.prefill_chunk_size == 1152, save].mean() / 1152.0

        def kv_save(self, batch):
            return per_tok * sum(batch.num_tokens)
        P._get_attention_kv_cache_save_execution_time = kv_save
    elif variant == "kvsave_decode":
        dec = df[df.prefill_chunk_size == 0].groupby("batch_size")[save].mean()
        xs, ys = dec.index.to_numpy(float), dec.to_numpy(float)

        def kv_save(self, batch):
            n = sum(batch.num_tokens)
            return float(ys[-1] * n / xs[-1]) if n > xs[-1] else float(np.interp(n, xs, ys))
        P._get_attention_kv_cache_save_execution_time = kv_save
    elif variant == "kvsave_pool30":
        orig = P._get_attention_kv_cache_save_execution_time
        dec = df[df.prefill_chunk_size == 0].groupby("batch_size")[save].mean()
        pre = df[df.prefill_chunk_size > 0]
        table = {}
        for c in sorted(set(pre.prefill_chunk_size) & set(range(1, 513))):
            d = float(np.interp(c, dec.index.to_numpy(float), dec.to_numpy(float)))
            rows = pre.loc[pre.prefill_chunk_size == c, save]
            table[int(c)] = (rows.sum() + POOL_EXTRA_DECODE_ROWS * d) / (len(rows) + POOL_EXTRA_DECODE_ROWS)

        def kv_save(self, batch):
            n = sum(batch.num_tokens)
            return table[n] if n in table else orig(self, batch)
        P._get_attention_kv_cache_save_execution_time = kv_save
    elif variant == "attn_sum":
        def prefill(self, batch):
            params = self._get_batch_prefill_attention_params(batch)
            return sum(self._predictions["attn_prefill"][(kv, c ** 2)] for kv, c in params)
        P._get_attention_prefill_execution_time = prefill
    else:
        raise ValueError(f"unknown fork variant {variant!r}")


def fork_worker(job_file: str) -> None:
    """Run the jobs of ``job_file`` (JSON) with the fork's Vidur; writes one JSON result per job."""
    spec = json.loads(Path(job_file).read_text())
    sys.path.insert(0, spec["fork_src"])
    os.environ["WAIT_CP_GATE"] = "on"
    # Vidur's metrics module imports plotly_express and wandb at import time; both serve only plots and
    # Weights & Biases logging, which these runs switch off (write_metrics / store_plots False, no wandb
    # project), so empty stand-ins are enough when the packages are not installed
    import importlib.util
    import types
    for mod in ("plotly_express", "wandb"):
        if importlib.util.find_spec(mod) is None:
            sys.modules[mod] = types.ModuleType(mod)
    import atexit
    import contextlib
    import io
    from vidur.config import (ClusterConfig, GeneralNestedChunkedSchedulerConfig, MetricsConfig,
                              RandomForrestExecutionTimePredictorConfig, ReplicaConfig, SarathiSchedulerConfig,
                              SimulationConfig, TraceRequestGeneratorConfig)
    from vidur.entities import Batch, BatchStage, Cluster, ExecutionTime, Replica, Request
    from vidur.simulator import Simulator
    _patch_predictor(spec["variant"], spec["attention_csv"], spec.get("perf_pickle"))
    if spec.get("forest_seed") is not None:
        _seed_forests(int(spec["forest_seed"]))
    _exact_cache_keys()
    _share_predictor()
    grid = dict(VIDUR_GRIDS[spec.get("vidur_grid", "reduced")])
    if grid["num_estimators"] is None:
        grid["num_estimators"] = [spec["estimators"]]
    for job in spec["jobs"]:
        n = len(read_trace(Path(job["trace"])))
        if job["arm"] == "wait_cp":
            pt = [{"type": "only", "prefill": 512, "decode": 20, "arrival_rate": job["rate"]}]
            sched = GeneralNestedChunkedSchedulerConfig(
                prompt_types=pt, total_limit=21, total_num_requests=n, chunk_size=256, seg_margin=0.0,
                force_clear=True, wait_gate=False)
        elif job["arm"] == "vllm":                # Vidur's vLLM scheduler, its defaults (the paper's baseline)
            from vidur.config import VllmSchedulerConfig
            sched = VllmSchedulerConfig()
        else:
            sched = SarathiSchedulerConfig(chunk_size=512, batch_size_cap=512)
        out = tempfile.mkdtemp(prefix="vidur_fork_out_")
        cfg = SimulationConfig(
            seed=job["seed"],
            cluster_config=ClusterConfig(
                num_replicas=1,
                replica_config=ReplicaConfig(model_name="meta-llama/Meta-Llama-3-8B", device="a100",
                                             memory_margin_fraction=0.1, tensor_parallel_size=1,
                                             num_pipeline_stages=1),
                replica_scheduler_config=sched),
            request_generator_config=TraceRequestGeneratorConfig(trace_file=job["trace"], max_tokens=532),
            execution_time_predictor_config=RandomForrestExecutionTimePredictorConfig(
                compute_input_file=spec["mlp_csv"], attention_input_file=spec["attention_csv"],
                num_training_job_threads=1, **grid, **PREDICTION_GRID),
            metrics_config=MetricsConfig(write_metrics=False, enable_chrome_trace=False, store_plots=False,
                                         output_dir=out, cache_dir=spec["cache_dir"]),
        )
        for cls in (Batch, BatchStage, Cluster, ExecutionTime, Replica, Request):
            cls._id = -1                          # a fresh simulation's ids, as in a process of its own
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            sim = Simulator(cfg)
            atexit.unregister(sim._write_output)
            reqs = [ev._request for _, ev in sim._event_queue]
            sim.run()
        done = [r for r in reqs if r.completed]
        res = {"arm": job["arm"], "rate": job["rate"], "seed": job["seed"], "n": len(reqs),
               "incomplete": len(reqs) - len(done), "restarts": sum(r.num_restarts for r in reqs),
               "rows": [(r.arrived_at, r.completed_at - r.arrived_at if r.completed else None,
                         r.num_prefill_tokens, r.num_decode_tokens) for r in reqs],
               "sim_end_s": sim._time}
        tmp = Path(job["result"] + ".tmp")
        tmp.write_text(json.dumps(res))
        tmp.replace(job["result"])                 # a result file is whole or absent
        print(f"fork {spec['variant']} {job['arm']} rate {job['rate']} seed {job['seed']}: done "
              f"({res['incomplete']} incomplete, {res['restarts']} restarts)", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------
# the harness side

def export_traces(rates, seeds, n, trace_dir: Path) -> dict:
    """One trace per (rate, seed) from the harness's generator (``wait_single`` as composed for the
    Sarathi-like arm); returns ``{(rate, seed): path}``."""
    sys.path.insert(0, str(ROOT))
    from harness.workload.workload import build_workload
    from tests.conftest import compose_run
    paths = {}
    for rate in rates:
        for seed in seeds:
            run = compose_run(["+experiment=wait_paper", "workload=wait_single", f"workload.rate_per_s={rate}",
                               f"workload.num_conversations={n}", f"workload.seed={seed}",
                               "+experiment/arm=wait_sarathi_llama3"])
            convs, _ = build_workload([], run.cfg.workload)
            rows = []
            for t, rec in convs:
                (turn,) = rec.turns
                rows.append((t, turn.new_input_tokens + turn.reused_tokens, turn.output_tokens))
            p = trace_dir / f"wait_single_r{rate:g}_s{seed}_n{n}.csv"
            if not p.is_file() or read_trace(p) != [(float(t), int(i), int(o)) for t, i, o in rows]:
                tmp = p.with_suffix(".tmp")
                write_trace(tmp, rows)
                tmp.replace(p)                    # atomic: a reader sees the old or the new file
            paths[(rate, seed)] = p
    return paths


def ours(arm: str, rate: float, n: int, seed: int, model: str, trace: Path) -> tuple[float, float]:
    """Our (central-window, all-prompt) mean E2E (s); checks the run's submit times equal the trace's
    arrivals. Kept beside the trace (``ours_<model>_<arm>_r<rate>_s<seed>_n<n>.json``) and read from there
    when present."""
    cache = trace.parent / f"ours_{model}_{arm}_r{rate:g}_s{seed}_n{n}.json"
    if cache.is_file():
        return tuple(json.loads(cache.read_text()))
    res = _ours_run(arm, rate, n, seed, model, trace)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(res))
    tmp.replace(cache)
    return res


def _ours_run(arm: str, rate: float, n: int, seed: int, model: str, trace: Path) -> tuple[float, float]:
    sys.path.insert(0, str(ROOT / "scripts"))
    from wait_check import run_arm
    run, res, eng, turns, wall = run_arm(arm, "wait_single", rate, n, seed, [f"engine.step_model={model}"])
    if res.error:
        raise RuntimeError(f"ours {arm} {model} rate {rate} seed {seed}: {res.error}")
    arr = sorted(t for t, _, _ in read_trace(trace))
    sub = sorted(turns["submit_s"].tolist())
    if len(sub) != len(arr) or any(a != b for a, b in zip(arr, sub)):
        raise RuntimeError(f"ours {arm} rate {rate} seed {seed}: submit times differ from {trace}")
    rows = list(zip(turns["submit_s"], turns["finish_s"] - turns["submit_s"]))
    return central_mean(rows), sum(e for _, e in rows) / len(rows)


def our_perf_pickle(model: str, trace_dir: Path) -> Path:
    """Pickle our step model ``model`` as the Llama-3-8B WAIT arms build it (for the ``step_*`` variants)."""
    import pickle
    sys.path.insert(0, str(ROOT / "scripts"))
    from wait_check import run_arm
    _, _, eng, _, _ = run_arm("wait_sarathi_llama3", "wait_single", 20.0, 4, 0, [f"engine.step_model={model}"])
    p = trace_dir / f"perf_{model}.pkl"
    with open(p, "wb") as f:
        pickle.dump(eng.perf, f)
    return p


def run_fork(variant: str, jobs: list[dict], a, mlp: Path, attn: Path, forest_seed: int | None) -> None:
    """Run ``jobs`` in one worker process of ``--vidur-python`` (one variant, one forest seed: one trained
    predictor, cached under ``--cache-dir``/``forest_seed_<k>``; Vidur's cache key does not hold the seed)."""
    cache = Path(a.cache_dir) / (f"forest_seed_{forest_seed}" if forest_seed is not None else "unseeded")
    # one cache per forest seed, shared by the variants: the keys hold the rows and grids (_exact_cache_keys)
    cache.mkdir(parents=True, exist_ok=True)
    spec = {"fork_src": str(a.fork_src), "variant": variant, "mlp_csv": str(mlp), "attention_csv": str(attn),
            "cache_dir": str(cache), "estimators": a.estimators, "vidur_grid": a.vidur_grid,
            "forest_seed": forest_seed, "jobs": jobs}
    if variant.startswith("step_"):
        spec["perf_pickle"] = str(our_perf_pickle(variant[len("step_"):], Path(a.trace_dir)))
    jf = Path(a.trace_dir) / f"fork_jobs_{variant}_fs{forest_seed}.json"
    jf.write_text(json.dumps(spec))
    cmd = [a.vidur_python, str(Path(__file__).resolve()), "--fork-worker", str(jf)]
    r = subprocess.run(cmd, cwd=str(a.fork_src))
    if r.returncode != 0:
        sys.exit(f"the fork's simulator failed (exit {r.returncode}): {' '.join(cmd)}")


def fork_mean(result: Path) -> tuple[float, float]:
    """Their (central-window, all-completed-prompt) mean E2E (s) from a worker's result file."""
    res = json.loads(result.read_text())
    rows = res["rows"]
    win = sorted(rows, key=lambda r: r[0])[len(rows) // 4: 3 * len(rows) // 4]
    if any(e is None for _, e, _, _ in win):
        raise RuntimeError(f"{result}: a request of the central window did not complete")
    done = [e for _, e, _, _ in rows if e is not None]
    return central_mean([(t, e) for t, e, _, _ in rows if e is not None]), sum(done) / len(done)


def fork_identity(fork: Path) -> str:
    """What the fork checkout at ``fork`` is, one line: its git commit (and whether it is :data:`FORK_COMMIT`)
    when it is a git work tree, otherwise "not a git checkout" and the SHA-256 of its WAIT-CP scheduler file."""
    r = subprocess.run(["git", "-C", str(fork), "rev-parse", "HEAD"], capture_output=True, text=True)
    if r.returncode == 0 and r.stdout.strip():
        head = r.stdout.strip()
        return f"fork checkout at commit {head}" + ("" if head == FORK_COMMIT else f" (NOT {FORK_COMMIT})")
    return (f"fork checkout not a git work tree (assembled: docs/wait_vidur_fork.md); {FORK_SCHEDULER.name} sha256 "
            f"{sha256_file(fork / FORK_SCHEDULER)}")


def check_profile(data_dir: Path) -> list[str]:
    """The shipped profile files under ``data_dir`` whose SHA-256 is not :data:`PROFILE_SHA256`'s (``[]``: all
    as recorded), each as ``"<file>: sha256 <got>, expected <want>"`` (``"<file>: missing"``)."""
    bad = []
    for name, want in PROFILE_SHA256.items():
        p = data_dir / name
        if not p.is_file():
            bad.append(f"{name}: missing")
        elif (got := sha256_file(p)) != want:
            bad.append(f"{name}: sha256 {got}, expected {want}")
    return bad


def check_inputs(ap, a) -> None:
    """Exit 2 with one line naming what is missing (``ap.error``), before anything expensive."""
    bad = check_profile(ROOT / "docs" / "data")
    if bad:
        ap.error("profile files differ from the ones this table was recorded with (docs/data/SOURCE.md): "
                 + "; ".join(bad))
    fork = Path(a.fork_src)
    if not (fork / FORK_SCHEDULER).is_file():
        ap.error(f"--fork-src: {fork / FORK_SCHEDULER} not found: a checkout of Luoxiaogan/vidur_or at 011fe971a7cd "
                 "is needed there (docs/wait_vidur_fork.md, 'The fork')")
    if not Path(a.vidur_python).is_file():
        ap.error(f"--vidur-python: {a.vidur_python} not found: a Python with numpy, pandas, scikit-learn, fasteners, "
                 "pyyaml (scripts/vidur_reference_predictions.py's docstring)")
    for v in [v for v in a.fork_variants.split(",") if v]:
        if v not in FORK_VARIANTS:
            ap.error(f"--fork-variants: unknown variant {v!r}; one of {FORK_VARIANTS}")
    for m in [m for m in a.ours.split(",") if m]:
        if m not in OUR_MODELS:
            ap.error(f"--ours: unknown step model {m!r}; one of {OUR_MODELS}")


def main(argv=None) -> None:
    ap = cmdline.ArgumentParser(prog="scripts/vidur_fork_side_by_side.py", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 printed; 2 bad input (one line naming the flag); 1 the fork's "
                                       "simulator failed; 130 interrupted (finished fork results are kept).")
    ap.add_argument("--rates", type=cmdline.number_list(0, lo_open=True), default="20,22,24",
                    help="prompts/s (> 0), comma-separated")
    ap.add_argument("--seeds", type=cmdline.number_list(0, integer=True, min_len=2), default="0,1,2",
                    help="workload seeds, comma-separated (at least 2: the t interval)")
    ap.add_argument("--n", type=cmdline.number(1, integer=True), default=2000, help="prompts per run")
    ap.add_argument("--fork-src", default="/work/vidur-fork-src", help="checkout of Luoxiaogan/vidur_or@011fe971a7cd")
    ap.add_argument("--vidur-python", default="/work/vidur-venv/bin/python")
    ap.add_argument("--cache-dir", default="/work/vidur-fork-cache", help="Vidur's trained-predictor cache")
    ap.add_argument("--trace-dir", default="/work/vidur-fork-traces", help="exported traces and fork results")
    ap.add_argument("--estimators", type=cmdline.number(1, integer=True), default=100,
                    help="random-forest trees (Vidur's grid: 250/500/750)")
    ap.add_argument("--vidur-grid", choices=sorted(VIDUR_GRIDS), default="reduced",
                    help="Vidur's forest grid search: 'reduced' (--estimators trees, depth 32, split 2, 2-fold CV) or "
                         "'vidur' (Vidur's default: 250/500/750 trees x depth 8/16/32 x split 2/5/10, 10-fold CV; "
                         "hours)")
    seeds_list = cmdline.number_list(0, integer=True, ranges=True)
    ap.add_argument("--forest-seeds", type=lambda t: [] if not t.strip() else seeds_list(t), default="0-4",
                    help="random_state of Vidur's forests, comma-separated: one trained predictor per seed, the "
                         "spread over them printed beside every ratio ('' = unseeded, as Vidur trains them)")
    ap.add_argument("--ours", default=",".join(OUR_MODELS), help="our step models ('' for none)")
    ap.add_argument("--fork-variants", default="public", help=f"comma-separated, of {FORK_VARIANTS} ('' for none)")
    ap.add_argument("--arms", default=",".join(FORK_ARMS),
                    help=f"comma-separated, of {', '.join(FORK_ARMS)} (sarathi and wait_cp are needed; vllm: Vidur's "
                         "vLLM scheduler with its defaults, and wait_vllm_llama3 on our side)")
    ap.add_argument("--fork-worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.fork_worker:
        fork_worker(a.fork_worker)
        return
    check_inputs(ap, a)
    arms = [x for x in a.arms.split(",") if x]
    if any(x not in FORK_ARMS for x in arms) or not {"sarathi", "wait_cp"} <= set(arms):
        ap.error(f"argument --arms: comma-separated names of {', '.join(FORK_ARMS)}, sarathi and wait_cp included; "
                 f"got {a.arms!r}")
    rates, seeds = a.rates, a.seeds
    tdir = Path(a.trace_dir)
    tdir.mkdir(parents=True, exist_ok=True)
    Path(a.cache_dir).mkdir(parents=True, exist_ok=True)
    traces = export_traces(rates, seeds, a.n, tdir)
    from vidur_reference_predictions import write_vidur_inputs
    prof = tdir / "profile"
    prof.mkdir(exist_ok=True)
    mlp, attn = write_vidur_inputs(prof)

    print(fork_identity(Path(a.fork_src)) + "; profile: " + ", ".join(f"{n} sha256 {h[:16]}.. (checked)"
                                                                  for n, h in PROFILE_SHA256.items()), flush=True)
    print("profile files (Vidur's layout, what the forests train on): "
          + "; ".join(f"{p.name} sha256 {sha256_file(p)}" for p in (mlp, attn)), flush=True)
    variants = [v for v in a.fork_variants.split(",") if v]
    fseeds = list(a.forest_seeds) if a.forest_seeds else [None]
    # (simulator label, rate) -> {arm: {forest seed: [(central, all) per workload seed]}}
    table: dict = {}
    v_attns = {}
    for v in variants:
        v_attns[v] = attn
        if v in POOL_ROWS:
            v_attns[v] = prof / f"attention_{v}.csv"
            added = pool_decode_rows(attn, v_attns[v], POOL_ROWS[v])
            print(f"{v}: {added} decode rows added ({v_attns[v].name} sha256 {sha256_file(v_attns[v])})", flush=True)
    for fs in fseeds:                             # forest seeds outermost: an interrupted sweep has whole seeds
        for v in variants:
            v_attn = v_attns[v]
            tag = f"fs{fs}" if fs is not None else "unseeded"
            jobs = [{"arm": arm, "rate": r, "seed": s, "trace": str(traces[(r, s)]),
                     "result": str(tdir / f"fork_{v}_{tag}_{a.vidur_grid}_{arm}_r{r:g}_s{s}_n{a.n}.json")}
                    for r in rates for s in seeds for arm in arms]
            # a result already there (same trace dir, variant, forest seed, grid, arm, rate, seed, n) is kept: an
            # interrupted sweep resumes where it stopped (unseeded results are not reproducible: rerun them)
            todo = [j for j in jobs if not Path(j["result"]).is_file()]
            if todo:
                run_fork(v, todo, a, mlp, v_attn, fs)
            for j in jobs:
                table.setdefault((f"fork:{v}", j["rate"]), {}).setdefault(j["arm"], {}).setdefault(fs, []).append(
                    fork_mean(Path(j["result"])))
    for m in [m for m in a.ours.split(",") if m]:
        for r in rates:
            for label, arm in [x for x in OUR_ARMS if x[0] in arms]:
                for s in seeds:
                    table.setdefault((f"ours:{m}", r), {}).setdefault(label, {}).setdefault(None, []).append(
                        ours(arm, r, a.n, s, m, traces[(r, s)]))
    print_table(table, rates, seeds, fseeds, a)


def ratio_summary(sar: dict, wcp: dict) -> dict:
    """The ``a / b - 1`` statistics of one table row (``wcp`` the arm ``a``, ``sar`` the arm ``b``: WAIT-CP over
    Sarathi, WAIT-CP or Sarathi over vLLM-like). ``sar``, ``wcp``: ``{forest seed: [(central s, all-prompt s) per
    workload seed]}`` (same keys, same workload seeds in the same order). Returns ``per_fs`` (per forest seed, the
    mean over workload seeds of the paired central-window ratio), ``mean`` (over forest seeds of ``per_fs``),
    ``lo``/``hi`` (the spread: min and max of ``per_fs``), ``t`` (the two-sided 95 % t interval over workload seeds
    of the per-workload-seed ratio averaged over forest seeds) and ``t_all`` (the same for the all-prompt mean)."""
    fss = list(sar)
    per = {fs: [w[0] / x[0] - 1.0 for w, x in zip(wcp[fs], sar[fs])] for fs in fss}
    per_all = {fs: [w[1] / x[1] - 1.0 for w, x in zip(wcp[fs], sar[fs])] for fs in fss}
    per_fs = [sum(per[fs]) / len(per[fs]) for fs in fss]
    k = len(per[fss[0]])
    by_ws = [sum(per[fs][i] for fs in fss) / len(fss) for i in range(k)]
    by_ws_all = [sum(per_all[fs][i] for fs in fss) / len(fss) for i in range(k)]
    return {"per_fs": per_fs, "mean": sum(per_fs) / len(per_fs), "lo": min(per_fs), "hi": max(per_fs),
            "t": t_interval(by_ws), "t_all": t_interval(by_ws_all)}


def _mean_e2e(runs: dict) -> float:
    return sum(x[0] for v in runs.values() for x in v) / sum(len(v) for v in runs.values())


def print_table(table: dict, rates, seeds, fseeds, a) -> None:
    """Print the side-by-side table (markdown), one row per (simulator, rate, comparison of :data:`COMPARISONS`
    whose two arms it ran), each ratio with its spread over the forest seeds."""
    fs_txt = ("unseeded forests (as Vidur trains them)" if fseeds == [None]
              else f"forest seeds {fseeds} ({a.vidur_grid} grid search)")
    print(f"wait_single (512/20), Llama-3-8B, 1 x A100, n={a.n} per run, workload seeds {seeds}, {fs_txt}; "
          "central-window (25-75 % by arrival) mean E2E (s), mean over seeds")
    print("| simulator: step model | rate (/s) | a / b | a E2E (s) | b E2E (s) | a / b - 1 | "
          "spread over forest seeds [min, max] | per forest seed | 95 % t over workload seeds | "
          "all prompts: 95 % t |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rates:
        for key in [k for k in table if k[1] == r]:
            for x, y in [c for c in COMPARISONS if c[0] in table[key] and c[1] in table[key]]:
                st = ratio_summary(table[key][y], table[key][x])
                forest = len(table[key][y]) > 1 or next(iter(table[key][y])) is not None
                spread = f"[{st['lo']:+.2%}, {st['hi']:+.2%}]" if forest else "n/a (no forest)"
                per_fs = " / ".join(f"{v:+.2%}" for v in st["per_fs"]) if forest else "n/a"
                (m, lo, hi), (ma, loa, hia) = st["t"], st["t_all"]
                print(f"| {key[0]} | {r:g} | {ARM_LABEL[x]} / {ARM_LABEL[y]} | {_mean_e2e(table[key][x]):.3f} | "
                      f"{_mean_e2e(table[key][y]):.3f} | {st['mean']:+.2%} | {spread} | {per_fs} | "
                      f"[{lo:+.2%}, {hi:+.2%}] | {ma:+.2%} [{loa:+.2%}, {hia:+.2%}] |", flush=True)


if __name__ == "__main__":
    if "--fork-worker" not in sys.argv:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(cmdline.run(main))
