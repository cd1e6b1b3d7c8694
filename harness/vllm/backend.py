"""The real-vLLM ``Backend``: executes turns as HTTP requests and observes instances via ``/metrics``.

Prompts are token ids whose lengths and shared prefixes follow the trace: turn k+1's prompt is the first
``reused_tokens`` ids of turn k's context (its prompt ids + the ids the server generated) followed by
``new_input_tokens`` fresh ids, so the server's prefix cache sees what the real agent produced. Fresh ids
come from a generator seeded by (seed, conversation, turn). Every response's token count is checked
against ``max_tokens``; a mismatch fails the turn with an error instead of passing silently.

P/D follows vLLM's proxy: the prompt goes to the prefiller with ``max_tokens = 1`` (and
``kv_transfer_params = {"do_remote_decode": true}`` for NIXL), then to the decoder with the
``kv_transfer_params`` of that response; the decoder's connector loads the KV.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import secrets
import time
import urllib.parse
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

import aiohttp
import numpy as np

from harness.core.backend import InstanceInfo, InstanceState, TurnJob
from harness.core.trace import ConversationRecord
from harness.vllm.client import CompletionResult, completion_body, encode_body, prefill_only, stream_completion
from harness.vllm.energy import EnergyMeter, local_counters
from harness.vllm.otlp import vllm_request_id
from harness.vllm.scrape import OBSERVE_PATH, MetricsPoller, Scrape, kv_capacity_tokens, parse_metrics

log = logging.getLogger(__name__)

# prepare_first_turns: at most this many prompt ids are prepared before the run (kept as a list of ints, about
# 36 bytes each, and as JSON bytes, about 6: ~85 MB at the cap); the rest are prepared at their send time
PREPARE_FIRST_TURNS_MAX_IDS = 2_000_000

# ids below this are the tiny tokenizer's special tokens (<|endoftext|>, <|im_start|>, <|im_end|>)
FIRST_ID = 3


@dataclass
class Endpoint:
    """One serving instance: name, role, base URL and hardware label (for the view)."""

    name: str
    role: str
    url: str
    hardware: str = "cpu"
    device: Optional[str] = None


class ContextBook:
    """Token-id contexts of every conversation (the prompts the replay sends).

    Args:
        vocab_size: the served model's vocabulary; ids are drawn from ``[FIRST_ID, vocab_size)``.
        seed: the workload seed (every draw is seeded by it).
        records: the workload's conversations (optional). Needed for the two kinds of sharing across
            conversations (``docs/prefix_caching.md``): a request trace's ``hash_ids`` (a turn's new input
            is its ``hash_block_tokens``-id blocks, each block drawn from a generator seeded by
            ``(seed, digest of the id chain up to it)``, so equal id chains give equal blocks in every
            request -- a session's later turns chain from the session and turn, private), and
            ``shared_prefix_tokens``.
        shared_prefix_tokens: the first N ids of every conversation's first prompt (capped as in
            ``harness.workload.prefix.BlockContent``) are the same ids in all conversations.
    Other new input is fresh ids from a generator seeded by ``(seed, conversation, turn)``.
    """

    def __init__(self, vocab_size: int, seed: int, records: Iterable[ConversationRecord] = (),
                 shared_prefix_tokens: int = 0):
        if vocab_size <= FIRST_ID + 1:
            raise ValueError(f"vocab_size must be > {FIRST_ID + 1}, got {vocab_size}")
        self.vocab, self.seed = vocab_size, seed
        self._ctx: dict[str, list[int]] = {}
        self._records = {r.conversation_id: r for r in records}
        self.shared_prefix_tokens = shared_prefix_tokens
        self._blocks: dict[int, list[int]] = {}

    def _draw(self, key: Sequence[int], n: int) -> list[int]:
        return np.random.default_rng([self.seed, *key]).integers(FIRST_ID, self.vocab, size=n).tolist()

    @staticmethod
    def _digest(*parts: object) -> int:
        return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")

    def _hash_block_ids(self, rec: ConversationRecord, turn: int, new: int) -> list[int]:
        """``new`` ids of a request-trace turn's new input, block by block from its ``hash_ids``."""
        size = rec.hash_block_tokens
        ids: list[int] = []
        chain = self._digest("root") if turn == 0 else self._digest("session", rec.conversation_id, turn)
        hash_ids = rec.turns[turn].hash_ids
        for i, h in enumerate(hash_ids):
            if len(ids) >= new:
                break
            chain = self._digest(chain, h)
            last = i == len(hash_ids) - 1
            want = max(size, new - len(ids)) if last else size   # the last id covers any rest
            block = self._blocks.get(chain)
            if block is None or len(block) < want:
                block = self._blocks[chain] = self._draw((chain,), want)
            ids.extend(block[:min(want, new - len(ids))])
        if len(ids) < new:                                     # no ids at all: private input
            ids.extend(self._draw((self._digest("in", rec.conversation_id, turn),), new - len(ids)))
        return ids

    def build(self, conversation_id: str, turn: int, reused: int, new: int) -> list[int]:
        """Turn ``turn``'s prompt ids: ``reused`` ids of the previous context + ``new`` new ids, without
        recording them as the conversation's context (:meth:`commit` does; :meth:`prompt` does both).
        The same arguments give the same ids until the context changes.

        Raises:
            ValueError: if ``reused`` exceeds the previous context.
        """
        prev = self._ctx.get(conversation_id, [])
        if reused > len(prev):
            raise ValueError(f"{conversation_id} turn {turn}: reused_tokens={reused} > previous context {len(prev)}")
        rec = self._records.get(conversation_id)
        if rec is not None and turn < len(rec.turns) and rec.turns[turn].hash_ids is not None:
            fresh = self._hash_block_ids(rec, turn, new)
        else:
            h = int.from_bytes(hashlib.sha256(conversation_id.encode()).digest()[:8], "little")
            rng = np.random.default_rng([self.seed, h, turn])
            fresh = rng.integers(FIRST_ID, self.vocab, size=new).tolist()
            if turn == 0 and rec is not None and self.shared_prefix_tokens:
                t = rec.turns
                n = min(self.shared_prefix_tokens, t[0].prompt_tokens, *(x.reused_tokens for x in t[1:]), new)
                fresh[:n] = self._draw((self._digest("shared-prefix"),), n)
        return prev[:reused] + fresh

    def commit(self, conversation_id: str, ids: list[int]) -> None:
        """Record ``ids`` (a :meth:`build` result) as the conversation's context."""
        self._ctx[conversation_id] = ids

    def prompt(self, conversation_id: str, turn: int, reused: int, new: int) -> list[int]:
        """:meth:`build` and :meth:`commit`: the prompt ids, now the conversation's context.

        Raises:
            ValueError: if ``reused`` exceeds the previous context.
        """
        ids = self.build(conversation_id, turn, reused, new)
        self.commit(conversation_id, ids)
        return ids

    def extend(self, conversation_id: str, output_ids: Sequence[int]) -> None:
        """Append a turn's generated ids to the conversation's context."""
        self._ctx[conversation_id] = self._ctx[conversation_id] + list(output_ids)


