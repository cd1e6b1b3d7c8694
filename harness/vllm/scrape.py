"""Parse vLLM's Prometheus ``/metrics`` text into the numbers a policy may observe.

Metric names (vLLM V1, all prefixed ``vllm:``): ``kv_cache_usage_perc`` (a 0-1 fraction despite the
name), ``num_requests_running``, ``num_requests_waiting``, ``prefix_cache_queries_total``,
``prefix_cache_hits_total``, ``external_prefix_cache_hits_total``, ``num_preemptions_total``,
``time_to_first_token_seconds`` (histogram), and ``cache_config_info`` (labels ``num_gpu_blocks``,
``block_size``).
"""

from __future__ import annotations

import math
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from prometheus_client.parser import text_string_to_metric_families

# Gauges that are fractions per engine: averaged over label sets (engines), never summed.
FRACTION_GAUGES = frozenset({"vllm:kv_cache_usage_perc"})


@dataclass
class Scrape:
    """One parsed scrape: ``values[name]`` sums samples over label sets (engines, models), except the
    fraction gauges (``FRACTION_GAUGES``), which are averaged; ``labels[name]`` keeps the first sample's
    labels. Histogram samples keep their ``_sum`` / ``_count`` names (buckets are not kept)."""

    values: dict[str, float] = field(default_factory=dict)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)

    def get(self, name: str, default: float = math.nan) -> float:
        """Value of ``name`` (with or without the ``vllm:`` prefix)."""
        if name in self.values:
            return self.values[name]
        return self.values.get("vllm:" + name, default)


def parse_metrics(text: str) -> Scrape:
    """Parse Prometheus text exposition format with ``prometheus_client``'s parser (so label values
    holding ``}`` or escaped quotes parse right); samples are summed across label sets, fraction gauges
    averaged.

    Raises:
        ValueError: the text is not valid exposition format.
    """
    out = Scrape()
    counts: dict[str, int] = {}
    # bucket lines (most of a vLLM /metrics text) are skipped below anyway: drop them before the parser
    text = "\n".join(ln for ln in text.split("\n") if "_bucket{" not in ln)
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            name = smp.name
            if name.endswith("_bucket") or name.endswith("_created"):
                continue
            # the parser strips a counter's ``_total``; the sample name keeps it
            out.values[name] = out.values.get(name, 0.0) + float(smp.value)
            counts[name] = counts.get(name, 0) + 1
            out.labels.setdefault(name, dict(smp.labels))
    for name in FRACTION_GAUGES & out.values.keys():
        out.values[name] /= counts[name]
    return out


def kv_capacity_tokens(s: Scrape) -> int:
    """KV capacity from ``vllm:cache_config_info`` labels (num_gpu_blocks x block_size), tokens.

    Raises:
        ValueError: if the labels are missing.
    """
    lab = s.labels.get("vllm:cache_config_info", {})
    try:
        return int(lab["num_gpu_blocks"]) * int(lab["block_size"])
    except (KeyError, ValueError):
        raise ValueError("vllm:cache_config_info with num_gpu_blocks and block_size not found in /metrics") from None


def histogram_mean(s: Scrape, name: str) -> tuple[float, float]:
    """``(sum, count)`` of a histogram (e.g. ``vllm:time_to_first_token_seconds``)."""
    return s.get(name + "_sum", math.nan), s.get(name + "_count", math.nan)


# The histograms ``server_metrics.json`` keeps (``logger.steps``): per engine step (iteration tokens) and
# per request (prefill, decode, queue, inference time; TTFT, ITL, E2E), all clocked inside vLLM's engine.
STEP_HISTOGRAMS = ("vllm:iteration_tokens_total", "vllm:request_prefill_time_seconds",
                   "vllm:request_decode_time_seconds", "vllm:request_queue_time_seconds",
                   "vllm:request_inference_time_seconds", "vllm:time_to_first_token_seconds",
                   "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
                   "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
                   "vllm:request_prefill_kv_computed_tokens")


# Per-request histograms (one observation per finished request): what ``finish_scrapes`` keeps.
REQUEST_HISTOGRAMS = ("vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                      "vllm:request_queue_time_seconds", "vllm:request_prompt_tokens",
                      "vllm:request_generation_tokens", "vllm:request_prefill_kv_computed_tokens")


