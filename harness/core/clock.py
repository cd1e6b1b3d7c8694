"""Clocks the controller runs against: the simulator's event heap (virtual time) or the asyncio loop.

``SimClock`` is a SimPy-sized event kernel: a heap of ``(time, priority, seq, fn, args)``; ties are
broken by priority, then by insertion order, never by time alone, so runs are deterministic. The real
backend provides the same two methods (``now``, ``call_at``) on the asyncio loop.
"""

from __future__ import annotations

import heapq
import math
import time
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # asyncio (~10 ms to import) only names AsyncioClock's loop type; a simulated run never loads it
    import asyncio


class Priority(IntEnum):
    """Order of events due at the same virtual time (lower first), as SimPy's ``URGENT`` / ``NORMAL``.

    ``ENGINE`` (0): an engine's step begin and end, its timers, and a KV transfer's completion
    (``harness.sim.engine``, ``harness.sim.backend``). They run first so that a turn finishing (or a
    transfer landing) at t is recorded, and its KV blocks freed, before anything else decides at t.
    ``CONTROL`` (1, the default): the controller's arrivals, ready turns and rechecks
    (``harness.core.controller``), so a turn that becomes ready at t sees the cluster as the engines
    left it at t.
    ``TICK`` (2): the periodic observer tick (``harness.sim.backend.SimCluster.drive``), last, so the
    state it samples at t is the state after every engine and controller event at t.
    Ties within a priority go to the earlier-scheduled event (insertion order).
    """

    ENGINE = 0
    CONTROL = 1
    TICK = 2


class SimClock:
    """Virtual time in seconds, advanced by ``run``.

    Priorities (lower first at equal times, :class:`Priority`): engine step ends and transfers
    (``ENGINE``) before controller timers (``CONTROL``) before the observer tick (``TICK``), so a turn
    finishing at t is recorded before a new turn that becomes ready at t.
    """

    __slots__ = ("_q", "_seq", "_now", "_prio", "events", "_folded")

    def __init__(self) -> None:
        self._q: list[tuple[float, int, int, Callable[..., Any], tuple]] = []
        self._seq = 0
        self._now = 0.0
        self._prio = int(Priority.CONTROL)    # the priority of the event being processed (CONTROL outside run)
        self.events = 0     # events processed (each folded one counted: :meth:`fold`), at the end of each ``run``
        self._folded = 0

    def now(self) -> float:
        """Current virtual time, s."""
        return self._now

    def call_at(self, t: float, fn: Callable[..., Any], *args: Any, priority: int = Priority.CONTROL) -> None:
        """Run ``fn(*args)`` at virtual time ``t`` (s), ordered among events due at ``t`` by ``priority``
        (:class:`Priority`), then by insertion.

        Raises:
            ValueError: if ``t`` is earlier than now or not finite ("negative delay").
        """
        if not self._now <= t < math.inf:     # (NaN fails it too)
            raise ValueError(f"call_at: time {t!r} is before now ({self._now}) or not finite")
        self._seq += 1
        heapq.heappush(self._q, (t, priority, self._seq, fn, args))

    def priority_now(self) -> int:
        """The priority (:class:`Priority`) of the event being processed (``CONTROL`` outside :meth:`run`, e.g.
        for calls made before it starts). An engine whose timeout-paced run simulates its own step begins
        (``harness.sim.engine``, "Timeout-paced runs") reads it to place a call at the instant of one of those
        begins where one event per step places it: an ``ENGINE`` event due then, queued before, runs before that
        step begins; a later priority after."""
        return self._prio

    def pending(self) -> int:
        """Number of scheduled events not yet processed."""
        return len(self._q)

    def nothing_due_now(self, priority: int) -> bool:
        """True when no scheduled event is due now at ``priority`` or a lower (earlier) one: an event
        scheduled now at ``priority`` would be the next one processed, so its callback may run inline at the
        end of the current one, with the same order and results (one heap operation fewer)."""
        q = self._q
        return not q or q[0][0] > self._now or q[0][1] > priority

    def replay_at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` now as the event it would have been at the earlier time ``t`` (s): ``now()`` reads
        ``t`` inside it, and is restored after. Only for an event that nothing processed since ``t`` could have
        observed (an engine ending, late, the steps of a timeout-paced run: ``harness.sim.engine``); what it
        schedules must be due at or after the true now.

        Raises:
            ValueError: ``t`` is later than now.
        """
        now = self._now
        if not t <= now:
            raise ValueError(f"replay_at: time {t!r} is after now ({now})")
        self._now = t
        try:
            fn(*args)
        finally:
            self._now = now

    def fold(self, k: int) -> None:
        """Count ``k`` events that one event ran inline (the observer's ticks before the next event:
        ``harness.sim.backend.SimBackend.drive``), as if each had been its own: they are added to ``events``
        when ``run`` returns (so the count is that of one event each; ``max_events`` is checked against the
        events processed, so a run that reaches it stops later than with one event each)."""
        self._folded += k

    def next_time(self) -> float:
        """Time of the earliest scheduled event, s (``inf`` if none)."""
        return self._q[0][0] if self._q else math.inf

    def run(self, until: float = math.inf, max_events: float = math.inf) -> None:
        """Process events in order until the heap is empty, the next event is after ``until`` (s), or
        ``max_events`` events (over the clock's life) have been processed."""
        q = self._q
        pop = heapq.heappop
        n = self.events
        while q and q[0][0] <= until and n < max_events:
            t, p, _, fn, args = pop(q)
            self._now = t
            self._prio = p
            fn(*args)
            n += 1
        self.events = n + self._folded
        self._folded = 0
        self._prio = int(Priority.CONTROL)


class AsyncioClock:
    """Wall time in seconds since ``start()``, on a running asyncio loop (the real backend's clock).

    Same interface as :class:`SimClock`; ``priority`` is accepted and ignored (the loop runs callbacks
    due at the same time in scheduling order). An exception raised by a callback is handed to
    ``on_error`` (the run then ends with it) instead of the loop's default handler, which would only log
    it.

    One monotonic clock for every stamp of a real run: ``time.perf_counter`` (the client stamps stream
    chunks with it where they arrive; :meth:`at` converts such a stamp to run time). ``now`` and ``at``
    only read that clock, so they are safe to call from another thread (the ``/metrics`` poller's).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, on_error: Callable[[BaseException], None]):
        self.loop = loop
        self._t0 = time.perf_counter()
        self.events = 0
        self.on_error = on_error

    def start(self) -> None:
        """Set t = 0 to now."""
        self._t0 = time.perf_counter()

    def now(self) -> float:
        """Seconds since ``start()``."""
        return time.perf_counter() - self._t0

    def at(self, perf_s: float) -> float:
        """A ``time.perf_counter()`` stamp (s) as run time (s since ``start()``)."""
        return perf_s - self._t0

    def call_at(self, t: float, fn: Callable[..., Any], *args: Any, priority: int = Priority.CONTROL) -> None:
        """Run ``fn(*args)`` at ``t`` s after start (immediately if ``t`` is past).

        The delay is taken on ``perf_counter`` now and handed to the loop's own timer (``call_later``).

        Raises:
            ValueError: if ``t`` is not finite.
        """
        if not math.isfinite(t):
            raise ValueError(f"call_at: time {t!r} is not finite")
        self.events += 1
        self.loop.call_later(max(0.0, self._t0 + t - time.perf_counter()), self._guarded, fn, args)

    def _guarded(self, fn: Callable[..., Any], args: tuple) -> None:
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 -- handed over, never swallowed
            self.on_error(e)
