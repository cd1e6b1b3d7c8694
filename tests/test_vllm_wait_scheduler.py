"""The vLLM batch-rule scheduler (``harness.vllm.wait_scheduler``) without vLLM: its views of vLLM-like
requests, the selection it makes vLLM's own step run, the hiding and restoring of queues, the eviction
preference, and what ``backend=vllm`` refuses for a batch-rule scheduler. Expected values are worked by
hand in the comments (WAIT: Ao et al., arXiv 2504.11320, Algorithm 1; docs/wait.md).

The parent scheduler is a stand-in (:class:`FakeVllmScheduler`) with the parts of vLLM 0.32's V1
``Scheduler.schedule`` the wrapper relies on: every request of ``self.running`` in order while the
budget lasts (preempting ``running[-1]`` when blocks run out), then, only if nothing was preempted, the
``self.waiting`` queue in order until a request does not fit.
"""

from __future__ import annotations

import json
import time
from collections import deque
from types import SimpleNamespace

import pytest

from harness.core.registry import rule_from_spec
from baselines.wait.fluid_admission import NestedWaitRule, WaitRule
from harness.run.config import PROJECT_ROOT, ConfigError
from harness.vllm import wait_scheduler as ws
from tests.conftest import compose_run


class FakeRequest:
    """The attributes of ``vllm.v1.request.Request`` the wrapper reads (tokens)."""

    def __init__(self, rid: str, prompt: int, max_tokens: int, outputs: int = 0, computed: int = 0):
        self.request_id, self.num_prompt_tokens, self.max_tokens = rid, prompt, max_tokens
        self.num_output_tokens, self.num_computed_tokens = outputs, computed
        self.status = "WAITING"

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    def __repr__(self):
        return self.request_id


def decoding(rid: str, prompt: int, stage: int, max_tokens: int = 8) -> FakeRequest:
    """A running request that produced ``stage`` tokens: its KV holds prompt + stage - 1 tokens."""
    r = FakeRequest(rid, prompt, max_tokens, outputs=stage, computed=prompt + stage - 1)
    r.status = "RUNNING"
    return r


class FakeQueue(deque):
    """vLLM's ``FCFSRequestQueue`` API."""

    add_request = deque.append
    pop_request = deque.popleft
    prepend_request = deque.appendleft
    prepend_requests = deque.extendleft

    def peek_request(self):
        return self[0]

    def remove_requests(self, reqs):
        drop = {id(r) for r in reqs}
        keep = [r for r in self if id(r) not in drop]
        self.clear()
        self.extend(keep)