class VllmBackend:
    """Turns as HTTP requests to running vLLM servers (launched or given as endpoints), and their state
    from ``/metrics``; ``harness.vllm.cluster.VllmCluster`` wraps it as a ``Cluster``.

    Args:
        endpoints: one per cluster instance, in index order. model: the served model name.
        clock: an ``AsyncioClock``. session: an aiohttp session. contexts: the token-id book.
        pd_kv_params: ``kv_transfer_params`` for P/D prefill requests (``None`` for connectors that
            need none, e.g. ExampleConnector). request_timeout_s: per request, s.
        on_error: called with an exception raised by the controller or a policy inside a turn's
            completion callback (the run then ends with it).
    ``on_progress`` (settable) is called after every finished or failed turn.
    Call ``await connect()`` (reads capacities), then the controller drives it.

    While a run streams, the loop does no ``/metrics`` work: ``poller`` (a
    ``harness.vllm.scrape.MetricsPoller``, set by ``VllmCluster``) scrapes in its own thread, and after a
    finished turn only a ``poller.finish(i)`` is queued. Request bodies are serialised ahead of their send
    time: every first turn by :meth:`prepare_first_turns` before the clock starts, and turn k+1 of a
    conversation right after turn k finished (:meth:`prepare`); a turn whose prepared body does not match
    its job (other lengths) is built at its send time. Each request carries ``X-Request-Id``
    ``h<run tag>-<conversation>-<turn>`` (:meth:`request_id`); ``completed`` lists, per completed turn and
    in finish order, the vLLM request id of each of its requests (``cmpl-<X-Request-Id>-0``: the id of its
    OpenTelemetry span) with its conversation, turn, instance and part (``decode``; ``prefill`` for the
    prefill request of a P/D turn) and ``finish_s`` (run clock, s).
    """

    def __init__(self, endpoints: Sequence[Endpoint], model: str, clock, session: aiohttp.ClientSession,
                 contexts: ContextBook, pd_kv_params: Optional[dict] = None, request_timeout_s: float = 600.0,
                 on_error: Callable[[BaseException], None] = lambda e: None, energy: Optional[EnergyMeter] = None):
        self.endpoints = list(endpoints)
        self.model, self.clock, self.session, self.contexts = model, clock, session, contexts
        self.pd_kv_params, self.timeout_s = pd_kv_params, request_timeout_s
        self.on_error = on_error
        self.on_progress: Callable[[], None] = lambda: None
        self.infos: tuple[InstanceInfo, ...] = ()
        self.scrapes: list[Optional[Scrape]] = [None] * len(self.endpoints)
        self.scrape_error: list[str] = [""] * len(self.endpoints)
        self.scrape_s: list[float] = []
        # energy: gathered per node by the launcher; else NVML on this machine for each endpoint's devices
        self.energy = energy if energy is not None else EnergyMeter(
            [local_counters(e.device).read for e in self.endpoints])
        self.tasks: set[asyncio.Task] = set()
        self.mismatches = 0
        # backend.engine_times=scrape: after every completed turn, its decode instance's request histograms (sum, count),
        # so that an interval in which exactly one request finished gives that request's engine-side times
        self.finish_scrapes: Optional[list[dict]] = None
        self.poller: Optional[MetricsPoller] = None
        self.tag = secrets.token_hex(3)
        self.completed: list[dict] = []
        # per instance, the periodic scrape's path: the restricted text where the server serves it (connect)
        self.observe_paths: list[str] = ["/metrics"] * len(self.endpoints)
        # (conversation, turn) -> ((reused, new, output_tokens), prompt ids, local streaming body bytes)
        self._prepared: dict[tuple[str, int], tuple[tuple[int, int, int], list[int], bytes]] = {}

    def request_id(self, conversation_id: str, turn: int, part: str = "") -> str:
        """The ``X-Request-Id`` of a turn's request: ``h<tag>-<conversation, URL-quoted>-<turn>[part]``
        (``part``: ``"p"`` for a P/D prefill request); vLLM names it ``cmpl-<id>``."""
        return f"h{self.tag}-{urllib.parse.quote(conversation_id, safe='')}-{turn}{part}"

    def prepare(self, conversation_id: str, turn: int, reused: int, new: int, output_tokens: int) -> None:
        """Build and serialise turn ``turn``'s prompt and streaming body now (from the current context),
        for :meth:`_execute` to send as they are if the job asks for the same lengths."""
        ids = self.contexts.build(conversation_id, turn, reused, new)
        body = encode_body(completion_body(self.model, ids, output_tokens, True))
        self._prepared[(conversation_id, turn)] = ((reused, new, output_tokens), ids, body)

    def prepare_first_turns(self, max_ids: int = PREPARE_FIRST_TURNS_MAX_IDS) -> int:
        """:meth:`prepare` every conversation's first turn (in record order, up to ``max_ids`` prompt ids in
        all); returns how many were prepared."""
        n = total = 0
        for cid, rec in self.contexts._records.items():
            if not rec.turns:
                continue
            t0 = rec.turns[0]
            if total + t0.prompt_tokens > max_ids:
                break
            self.prepare(cid, 0, 0, t0.prompt_tokens, t0.output_tokens)
            total += t0.prompt_tokens
            n += 1
        return n

    def _prepare_next(self, conversation_id: str, turn: int) -> None:
        rec = self.contexts._records.get(conversation_id)
        if rec is None or turn + 1 >= len(rec.turns):
            return
        nxt = rec.turns[turn + 1]
        try:
            self.prepare(conversation_id, turn + 1, nxt.reused_tokens, nxt.prompt_tokens - nxt.reused_tokens,
                         nxt.output_tokens)
        except ValueError:   # lengths the context cannot give: the turn is built (and fails) at send time
            pass

    def _prompt(self, job: TurnJob) -> tuple[list[int], Optional[bytes]]:
        """The job's prompt ids (now the conversation's context) and its prepared body, if one matches."""
        reused = job.reused[job.turn]
        want = (reused, job.prompt_tokens - reused, job.output_tokens)
        got = self._prepared.pop((job.conversation_id, job.turn), None)
        if got is not None and got[0] == want:
            self.contexts.commit(job.conversation_id, got[1])
            return got[1], got[2]
        return self.contexts.prompt(job.conversation_id, job.turn, want[0], want[1]), None

    async def metrics_text(self, i: int, path: str = "/metrics") -> tuple[Optional[str], str]:
        """Instance ``i``'s ``/metrics`` text (``path``: another path, e.g. ``scrape.OBSERVE_PATH``; 10 s
        timeout): ``(text, "")``, or ``(None, why)`` when it does not answer (an HTTP status other than 200,
        or a connection error)."""
        try:
            async with self.session.get(self.endpoints[i].url + path,
                                        timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status != 200:
                    return None, f"HTTP {r.status}"
                return await r.text(), ""
        except (aiohttp.ClientError, TimeoutError, ConnectionError, OSError) as e:
            return None, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__

    async def scrape_one(self, i: int) -> Optional[Scrape]:
        """Fetch and parse instance ``i``'s ``/metrics`` (None if it does not answer; ``scrape_error[i]``
        then says why)."""
        t0 = time.perf_counter()
        text, why = await self.metrics_text(i)
        if text is None:
            self.scrape_error[i] = why
            return None
        self.scrape_s.append(time.perf_counter() - t0)
        s = parse_metrics(text)
        self.scrapes[i] = s
        return s

    async def connect(self) -> None:
        """Scrape every instance once and build the static ``infos`` (capacity from /metrics); then ask each
        for the restricted text of the periodic scrape (``scrape.OBSERVE_PATH``) and use it where it comes
        back restricted (it holds ``vllm:kv_cache_usage_perc`` and not ``vllm:cache_config_info``), else the
        full ``/metrics`` (logged once per instance).

        Raises:
            RuntimeError: an instance does not answer or reports no KV capacity.
        """
        infos = []
        for i, e in enumerate(self.endpoints):
            s = await self.scrape_one(i)
            if s is None:
                raise RuntimeError(f"instance {e.name} at {e.url}: /metrics did not answer ({self.scrape_error[i]})")
            infos.append(InstanceInfo(i, e.name, e.role, e.hardware, kv_capacity_tokens(s)))
            text, why = await self.metrics_text(i, OBSERVE_PATH)
            try:
                r = parse_metrics(text) if text is not None else None
            except ValueError as err:
                r, why = None, str(err)
            if r is not None and "vllm:kv_cache_usage_perc" in r.values and "vllm:cache_config_info" not in r.values:
                self.observe_paths[i] = OBSERVE_PATH
            else:
                log.info("instance %s: the restricted /metrics text (%s) is not served (%s); the periodic scrape "
                         "reads the full /metrics", e.name, OBSERVE_PATH, why or "not restricted")
        self.infos = tuple(infos)

    # ---- what the cluster exposes -------------------------------------------------------------
    def observe(self) -> tuple[InstanceState, ...]:
        """The latest scraped state of each instance (zeros before the first scrape)."""
        out = []
        for info, s in zip(self.infos, self.scrapes):
            if s is None:
                out.append(InstanceState(0, 0, 0, math.nan))
                continue
            used = s.get("kv_cache_usage_perc", 0.0)
            out.append(InstanceState(int(round(used * info.kv_capacity_tokens)), int(s.get("num_requests_running", 0)),
                                     int(s.get("num_requests_waiting", 0)), math.nan,
                                     int(s.get("prefix_cache_hits_total", 0))))
        return tuple(out)

    def start_turn(self, job: TurnJob) -> None:
        """Start the turn's requests as an asyncio task."""
        job.start_s = self.clock.now()
        task = asyncio.ensure_future(self._run_turn(job))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ---- one turn -------------------------------------------------------------------------------
    async def _run_turn(self, job: TurnJob) -> None:
        try:
            error = await self._execute(job)
        except Exception as e:  # record, never hang the run
            error = f"{type(e).__name__}: {e}"
        # outside the try above: an exception in the controller or a policy is not this turn's failure,
        # it ends the run (on_error), and is never left unretrieved in the task
        try:
            if error:
                self._fail(job, error)
            else:
                if job.finish_s is None:
                    job.finish_s = self.clock.now()
                job.on_finish(job)
        except Exception as e:  # noqa: BLE001 -- handed over, never swallowed
            self.on_error(e)
            return
        if not error:
            self._record_completed(job)
        if self.finish_scrapes is not None and self.poller is not None and not error:
            self.poller.finish(job.placement.decode_instance)   # the GET and its parse run in the poller's thread
        self.on_progress()
        if not error:
            self._prepare_next(job.conversation_id, job.turn)   # in the agent's tool time, not at its send time

    def _record_completed(self, job: TurnJob) -> None:
        """Append the completed turn's request ids to ``completed`` (class docstring)."""
        p, d = job.placement.prefill_instance, job.placement.decode_instance
        base = dict(conversation_id=job.conversation_id, turn=job.turn, finish_s=job.finish_s)
        if job.placement.disaggregated:
            self.completed.append(dict(base, request_id=vllm_request_id(self.request_id(job.conversation_id, job.turn, "p")),
                                       instance=self.endpoints[p].name, part="prefill"))
        self.completed.append(dict(base, request_id=vllm_request_id(self.request_id(job.conversation_id, job.turn)),
                                   instance=self.endpoints[d].name, part="decode"))

    async def _execute(self, job: TurnJob) -> str:
        """Send the turn's request(s); returns '' or the reason the turn failed."""
        ids, body = self._prompt(job)
        p, d = job.placement.prefill_instance, job.placement.decode_instance
        kv_params = None
        if job.placement.disaggregated:
            body = None
            pre = await prefill_only(self.session, self.endpoints[p].url, self.model, ids, self.pd_kv_params,
                                     self.timeout_s, request_id=self.request_id(job.conversation_id, job.turn, "p"))
            if pre.error:
                return f"prefill on {self.endpoints[p].name}: {pre.error}"
            if self.pd_kv_params is not None and pre.kv_transfer_params is None:
                return f"prefill on {self.endpoints[p].name} returned no kv_transfer_params (is a KV connector set?)"
            job.prefill_done_s = self.clock.now()
            job.cached_tokens = max(pre.cached_tokens, 0)
            job.prefill_computed_tokens += job.prompt_tokens - job.cached_tokens
            job.on_prefill_done(job)
            kv_params = pre.kv_transfer_params

        def first_token(stamp_s: float):
            job.first_token_s = self.clock.at(stamp_s)   # the chunk's perf_counter stamp on the run clock
            if not job.placement.disaggregated:
                job.prefill_done_s = job.first_token_s
                job.on_prefill_done(job)

        if body is None:
            body = encode_body(completion_body(self.model, ids, job.output_tokens, True, kv_params))
        res: CompletionResult = await stream_completion(self.session, self.endpoints[d].url, body, first_token,
                                                        self.timeout_s,
                                                        request_id=self.request_id(job.conversation_id, job.turn))
        job.itl_s = res.itl_s
        if res.chunk_s:
            at = self.clock.at
            job.token_s = [at(t) for t, n in zip(res.chunk_s, res.chunk_tokens) for _ in range(n)]
        if res.error:
            return f"decode on {self.endpoints[d].name}: {res.error}"
        if res.num_tokens != job.output_tokens or len(res.token_ids) != job.output_tokens:
            self.mismatches += 1
            return (f"token count mismatch: asked {job.output_tokens}, server reported {res.num_tokens}, "
                    f"{len(res.token_ids)} token ids came back")
        if job.placement.disaggregated:
            # the decoder's reported cached tokens include KV loaded by the connector; how much of it
            # came over the connector per request is not observable, so transfer_tokens stays unknown
            job.decode_cached_tokens = max(res.cached_tokens, 0)
            job.transfer_tokens = -1
        else:
            job.cached_tokens = max(res.cached_tokens, 0)
            job.prefill_computed_tokens += job.prompt_tokens - job.cached_tokens
        self.contexts.extend(job.conversation_id, res.token_ids)
        if res.chunk_s:
            job.finish_s = self.clock.at(res.chunk_s[-1])   # the last token chunk's arrival (vllm bench serve's E2E)
        return ""

    def _fail(self, job: TurnJob, reason: str) -> None:
        job.error = reason
        job.on_fail(job, reason)
