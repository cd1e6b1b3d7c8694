"""The ``vllm`` backend plug-in: registers its config (``harness.vllm.config.VllmBackendConfig``, the ``backend``
node when ``backend=vllm``: keys, ``engine.*`` to ``vllm serve`` flags, validation before launch) with ``open``.

Importing this module needs no vLLM and no aiohttp (``open`` imports them), so configs can be checked
on any machine.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from harness.core.backend import SessionInput, register_backend
from harness.vllm.config import VllmBackendConfig
from harness.vllm.otlp import engine_times_mode  # noqa: F401 -- re-exported

if TYPE_CHECKING:  # annotations only: the cluster module (aiohttp) is imported by ``open``
    from harness.vllm.cluster import VllmCluster


@register_backend("vllm", VllmBackendConfig)
@contextlib.contextmanager
def open_vllm(inp: "SessionInput", cfg: VllmBackendConfig, run_dir: Path, *, conversations: Sequence = (),
              hooks: Sequence = ()) -> Iterator["VllmCluster"]:
    """Launch (or connect to) the servers of the session ``inp`` as ``cfg`` (the ``backend`` node) says, warm
    them up, and yield a :class:`harness.vllm.cluster.VllmCluster` whose prompts share token ids where the
    workload's ``conversations`` share KV blocks; on exit, whatever happened, close the client and stop every
    launched server. ``hooks``: ``(t_s, fn(cluster))`` called at run time ``t_s`` (fault injection in tests).

    Raises:
        RuntimeError: a server did not start or does not answer.
    """
    from harness.vllm.cluster import open_cluster
    with open_cluster(inp, cfg, Path(run_dir), conversations, hooks) as cluster:
        yield cluster
