"""The simulated cluster backend: engines, KV-transfer links, and the event loop (a ``Cluster``)."""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

from harness.core.backend import ClusterBase, InstanceInfo, InstanceState, TurnJob
from harness.core.clock import Priority, SimClock
from harness.workload.prefix import BlockContent, block_ranges
from harness.core.profiles import (EngineConfig, HardwareConfig, LinkConfig, ModelConfig, example_connector_loaded_tokens,
                                   kv_capacity_blocks, kv_transfer_s, link_fixed_s)
from harness.sim.engine import FAILED, Engine, Request
from harness.sim.perf import make_step_model
from harness.sim.steps import StepLog


def _load(e: Engine) -> tuple[int, int, int]:
    """``(kv_used_tokens, num_running, num_waiting)`` of engine ``e`` now: KV blocks in use x block size (tokens),
    its running requests, its waiting ones and those whose KV is still loading."""
    return e.used_blocks_now() * e.bs, len(e.running), len(e.waiting) + e.loading


def _energy(busy_s: float, busy_j: float, idle_w: float, until_s: float) -> float:
    """An engine's energy from t=0 to ``until_s`` (s), J: ``busy_j`` (J) of its steps ended, busy ``busy_s`` s,
    and idle power ``idle_w`` (W) the rest of the time (``HardwareConfig.idle_w``)."""
    return busy_j + idle_w * max(0.0, until_s - busy_s)


