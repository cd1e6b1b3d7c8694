"""The workload: what a run replays (imports only ``harness.core`` and itself).

* ``workload`` -- conversations sampled from a trace (or generated) with a seed, their arrival times
  (Poisson, trace, closed, ramps), the workload statistics and the ``Oracle`` a predictor wraps.
* ``prefix`` -- which KV-cache blocks requests share (the content identity of every token position).
* ``convert`` -- agent trajectories (mini-swe-agent, SWE-agent) and request traces (Mooncake, Dynamo,
  AIPerf) into a harness trace: ``python -m harness.workload.convert``.
* ``claude_code`` -- Claude Code session traces (kv-cache-tester) into a session trace (user messages, think
  time, sub-agents as child conversations): ``python -m harness.workload.convert claude-code``.
"""