class FakeVllmScheduler:
    """The parts of vLLM V1's ``Scheduler`` the wrapper relies on (module docstring); blocks of
    ``block_size`` tokens, ``capacity`` of them."""

    def __init__(self, capacity: int, block_size: int = 16, budget: int = 10_000, max_seqs: int = 64):
        self.running: list = []
        self.waiting = FakeQueue()
        self.requests: dict = {}
        self.policy = "fcfs"
        self.block_size, self.max_num_scheduled_tokens, self.max_num_running_reqs = block_size, budget, max_seqs
        self.scheduler_config = SimpleNamespace(long_prefill_token_threshold=0)
        self.capacity = capacity
        self.held: dict = {}
        self.reset_preempted: set = set()
        self.calls = 0

    # what the wrapper's hooks read
    def _rule_new_queue(self):
        return FakeQueue()

    def _rule_blocks_of(self, req):
        return self.held.get(req.request_id, 0)

    def _rule_free_blocks(self):
        return self.capacity - sum(self.held.values())

    def _rule_capacity_blocks(self):
        return self.capacity

    def add_request(self, req):
        self.requests[req.request_id] = req
        self.waiting.add_request(req)

    def _preempt_request(self, req, ts):
        self.held.pop(req.request_id, None)
        req.num_computed_tokens, req.status = 0, "PREEMPTED"
        self.waiting.prepend_request(req)
        self.reset_preempted.add(req.request_id)

    def _alloc(self, req, n) -> bool:
        need = max(0, -(-(req.num_computed_tokens + n) // self.block_size) - self.held.get(req.request_id, 0))
        if need > self._rule_free_blocks():
            return False
        self.held[req.request_id] = self.held.get(req.request_id, 0) + need
        return True

    def schedule(self):
        self.calls += 1
        sched, budget, preempted = {}, self.max_num_scheduled_tokens, []
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            n = min(r.num_tokens - r.num_computed_tokens, budget)
            while not self._alloc(r, n):
                victim = self.running.pop()
                self._preempt_request(victim, 0.0)
                preempted.append(victim)
                if victim is r:
                    break
            if r.status != "RUNNING":
                break
            sched[r.request_id] = n
            budget -= n
            i += 1
        if not preempted:
            while budget > 0 and self.waiting and len(self.running) < self.max_num_running_reqs:
                r = self.waiting.peek_request()
                n = min(r.num_tokens - r.num_computed_tokens, budget)
                if not self._alloc(r, n):
                    break
                self.waiting.pop_request()
                r.status = "RUNNING"
                self.running.append(r)
                sched[r.request_id] = n
                budget -= n
        for rid, n in sched.items():
            self.requests[rid].num_computed_tokens += n
        out = SimpleNamespace(num_scheduled_tokens=sched, total_num_scheduled_tokens=sum(sched.values()),
                              preempted_req_ids=set(self.reset_preempted))
        self.reset_preempted = set()
        return out

    def update_from_output(self, so, model_output):
        for rid in so.num_scheduled_tokens:
            r = self.requests[rid]
            if r.num_computed_tokens >= r.num_tokens:
                r.num_output_tokens += 1
            if r.num_output_tokens >= r.max_tokens:       # finished: leaves running, frees its blocks
                self.running.remove(r)
                self.held.pop(rid, None)
                del self.requests[rid]
        return {}


class RuleFake(ws.RuleSchedulingMixin, FakeVllmScheduler):
    # the stand-in's block accounting replaces the hooks that read vLLM's KV-cache manager
    _rule_new_queue = FakeVllmScheduler._rule_new_queue
    _rule_blocks_of = FakeVllmScheduler._rule_blocks_of
    _rule_free_blocks = FakeVllmScheduler._rule_free_blocks
    _rule_capacity_blocks = FakeVllmScheduler._rule_capacity_blocks

    def __init__(self, *a, **kw):
        FakeVllmScheduler.__init__(self, *a, **kw)
        self._rule_init()


def wait_spec(n: int, edges=(8, 64), max_wait_s: float = 10.0) -> dict:
    return {"rule": "wait", "thresholds": [n] * (len(edges) + 1), "output_bins": list(edges),
            "max_wait_s": max_wait_s, "idle_policy": "wait"}


@pytest.fixture
def rule_env(tmp_path, monkeypatch):
    path = tmp_path / "rule.json"
    monkeypatch.setenv(ws.RULE_FILE_ENV, str(path))
    monkeypatch.setenv(ws.STEP_LOG_ENV, str(tmp_path / "steps.jsonl"))
    return path


def issue_example(s):
    """The issue's example on scheduler ``s``: residents at stages 1/2/3 = 3/0/2 (admitted in that order,
    prompts of 32 tokens, outputs of 8 tokens: one type), then 5 prompts waiting at stage 0, all seen
    just now (the wrapper's clock is ``time.monotonic()``)."""
    now = time.monotonic()
    res = [decoding(f"s1_{k}", 32, 1) for k in range(3)] + [decoding(f"s3_{k}", 32, 3) for k in range(2)]
    for r in res:
        s.requests[r.request_id] = r
        s.running.append(r)
        s.held[r.request_id] = -(-r.num_computed_tokens // 16)
        s._tracker.submitted(r.request_id, now)
        s._tracker.admitted(r.request_id, now)
    waiting = [FakeRequest(f"w{k}", 32, 8) for k in range(5)]
    for r in waiting:
        s._tracker.submitted(r.request_id, now)
        s.add_request(r)
    return res, waiting


def test_views_of_vllm_requests():
    """Stage 0 while prefilling (fresh: computed < prompt; after a preemption: more than the last sampled
    token left), else the output tokens so far; the known output length is max_tokens."""
    t = ws.Tracker()
    blocks = lambda r: 3  # noqa: E731
    fresh = ws.request_view(FakeRequest("a", 100, 7, computed=64), t, blocks, 0.0)
    assert (fresh.stage, fresh.prefill_target, fresh.computed, fresh.known_output_tokens) == (0, 100, 64, 7)
    dec = ws.request_view(decoding("b", 100, 5), t, blocks, 0.0)     # computed 104 of 105 tokens
    assert (dec.stage, dec.prefill_target, dec.out_done) == (5, 104, 5)
    again = ws.request_view(FakeRequest("c", 100, 7, outputs=5, computed=0), t, blocks, 0.0)  # preempted
    assert (again.stage, again.prefill_target) == (0, 105)
    assert ws.blocks_needed(dec.req, 1, held=7, block_size=16) == 0  # 105 tokens fit 7 blocks of 16
    assert ws.blocks_needed(dec.req, 9, held=7, block_size=16) == 1  # 113 tokens need 8


def test_issue_example_selects_2_2_0_2(rule_env):
    """n = 2 per stage: stage 1 has 3 residents -> the 2 admitted first; stage 2 none; stage 3 both; stage
    0: the 2 oldest of the 5 waiting, FCFS. So 2 + 2 + 0 + 2 = 6 requests; s1_2 is paused."""
    rule_env.write_text(json.dumps(wait_spec(2)))
    s = RuleFake(capacity=1000)
    res, waiting = issue_example(s)
    out = s.schedule()
    assert set(out.num_scheduled_tokens) == {"s1_0", "s1_1", "s3_0", "s3_1", "w0", "w1"}
    assert out.num_scheduled_tokens["w0"] == 32 and out.num_scheduled_tokens["s1_0"] == 1
    # the paused resident keeps its KV and its place; admissions join at the end, in order
    assert s.held["s1_2"] == 2 and s.requests["s1_2"].num_computed_tokens == 32
    assert [r.request_id for r in s.running] == ["s1_0", "s1_1", "s1_2", "s3_0", "s3_1", "w0", "w1"]
    assert [r.request_id for r in s.waiting] == ["w2", "w3", "w4"]
    assert [s._tracker.info[k][0] for k in ("w0", "w1")] == [5, 6]   # admission numbers after the 5 residents
    log = [json.loads(x) for x in (rule_env.parent / "steps.jsonl").read_text().splitlines()]
    assert log[0]["event"] == "rule_loaded"
    assert log[1]["stages"] == {"0": 2, "1": 2, "3": 2} and log[1]["paused"] == 1 and log[1]["waiting"] == 3


def test_steps_to_completion_follow_algorithm_1(rule_env):
    """Six prompts (20 tokens in, 3 out: stages 0, 1, 2) waiting at once, n = 2, max_wait_s = 0 (a type
    with any request is always eligible, so the drain never idles). Step by step (stage: requests):
    1: 0:2 -- 2: 0:2 1:2 -- 3: 0:2 1:2 2:2 (w0, w1 finish) -- 4: 1:2 2:2 -- 5: 2:2 (all done)."""
    rule_env.write_text(json.dumps(wait_spec(2, max_wait_s=0.0)))
    s = RuleFake(capacity=1000)
    for k in range(6):
        s.add_request(FakeRequest(f"w{k}", 20, 3))
    sizes = []
    while s.requests:
        out = s.schedule()
        s.update_from_output(out, None)
        sizes.append(len(out.num_scheduled_tokens))
    assert sizes == [2, 4, 6, 4, 2]
    rows = [json.loads(x) for x in (rule_env.parent / "steps.jsonl").read_text().splitlines()][1:]
    assert [r["stages"] for r in rows] == [{"0": 2}, {"0": 2, "1": 2}, {"0": 2, "1": 2, "2": 2},
                                           {"1": 2, "2": 2}, {"2": 2}]


def test_ineligible_type_runs_nothing_and_restores_everything(rule_env):
    """n = 6: only 5 prompts at stage 0, so the type is not eligible (max_wait_s = 10 s not reached):
    nothing runs, vLLM's step is asked for nothing, and both queues come back unchanged."""
    rule_env.write_text(json.dumps(wait_spec(6)))
    s = RuleFake(capacity=1000)
    res, waiting = issue_example(s)
    before_running, before_waiting = list(s.running), list(s.waiting)
    out = s.schedule()
    assert out.num_scheduled_tokens == {} and s.calls == 1
    assert s.running == before_running and list(s.waiting) == before_waiting


def test_without_a_rule_file_vllm_schedules_as_usual(rule_env):
    """Before the harness writes the spec (warm-up), every request runs as vLLM would run it."""
    s = RuleFake(capacity=1000)
    issue_example(s)
    out = s.schedule()
    assert len(out.num_scheduled_tokens) == 10


def test_bad_rule_file_fails_loudly(rule_env):
    rule_env.write_text(json.dumps({"rule": "wait", "thresholds": [1], "output_bins": [8], "max_wait_s": 1.0,
                                    "idle_policy": "wait"}))
    s = RuleFake(capacity=1000)
    with pytest.raises(ValueError, match="1 thresholds for 2 output bins"):
        s.schedule()


def test_paused_resident_is_the_first_victim(rule_env):
    """Blocks of 16 tokens, 8 blocks. n = 1, one type (outputs of 8). Residents, admitted in this order:
    a (prompt 31, stage 1: 31 KV tokens, 2 blocks), b (the same), c (stage 2: 32 KV tokens, 2 blocks);
    another request holds the last 2 blocks, so none is free; prompt w waits. WAIT takes one request per
    stage: a (stage 1, oldest admitted), c (stage 2) and w (stage 0); b is paused. a's next token (its
    32nd) fits its 2 blocks; c's (its 33rd) needs a third: 1 block short. The rule's first victim is the
    paused b -- not vLLM's running[-1] = c -- so b is preempted (KV freed, back at the head of the queue),
    c gets its block, and the step admits nothing (a step that preempted admits no one), so w waits."""
    rule_env.write_text(json.dumps(wait_spec(1, edges=(8,))))
    s = RuleFake(capacity=8)
    a, b, c = decoding("a", 31, 1), decoding("b", 31, 1), decoding("c", 31, 2)
    a.num_computed_tokens = b.num_computed_tokens = 31     # computed = prompt + stage - 1
    for r, held in ((a, 2), (b, 2), (c, 2)):
        s.requests[r.request_id] = r
        s.running.append(r)
        s.held[r.request_id] = held
        s._tracker.admitted(r.request_id, 0.0)
    w = FakeRequest("w", 16, 8)
    s.add_request(w)
    s.held["other"] = 2                       # 0 blocks free
    out = s.schedule()
    assert set(out.num_scheduled_tokens) == {"a", "c"}
    assert b.status == "PREEMPTED" and "b" not in s.held and s.held["c"] == 3
    assert [r.request_id for r in s.waiting] == ["b", "w"]   # preempted to the front; w not admitted
    assert [r.request_id for r in s.running] == ["a", "c"] and out.preempted_req_ids == {"b"}


def test_waiting_requests_holding_kv_stop_the_engine(rule_env):
    """vLLM drains its kv_holding_waiting queue before any other; the rule cannot see it, so a request
    there is an error, not a request silently scheduled past the rule."""
    rule_env.write_text(json.dumps(wait_spec(2)))
    s = RuleFake(capacity=1000)
    s.kv_holding_waiting = FakeQueue([FakeRequest("held", 32, 8, computed=32)])
    with pytest.raises(RuntimeError, match="kv_holding_waiting"):
        s.schedule()


def test_max_num_seqs_counts_paused_residents(rule_env):
    """max_num_seqs = 6 and 5 residents: one seat, so of the 2 prompts WAIT selects only w0 is tried."""
    rule_env.write_text(json.dumps(wait_spec(2)))
    s = RuleFake(capacity=1000, max_seqs=6)
    issue_example(s)
    out = s.schedule()
    assert "w0" in out.num_scheduled_tokens and "w1" not in out.num_scheduled_tokens
    assert [r.request_id for r in s.waiting] == ["w1", "w2", "w3", "w4"]


def test_spec_round_trip_plans_the_same():
    """The simulator's WAIT rule (types from an exact predictor of the true output) and its rebuild in the
    server (types from max_tokens) select the same requests: two types (outputs <= 8 and <= 64), n = [1, 2];
    waiting, FCFS: x (out 4), y (out 40), z (out 40), u (out 4). Type 0 takes x (n = 1), type 1 takes y and
    z (n = 2); u waits. A predictor with injected error cannot be sent (its types would differ)."""
    from baselines.wait.fluid_admission import OutputBinClassifier
    from harness.core.policy import Predictor, TurnTruth
    outs = {"x": 4, "y": 40, "z": 40, "u": 4}
    truth = lambda conv, turn: TurnTruth(outs[conv], 0.0, 0, 0)  # noqa: E731
    sim_rule = WaitRule([1, 2, 1], OutputBinClassifier(Predictor(truth), [8, 64]), 0.5)
    spec = json.loads(json.dumps(sim_rule.to_spec()))
    assert spec == {"rule": "wait", "thresholds": [1, 2, 1], "output_bins": [8, 64], "max_wait_s": 0.5,
                    "idle_policy": "wait"}
    server_rule = rule_from_spec(spec)
    t = ws.Tracker()
    waiting = [FakeRequest(k, 20, outs[k]) for k in ("x", "y", "z", "u")]
    for k, r in enumerate(waiting):
        t.submitted(r.request_id, float(k))
    inp = ws.step_input(5.0, [], waiting, t, lambda r: 0, token_budget=1000, free_blocks=100, capacity_blocks=100,
                        block_size=16, max_num_seqs=10, chunk_cap=0)
    picks = [[v.conv for v in rule.plan(inp).admit] for rule in (sim_rule, server_rule)]
    assert picks[0] == picks[1] == ["x", "y", "z"]
    noisy = WaitRule([1, 2, 1], OutputBinClassifier(Predictor(truth, sigma=0.5), [8, 64]), 0.5)
    with pytest.raises(ValueError, match="scheduler.predictor"):
        noisy.to_spec()


def test_nested_spec_round_trip():
    rule = NestedWaitRule([2, 5], [[1, 2], [1, 1, 2]], 0.3, "decode_residents")
    again = rule_from_spec(json.loads(json.dumps(rule.to_spec())))
    assert (again.bounds, again.caps, again.max_wait_s, again.idle_policy) == ([2, 5], [[1, 2], [1, 1, 2]], 0.3,
                                                                             "decode_residents")


# ---- what backend=vllm does with a batch-rule scheduler ---------------------------------------------------

BASE = ["backend=vllm", "slo=absolute", "model=tiny", "cluster=cpu_1x", "workload=wait_single", "engine.block_size=128",
        "workload.num_conversations=2", "scheduler=wait"]


def test_backend_vllm_launches_the_rule_scheduler(tmp_path):
    """scheduler=wait: every server gets --scheduler-cls and --no-async-scheduling (the rule must see each
    step's outcome before the next step is formed), the spec and step-log paths, and this checkout first on
    PYTHONPATH; scheduler=collocated gets none of it."""
    from harness.run.session import session_input
    from harness.vllm.cluster import instance_specs
    wait_run = compose_run(BASE)
    (spec,) = instance_specs(session_input(wait_run), wait_run.backend, "m", tmp_path)
    args = spec.args
    assert args[args.index("--scheduler-cls") + 1] == "harness.vllm.wait_scheduler.RuleScheduler"
    assert "--no-async-scheduling" in args
    assert spec.env[ws.RULE_FILE_ENV] == str(tmp_path / "batch_rules" / "collocated0.json")
    assert spec.env["PYTHONPATH"].split(":")[0] == str(PROJECT_ROOT)
    plain_run = compose_run([*BASE[:-1], "scheduler=collocated"])
    (plain,) = instance_specs(session_input(plain_run), plain_run.backend, "m", tmp_path)
    assert "--scheduler-cls" not in plain.args and ws.RULE_FILE_ENV not in plain.env


@pytest.mark.parametrize(("extra", "needle"), [
    (["backend.launch=false", "backend.endpoints=[http://127.0.0.1:1]"], "backend.launch=false"),
    (["cluster=cpu_1p1d"], "cluster roles ['decoder', 'prefiller']"),
    (["scheduler.predictor.sigma=0.3"], "scheduler.predictor.sigma=0.3"),
    (["backend.extra_args=[--async-scheduling]"], "backend.extra_args sets --async-scheduling"),
    (["backend.launcher=slurm"], "backend.launcher=slurm"),
])
def test_backend_vllm_refuses_what_the_wrapper_cannot_express(extra, needle):
    with pytest.raises(ConfigError) as e:
        compose_run([*BASE, *extra])
    assert needle in str(e.value), str(e.value)


def test_check_policies_accepts_wait_and_nested_wait_on_vllm():
    from harness.run.session import check_policies, session_input
    from harness.workload.workload import build_workload
    for sched in ("wait", "nested_wait"):
        run = compose_run([*BASE[:-1], f"scheduler={sched}"])
        convs, stats = build_workload([], run.cfg.workload)
        check_policies(session_input(run), convs, stats)


class Fake032(FakeVllmScheduler):
    """The stand-in with vLLM 0.32's chunk-cap rule (``Scheduler.schedule``): ``long_prefill_token_threshold``
    applies only when ``get_request_counts()`` reports more than one request (else 0: no cap), and a
    ``kv_cache_manager.allocate_slots`` that records its ``has_scheduled_reqs`` (vLLM applies
    ``--watermark`` only when it is True, ``bool(self.running)``)."""

    def __init__(self, *a, threshold=0, **kw):
        super().__init__(*a, **kw)
        self.scheduler_config = SimpleNamespace(long_prefill_token_threshold=threshold,
                                                long_prefill_token_threshold_adaptive=False)
        self.seen_has_scheduled = []
        outer = self

        class KVM:
            def allocate_slots(self, req, n, has_scheduled_reqs=True):
                outer.seen_has_scheduled.append(has_scheduled_reqs)
                return outer._alloc(req, n)
        self.kv_cache_manager = KVM()

    def get_request_counts(self):
        return len(self.running), len(self.waiting)

    def schedule(self):
        nr, nw = self.get_request_counts()
        thr = self.scheduler_config.long_prefill_token_threshold if nr + nw > 1 else 0
        sched, budget = {}, self.max_num_scheduled_tokens
        for r in self.running:
            if budget <= 0:
                break
            n = r.num_tokens - r.num_computed_tokens
            n = min(thr, n) if 0 < thr < n else n
            n = min(n, budget)
            if not self.kv_cache_manager.allocate_slots(r, n, has_scheduled_reqs=bool(self.running)):
                break
            sched[r.request_id] = n
            budget -= n
        while budget > 0 and self.waiting and len(self.running) < self.max_num_running_reqs:
            r = self.waiting.peek_request()
            n = r.num_tokens - r.num_computed_tokens
            n = min(thr, n) if 0 < thr < n else n
            n = min(n, budget)
            if not self.kv_cache_manager.allocate_slots(r, n, has_scheduled_reqs=bool(self.running)):
                break
            self.waiting.pop_request()
            r.status = "RUNNING"
            self.running.append(r)
            sched[r.request_id] = n
            budget -= n
        for rid, n in sched.items():
            self.requests[rid].num_computed_tokens += n
        return SimpleNamespace(num_scheduled_tokens=sched, total_num_scheduled_tokens=sum(sched.values()),
                               preempted_req_ids=set())


class RuleFake032(ws.RuleSchedulingMixin, Fake032):
    _rule_new_queue = FakeVllmScheduler._rule_new_queue
    _rule_blocks_of = FakeVllmScheduler._rule_blocks_of
    _rule_free_blocks = FakeVllmScheduler._rule_free_blocks
    _rule_capacity_blocks = FakeVllmScheduler._rule_capacity_blocks

    def __init__(self, *a, **kw):
        Fake032.__init__(self, *a, **kw)
        self._rule_init()


def wait_cp_spec():
    """WAIT-CP for 512/20, tl 21, cs 256: batch_est 508, one segment of 20 stages, total 21
    (tests/test_wait_cp.py derives them)."""
    from baselines.wait.wait_cp import CpType, WaitCpRule, wait_cp_constants
    return WaitCpRule(wait_cp_constants([CpType(512.0, 20, 1.0)], 21, 256), 21, 256).to_spec()


def test_wait_cp_on_vllm_keeps_its_chunk_and_budget(rule_env):
    """vLLM 0.32 drops ``long_prefill_token_threshold`` when one request is visible. WAIT-CP's rule gives a
    lone 512-token prompt 256 tokens (cs), and two prompts at step 0 256 + 252 (batch_est 508), with the
    server's budget 2048 and threshold 0: the wrapper sets the rule's chunk and budget for the step and
    reports the true request count (at least 2) so the cap holds. Unpatched, the lone prompt would get
    512 and the pair 512 + 512."""
    rule_env.write_text(json.dumps(wait_cp_spec()))
    s = RuleFake032(capacity=10_000, budget=2048)
    s.add_request(FakeRequest("a", 512, 20))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 256}
    assert s.max_num_scheduled_tokens == 2048 and s.scheduler_config.long_prefill_token_threshold == 0
    assert "get_request_counts" not in s.__dict__
    s = RuleFake032(capacity=10_000, budget=2048)
    for rid in ("a", "b", "c"):
        s.add_request(FakeRequest(rid, 512, 20))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 256, "b": 252}
    out = s.schedule()          # step 1: limit 1, the two prefills take the whole 508
    assert out.num_scheduled_tokens == {"a": 256, "b": 252}


def test_watermark_applies_when_every_resident_is_hidden(rule_env):
    """vLLM applies ``--watermark`` to admissions only when ``has_scheduled_reqs`` (``bool(self.running)``).
    With WAIT's n = 2 and one resident at stage 1 of a type that is not eligible (one request), hidden,
    and 2 waiting prompts of another type admitted: every visible list is empty, yet a resident holds KV,
    so the wrapper reports has_scheduled_reqs=True to allocate_slots."""
    rule_env.write_text(json.dumps(wait_spec(2)))
    s = RuleFake032(capacity=10_000)
    r = decoding("r", 32, 1, max_tokens=100)      # type 2 (> 64 tokens of output), alone: not eligible
    s.requests["r"] = r
    s.running.append(r)
    s.held["r"] = 2
    s._tracker.submitted("r", time.monotonic())
    s._tracker.admitted("r", time.monotonic())
    for k in range(2):
        s.add_request(FakeRequest(f"w{k}", 32, 4))
    out = s.schedule()
    assert set(out.num_scheduled_tokens) == {"w0", "w1"}
    assert s.seen_has_scheduled[0] is True
    assert "allocate_slots" not in s.kv_cache_manager.__dict__


def test_multiple_kv_groups_refused(rule_env):
    """A model with two KV cache groups (hybrid attention): the rule counts one group's blocks, so the
    wrapper refuses it when the rule is loaded, naming the case."""
    rule_env.write_text(json.dumps(wait_spec(2)))
    s = RuleFake032(capacity=10_000)
    s.kv_cache_config = SimpleNamespace(kv_cache_groups=[object(), object()])
    s.add_request(FakeRequest("a", 32, 4))
    with pytest.raises(RuntimeError, match="2 groups"):
        s.schedule()