def parse_histograms(text: str, names=STEP_HISTOGRAMS) -> dict[str, dict]:
    """The histograms ``names`` of a ``/metrics`` text, summed over label sets (engines):
    ``{name: {"le": [upper bounds], "cumulative": [counts], "sum": float, "count": float}}`` (the units are
    the metric's: s for ``*_seconds``, tokens otherwise; ``le`` ends with ``inf``). Missing ones are absent.

    Raises:
        ValueError: the text is not valid exposition format.
    """
    out: dict[str, dict] = {}
    # only the lines of the wanted families (and comments) go to the parser: the same result, a fraction
    # of the parse time on a 600-line vLLM text
    keep = tuple(names) + tuple(n[:-len("_total")] for n in names if n.endswith("_total"))
    text = "\n".join(ln for ln in text.split("\n") if ln.startswith("#") or ln.startswith(keep))
    for fam in text_string_to_metric_families(text):
        if fam.name not in names and fam.name + "_total" not in names:
            continue
        name = fam.name if fam.name in names else fam.name + "_total"
        h = out.setdefault(name, {"le": [], "cumulative": [], "sum": 0.0, "count": 0.0})
        buckets: dict[float, float] = dict(zip(h["le"], h["cumulative"]))
        for smp in fam.samples:
            if smp.name.endswith("_bucket"):
                le = float(smp.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + float(smp.value)
            elif smp.name.endswith("_sum"):
                h["sum"] += float(smp.value)
            elif smp.name.endswith("_count"):
                h["count"] += float(smp.value)
        h["le"] = sorted(buckets)
        h["cumulative"] = [buckets[k] for k in h["le"]]
    return out


def histogram_delta(before: dict[str, dict], after: dict[str, dict]) -> dict[str, dict]:
    """``after - before`` of two :func:`parse_histograms` results (what accrued in between), with the mean
    (``sum / count``, NaN for no observation) of each; histograms absent before count from zero."""
    out = {}
    for name, a in after.items():
        b = before.get(name, {"le": a["le"], "cumulative": [0.0] * len(a["le"]), "sum": 0.0, "count": 0.0})
        prev = dict(zip(b["le"], b["cumulative"]))
        cum = [c - prev.get(le, 0.0) for le, c in zip(a["le"], a["cumulative"])]
        n = a["count"] - b["count"]
        s = a["sum"] - b["sum"]
        out[name] = {"le": a["le"], "cumulative": cum, "sum": s, "count": n, "mean": s / n if n > 0 else math.nan}
    return out


# The samples the periodic scrape needs (``VllmBackend.observe``: the policies' view and instances.parquet;
# preemptions): what :data:`OBSERVE_PATH` asks vLLM for.
OBSERVE_SAMPLES = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
                   "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total")

# ``/metrics/?name[]=...``: vLLM 0.32 serves ``/metrics`` (no slash) with prometheus-fastapi-instrumentator's
# handler, which renders the whole registry (~60 KB for one tiny-model server) whatever the query; the same
# registry is also mounted as ``prometheus_client``'s ASGI app (``vllm/entrypoints/serve/instrumentator/
# metrics.py``), reached with the slash, whose ``name[]`` parameters restrict the rendering to the
# collectors of those samples (``prometheus_client.exposition._bake_output``, ``restricted_registry``):
# ~1 KB. Measured on this machine (``benchmarks/server_observation_cost.py``: tiny model, 2-core host at load
# average 8-10, blocks of 100 GETs, 6 each): the API server's CPU time per GET 5.2-7.1 ms for the full 59 KB
# text, 0.6-1.2 ms restricted (docs/metrics.md).
OBSERVE_PATH = "/metrics/?" + urllib.parse.urlencode([("name[]", n) for n in OBSERVE_SAMPLES])


def fetch_metrics(url: str, timeout_s: float = 10.0, path: str = "/metrics") -> tuple[Optional[str], str]:
    """``GET url + path`` (default ``/metrics``; :data:`OBSERVE_PATH` for the restricted text) with a
    blocking client (``urllib``; for :class:`MetricsPoller`'s thread): ``(text, "")``, or ``(None, why)``
    for an HTTP status other than 200 or a connection error."""
    try:
        with urllib.request.urlopen(url + path, timeout=timeout_s) as r:
            if r.status != 200:
                return None, f"HTTP {r.status}"
            return r.read().decode("utf-8", "replace"), ""
    except urllib.error.HTTPError as e:
        return None, f"HTTP {e.code}"
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
        return None, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