class SimBackend(ClusterBase):
    """A cluster of simulated vLLM engines sharing one :class:`SimClock` (implements
    ``harness.core.backend.Cluster``).

    Args:
        instances: ``(name, role, HardwareConfig)`` per instance, in index order.
        model, engine, link: the served model, engine knobs and KV-transfer link.
        max_coalesce_s: longest run of identical decode-only steps simulated as one event, s (also the
            maximum staleness of the state a policy observes; results do not depend on it).
        max_sim_time_s, max_events: limits of ``drive`` (s of virtual time, events).
        content: which KV blocks the workload's turns share (``harness.workload.prefix.BlockContent`` over the
            workload's conversations, with its shared system prompt if any). ``None``: each
            conversation's own prefix only, learnt from the turns as they start (exact for the trace's
            ``reused_tokens``; no sharing across conversations).
        record_steps: keep one record per engine step (``steps_frame``, ``steps.parquet``;
            ``harness.sim.steps``); off: nothing is recorded.
    ``link.model=link``: KV transfers into one instance are serialised (one at a time, FIFO); transfer time is
    :func:`harness.core.profiles.kv_transfer_s`. ``link.model=example_connector``: the connector's save and load
    run inside the engines' steps (``harness.sim.engine``, "KV connector"), the prefiller frees its blocks at
    once, and the decoder request arrives ``link.frontend_s`` after the prefiller's finish.

    ``fold_ticks`` (class attribute, default True): the observer's ticks before the clock's next event are
    sampled in one call (:meth:`drive`, :meth:`observe_at`); False: one event per tick (the same samples; the
    tests compare the two).
    """

    fold_ticks = True

    def __init__(self, instances: Sequence[tuple[str, str, HardwareConfig]], model: ModelConfig,
                 engine: EngineConfig, link: LinkConfig, clock: SimClock | None = None,
                 max_coalesce_s: float = 0.25, max_sim_time_s: float = math.inf, max_events: float = math.inf,
                 content: BlockContent | None = None, record_steps: bool = False):
        self.clock = clock or SimClock()
        self.content = content
        self._learnt = BlockContent() if content is None else None
        self._bs = engine.block_size
        self.model, self.link = model, link
        self.engines: list[Engine] = []
        infos = []
        for i, (name, role, hw) in enumerate(instances):
            cap = kv_capacity_blocks(hw, model, engine)
            perf = make_step_model(hw, model, engine.step_model)   # engine.step_model (harness.sim.perf)
            self.engines.append(Engine(i, name, self.clock, perf, engine, cap, self._engine_fail, max_coalesce_s))
            infos.append(InstanceInfo(i, name, role, hw.name, cap * engine.block_size))
        self.infos = tuple(infos)
        self.step_log = StepLog() if record_steps else None
        for e in self.engines:
            e.step_log = self.step_log
            e.horizon_s = max_sim_time_s    # a timeout-paced run ends no step past it (drive stops there)
            if link.model == "example_connector":
                e.connector = link
        # the API front end per instance (HardwareConfig.api_frontend_s, s): a turn reaches the first engine it is
        # placed on this long after it arrives at the server
        self._frontend_s = [float(getattr(hw, "api_frontend_s", 0.0) or 0.0) for _, _, hw in instances]
        self._link_free_at = [0.0] * len(self.engines)
        self._kvb = model.kv_bytes_per_token
        self.max_sim_time_s, self.max_events = max_sim_time_s, max_events

    # ---- Backend protocol ---------------------------------------------------------------------
    def start_turn(self, job: TurnJob) -> None:
        """Submit ``job``: one local request, or a prefill-only request then a remote-KV decode."""
        job.start_s = self.clock.now()
        p = job.placement
        ranges = self._ranges(job)
        if not p.disaggregated:
            req = Request(job.conversation_id, job.turn, job.prompt_tokens, job.output_tokens, job.reused,
                          on_first_token=lambda r: self._local_first_token(job, r),
                          on_finish=lambda r: self._finish(job, r), owner=job, ranges=ranges)
            self._submit_after_frontend(p.decode_instance, req)
            return
        preq = Request(job.conversation_id, job.turn, job.prompt_tokens, 1, job.reused, prefill_only=True,
                       on_finish=lambda r: self._prefill_finished(job, r), owner=job, ranges=ranges)
        self._submit_after_frontend(p.prefill_instance, preq)

    def _submit_after_frontend(self, i: int, req: Request) -> None:
        """Submit ``req`` to engine ``i`` after its API front end (``api_frontend_s``, s; at once when 0: the
        event order is then what it was without the term)."""
        fe = self._frontend_s[i]
        if fe > 0:
            self.clock.call_at(self.clock.now() + fe, self.engines[i].submit, req)
        else:
            self.engines[i].submit(req)

    @staticmethod
    def _engine_events(job: TurnJob, req: Request) -> None:
        """The turn's vLLM request events on the first engine it reached (``TurnJob.engine_queued_s`` /
        ``engine_scheduled_s``) from that engine's request."""
        job.engine_queued_s, job.engine_scheduled_s = req.queued_s, req.scheduled_s

    def set_batch_rule(self, instance_index: int, rule) -> None:
        """Install a batch rule (``harness.core.batching.BatchRule``) on one engine; ``None`` restores the
        engine's default (``engine.step_mode``)."""
        self.engines[instance_index].set_rule(rule)

    def _ranges(self, job: TurnJob) -> tuple:
        """The turn's full KV blocks by content (``harness.workload.prefix.block_ranges``)."""
        if self.content is not None:
            return block_ranges(self.content.segments(job.conversation_id, job.turn), self._bs)
        segs = self._learnt.learn(job.conversation_id, job.turn, job.reused[job.turn],
                                  job.prompt_tokens, job.output_tokens)
        return block_ranges(segs, self._bs)

    def observe(self) -> tuple[InstanceState, ...]:
        """KV used (tokens), running, waiting and cumulative energy (J) of each engine, now (each engine read in
        one pass: the session's sample every ``tick_s``)."""
        now, energy = self.clock.now(), self._energy_j
        return tuple([InstanceState(*_load(e), energy(e, now)) for e in self.engines])

    def observe_at(self, times: Sequence[float]) -> list[tuple[list[int], int, int, list[float]]]:
        """What :meth:`observe` would give at each of ``times`` (s, ascending, none before now and each before
        the clock's next event: nothing can change an engine by then but its own run, read at that instant),
        without moving the clock, as columns: per engine ``(kv_used_tokens, num_running, num_waiting,
        energy_j)``, ``kv_used_tokens`` (tokens) and ``energy_j`` (J) lists of one value per time, the two counts
        (requests) the same at all of them (nothing but the engine's own run changes before the next event)
        -- the values and float operations of an ``InstanceState`` of :meth:`observe` there. ``drive`` calls it
        for the samples of the grid points before the next event (``fold_ticks``; ``Recorder.sample_at``)."""
        cols = []
        for e in self.engines:      # (Engine.sample_cols: observe_cols' values in tokens and _energy's J, one pass)
            toks, energy = e.sample_cols(times, e.perf.hw.idle_w)
            cols.append((toks, len(e.running), len(e.waiting) + e.loading, energy))
        return cols

    def observe_load(self) -> tuple[tuple[int, int, int], ...]:
        """``(kv_used_tokens, num_running, num_waiting)`` of each engine now: ``observe`` without the
        energy (what the controller's view reads, once per decision)."""
        return tuple([_load(e) for e in self.engines])

    def power_w(self) -> list[float]:
        """Not sampled on the simulator (NaN per instance): its energy model is integrated per step
        (``energy_j``), not read as a power signal."""
        return [math.nan] * len(self.engines)

    def drive(self, start: Callable[[], None], done: Callable[[], bool], on_tick: Callable[..., None],
              tick_s: Optional[float]) -> str:
        """Call ``start()``, then process events until none are left, ticking every ``tick_s`` s of virtual
        time while work remains (ticks run after engine and controller events at the same instant). An
        idle stretch (no event at all for longer than ``tick_s``) gets no ticks: the state cannot change
        there, so the next tick is the first grid point at or after the next event, and the number of
        samples is bounded by the events, whatever the arrival rate or tool times.

        Ticks folded (``fold_ticks``, on by default): a tick at ``t`` also takes the grid points after it that
        come before the clock's next event (strictly, and not past ``max_sim_time_s``): nothing can change an
        engine by then but its own run (a timeout-paced run's steps, a coalesced run's), so the state at each
        is :meth:`observe_at` of it, and one call ``on_tick(times)`` (``times``: ``t`` and those grid points,
        s, ascending) samples them all; otherwise ``on_tick()`` samples now. The same grid points as one event
        per tick (the next one found the same way from each, with the same float additions), and the clock
        counts each folded tick as an event (``SimClock.fold``). Off: one event and ``on_tick()`` per tick.

        Returns ``""`` when ``done()``, else why it stopped: a stall, or a limit (``max_sim_time_s`` of
        virtual time, ``max_events`` events) naming the key. Exceptions propagate."""
        clock = self.clock
        engines = self.engines
        fold, until = self.fold_ticks, self.max_sim_time_s
        start()

        def tick():
            now = clock.now()
            if done() or not clock.pending():  # nothing else queued: a stall, not a wait
                on_tick()
                return
            nxt_q = clock.next_time()   # nothing runs before the grid points folded in: the clock's next stays
            times = None
            while True:
                t = now + tick_s
                nxt = nxt_q
                if nxt > t:
                    for e in engines:   # a timeout-paced run's steps count as the events one event per step has
                        x = e.paced_event_after(now)
                        if x < nxt:
                            nxt = x
                            if nxt <= t:    # an event by the next grid point: no skip, whatever the others
                                break
                if nxt > t:  # idle until nxt: skip the grid points in between
                    t = now + tick_s * math.ceil((nxt - now) / tick_s)
                if not (fold and t < nxt_q and t <= until):
                    break
                if times is None:
                    times = [now]
                times.append(t)
                now = t
            if times is None:
                on_tick()
            else:
                on_tick(times)
                clock.fold(len(times) - 1)
            clock.call_at(t, tick, priority=Priority.TICK)

        if tick_s:
            clock.call_at(clock.now(), tick, priority=Priority.TICK)
        clock.run(self.max_sim_time_s, self.max_events)
        if done():
            return ""
        if clock.pending() and clock.next_time() > self.max_sim_time_s:
            return (f"simulated time reached backend.max_sim_time_s={self.max_sim_time_s:g} s (a tool time or "
                    f"arrival far in the future? a rate far too low?)")
        if clock.events >= self.max_events:
            return f"the simulation processed backend.max_events={self.max_events:g} events"
        return "simulation stalled"

    def preemptions(self) -> int:
        """Preemptions (by recompute) over all engines."""
        return sum(e.preemptions for e in self.engines)

    def steps_frame(self):
        """``steps.parquet``: one row per engine step (``harness.sim.steps.STEP_COLUMNS``), or ``None`` when
        the cluster was opened without ``record_steps``."""
        return None if self.step_log is None else self.step_log.frame([i.name for i in self.infos])

    def measured(self) -> dict:
        """Nothing backend-specific beyond the common summary."""
        return {}

    # ---- energy ---------------------------------------------------------------------------------
    def energy_j(self, end_s: float) -> list[float]:
        """Energy per instance from t=0 to ``end_s``, J: finished steps + idle power otherwise."""
        return [self.instance_energy_j(i, end_s) for i in range(len(self.engines))]

    def instance_energy_j(self, i: int, until_s: float) -> float:
        """Energy of instance ``i`` from t=0 to ``until_s``, J: finished steps + idle power otherwise.

        A step in flight is counted when it ends, so mid-run values lag by at most one step run (by one
        step inside a run with a rule-declared horizon: ``Engine.busy_energy_now``).
        """
        return self._energy_j(self.engines[i], until_s)

    @staticmethod
    def _energy_j(e: Engine, until_s: float) -> float:
        """:meth:`instance_energy_j` of engine ``e``, J."""
        return _energy(*e.busy_energy_now(), e.perf.hw.idle_w, until_s)

    # ---- callbacks ------------------------------------------------------------------------------
    def _local_first_token(self, job: TurnJob, req: Request) -> None:
        self._engine_events(job, req)
        job.cached_tokens = max(req.hit_tokens, 0)
        job.prefill_done_s = job.first_token_s = self.clock.now()
        job.on_prefill_done(job)

    def _finish(self, job: TurnJob, req: Request) -> None:
        job.finish_s = self.clock.now()
        job.itl_s = req.itl_gaps()
        job.preemptions += req.preemptions
        job.prefill_computed_tokens += req.prefill_computed
        if job.first_token_s is None:  # decode request of a P/D pair
            job.first_token_s = req.first_token_s
        job.on_finish(job)

    def _prefill_finished(self, job: TurnJob, preq: Request) -> None:
        self._engine_events(job, preq)
        job.cached_tokens = max(preq.hit_tokens, 0)
        job.prefill_done_s = self.clock.now()
        job.preemptions += preq.preemptions
        job.prefill_computed_tokens += preq.prefill_computed
        job.on_prefill_done(job)
        if self.link.model == "example_connector":
            self._connector_handoff(job, preq)
            return
        dreq = Request(job.conversation_id, job.turn, job.prompt_tokens, job.output_tokens, job.reused,
                       remote_kv=True,
                       on_first_token=lambda r: self._remote_first_token(job, r),
                       on_finish=lambda r: self._finish(job, r),
                       on_loading=lambda r, tokens: self._transfer(job, preq, r, tokens), owner=job,
                       ranges=preq.kv.ranges)
        if self.link.frontend_s:     # the front ends between the prefiller's finish and the decoder's arrival
            self.clock.call_at(self.clock.now() + self.link.frontend_s, self._submit_remote, job, preq, dreq,
                               priority=Priority.ENGINE)
        else:
            self._submit_remote(job, preq, dreq)

    def _submit_remote(self, job: TurnJob, preq: Request, dreq: Request) -> None:
        """Submit a ``link`` P/D turn's decode request; free the prefiller's blocks if the decoder can never
        hold it."""
        self.engines[job.placement.decode_instance].submit(dreq)
        if dreq.state == FAILED:  # the decoder can never hold it: free the prefiller's blocks
            self.engines[job.placement.prefill_instance].release_held(preq)

    def _connector_handoff(self, job: TurnJob, preq: Request) -> None:
        """``link.model=example_connector``: the prefiller frees its blocks now (the KV was saved inside its step);
        ``link.frontend_s`` later the decoder gets the turn as a local request that can load
        :func:`~harness.core.profiles.example_connector_loaded_tokens` of its prompt (``Request.external``)."""
        self.engines[job.placement.prefill_instance].release_held(preq)
        dreq = Request(job.conversation_id, job.turn, job.prompt_tokens, job.output_tokens, job.reused,
                       on_first_token=lambda r: self._remote_first_token(job, r),
                       on_finish=lambda r: self._finish(job, r),
                       on_loading=lambda r, tokens: self._loaded(job, r, tokens), owner=job, ranges=preq.kv.ranges)
        dreq.external = example_connector_loaded_tokens(job.prompt_tokens, self._bs)
        job.decode_cached_tokens = 0
        self.clock.call_at(self.clock.now() + self.link.frontend_s,
                           self.engines[job.placement.decode_instance].submit, dreq, priority=Priority.ENGINE)

    def _loaded(self, job: TurnJob, dreq: Request, tokens: int) -> None:
        """The decoder's step admitting ``dreq`` loads ``tokens`` tokens through the connector (its time is in
        that step): recorded as the turn's transfer."""
        eng = self.engines[job.placement.decode_instance]
        job.transfer_tokens += tokens
        job.decode_cached_tokens = max(dreq.hit_tokens, 0)
        job.transfer_s += eng.connector_s(tokens)

    def _remote_first_token(self, job: TurnJob, req: Request) -> None:
        job.first_token_s = self.clock.now()

    def _transfer(self, job: TurnJob, preq: Request, dreq: Request, tokens: int) -> None:
        now = self.clock.now()
        d = job.placement.decode_instance
        start = max(now, self._link_free_at[d])
        done = start + kv_transfer_s(tokens, self._kvb, self.link.bandwidth_bytes_per_s, self.link.latency_s) \
            + link_fixed_s(self.link, self.model.num_layers, -(-tokens // self._bs))
        self._link_free_at[d] = done
        job.transfer_tokens += tokens
        job.decode_cached_tokens = job.prompt_tokens - tokens
        job.transfer_s += done - now
        self.clock.call_at(done, self._transfer_done, job, preq, dreq, priority=Priority.ENGINE)

    def _transfer_done(self, job: TurnJob, preq: Request, dreq: Request) -> None:
        self.engines[job.placement.prefill_instance].release_held(preq)
        self.engines[job.placement.decode_instance].remote_loaded(dreq)

    def _engine_fail(self, req: Request, reason: str) -> None:
        job: TurnJob = req.owner
        job.error = reason
        job.on_fail(job, reason)
