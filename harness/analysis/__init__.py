"""The analysis: what a run produced and what it means (imports only ``harness.core``, ``harness.workload`` and itself).

* ``metrics`` -- per-turn and per-conversation tables, SLO attainment, the summary; ``validity`` -- serving
  metrics as ``vllm bench serve`` / AIPerf report them and the VALID/INVALID verdict; ``goodput`` --
  per-request goodput; ``catalog`` -- every headline metric's label, unit, format and definition.
* ``stats`` -- seed-level intervals and the verdict rule; ``claims`` -- the papers' claims, paired;
  ``results`` -- every claim's word from the shipped data, one page per paper (``python -m harness.analysis.results``);
  ``capacity`` -- the stability limit by bisection on rate; ``twin`` -- a claim decided on real vLLM and its twin;
  ``seeds`` -- enough seeds, chosen by the data.
* ``report`` -- a sweep into a table, a markdown summary and figures (``python -m harness.analysis.report``);
  ``plots`` / ``plotting`` -- its figures; ``export`` -- a run in ``vllm bench serve`` / AIPerf formats.
* ``provenance`` -- what a result depends on (fingerprints) and who may write a results directory (locks).
"""