class MetricsPoller:
    """Every ``/metrics`` GET and parse of a running replay, in one thread of its own, so that the event
    loop that reads the token streams does nothing slower than a timestamp (a scrape of a
    tiny-model server is a 63 KB text whose parse took 6-15 ms on the loop, added to the client's TTFT).

    Two kinds of work, served in order of arrival:

    * the periodic scrape: every ``interval_s`` s, each instance's text (``paths[i]``: :data:`OBSERVE_PATH`
      where the server restricts its rendering, else ``/metrics``) parsed by :func:`parse_metrics`
      into ``on_scrape(i, scrape, fetch_s)`` (or ``on_error(i, why)``), then ``on_round()`` once per round
      (the caller hands it to its loop with ``call_soon_threadsafe``);
    * ``finish(i)`` (``backend.engine_times=scrape`` only; vLLM's spans replace it, ``harness.vllm.otlp``):
      one full ``/metrics`` GET of instance ``i`` per finished turn, its :data:`REQUEST_HISTOGRAMS` sums and
      counts appended to ``finish_records`` as ``{"t_s", "t_end_s", "instance", name: [sum, count]}``,
      ``t_s`` / ``t_end_s`` from ``now()`` (the run clock, s) when the GET was sent and answered (what
      ``VllmBackend`` appended before, on the loop); an instance that does not answer appends nothing.

    Args:
        urls: base URL per instance. names: instance names (for the records). now: the run clock
            (thread-safe; ``AsyncioClock.now``). interval_s: the periodic scrape's period, s (None: no
            periodic scrape). timeout_s: per GET, s. on_failure: called (in the thread) with an exception
            that ended the thread (e.g. ``ValueError`` from a text that is not exposition format; it is
            also kept in ``failures``). paths: per instance, the periodic scrape's path (default
            ``/metrics`` for all).
    ``stop(drain_s)`` ends the thread after the finish GETs already asked for (up to ``drain_s`` s).
    """

    def __init__(self, urls: Sequence[str], names: Sequence[str], now: Callable[[], float],
                 interval_s: Optional[float], on_scrape: Callable[[int, "Scrape", float], None] = lambda i, s, d: None,
                 on_error: Callable[[int, str], None] = lambda i, why: None,
                 on_round: Callable[[], None] = lambda: None, timeout_s: float = 10.0,
                 on_failure: Callable[[BaseException], None] = lambda e: None,
                 paths: Optional[Sequence[str]] = None):
        if interval_s is not None and not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.urls, self.names, self.now = list(urls), list(names), now
        self.paths = list(paths) if paths is not None else ["/metrics"] * len(self.urls)
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.on_scrape, self.on_error, self.on_round = on_scrape, on_error, on_round
        self.on_failure = on_failure
        self.finish_records: list[dict] = []
        self.failures: list[BaseException] = []
        self._q: "queue.Queue[Optional[int]]" = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-poller", daemon=True)

    def start(self) -> "MetricsPoller":
        """Start the thread (the first periodic round runs at once)."""
        self._thread.start()
        return self

    def finish(self, i: int) -> None:
        """Ask for instance ``i``'s request histograms now (thread-safe, returns at once)."""
        self._q.put(i)

    def stop(self, drain_s: float = 10.0) -> None:
        """Serve the finish GETs already asked for (for up to ``drain_s`` s), then end the thread (nothing if
        it never started)."""
        if self._thread.ident is None:
            return
        self._q.put(None)
        self._thread.join(drain_s)
        self._stop.set()
        self._thread.join(self.timeout_s + 1.0)

    def _round(self) -> None:
        for i, url in enumerate(self.urls):
            t0 = time.perf_counter()
            text, why = fetch_metrics(url, self.timeout_s, self.paths[i])
            if text is None:
                self.on_error(i, why)
                continue
            fetch_s = time.perf_counter() - t0
            self.on_scrape(i, parse_metrics(text), fetch_s)
        self.on_round()

    def _finish_one(self, i: int) -> None:
        t0 = self.now()
        text, _ = fetch_metrics(self.urls[i], self.timeout_s)
        if text is None:
            return
        t1 = self.now()
        h = parse_histograms(text, REQUEST_HISTOGRAMS)
        self.finish_records.append({"t_s": t0, "t_end_s": t1, "instance": self.names[i],
                                    **{k: [v["sum"], v["count"]] for k, v in h.items()}})

    def _run(self) -> None:
        next_round = time.perf_counter()
        draining = False
        while not self._stop.is_set():
            try:
                if self.interval_s is not None and not draining and time.perf_counter() >= next_round:
                    self._round()
                    next_round = max(next_round + self.interval_s, time.perf_counter())
                wait = None if self.interval_s is None or draining else max(0.0, next_round - time.perf_counter())
                try:
                    item = self._q.get(timeout=wait)
                except queue.Empty:
                    continue
                if item is None:
                    draining = True
                    if self._q.empty():
                        return
                    self._q.put(None)   # serve what came before the stop first
                    continue
                self._finish_one(item)
            except Exception as e:  # noqa: BLE001 -- kept and handed to the owner, never lost
                self.failures.append(e)
                self.on_failure(e)
                return
