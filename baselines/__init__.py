"""The scheduler variants, one small module each, registered by name (``harness.policy.register``).

Each module imports only the policy interface (``harness.policy``) and, for WAIT, the fluid model
(``harness.fluid``) and the engine batch-rule interface (``harness.batching``). The Hydra option ``conf/scheduler/<name>.yaml`` carries the same name.

| name | admission | placement |
|---|---|---|
| collocated | none | sticky instance; least-loaded (KV occupancy) at turn 0 |
| disaggregated | none | every turn: prefill on a prefiller, KV moved to a decoder |
| conserve | reactive (prefiller queue, decoder-pool KV) | turn 0 P->D once, then pinned, local append-prefill |
| ampd | none | turn 0 P->D; later turns remote or local by predicted cost |
| wait | none; WAIT batch rule in each engine (known output lengths) | as collocated |
| nested_wait | none; Nested WAIT batch rule in each engine (unknown output lengths) | as collocated |
"""

from baselines import ampd, collocated, conserve, disaggregated, nested_wait, wait  # noqa: F401
