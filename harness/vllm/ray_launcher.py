"""``backend.launcher=ray``: each vLLM instance a Ray actor on a node that has the resources it needs.

The instances form one Ray placement group, one bundle per instance of ``{"CPU": cpus_per_instance}``
plus ``{"GPU": tensor_parallel_size}`` on ``device=gpu`` (Ray then sets the actor's
``CUDA_VISIBLE_DEVICES`` to those GPUs; the server inherits it unchanged). Strategy: ``placement=pack`` ->
Ray's ``PACK``; ``spread`` -> ``STRICT_SPREAD`` when there are at least as many alive nodes as instances
(each instance on its own node), else ``SPREAD``. Each actor (``ServerActor``) runs a
:class:`harness.vllm.nodes.NodeServer` on its node: bound to the node's own address (``backend.host=node``:
the Ray node's IP) or loopback, NIXL side channel on that address, ports per machine address
(``harness.vllm.placement``), NVML energy by UUID read on the node and gathered by actor calls.

Servers start one at a time (each healthy before the next: on a small machine two starting together
starve each other). Teardown: ``stop()`` stops every server (SIGTERM, then SIGKILL of its process group)
through its actor, kills the actors and removes the placement group; it runs on exit, on an exception and
at interpreter exit. If the harness dies, Ray kills the actors it owned, and each server then gets its
parent-death signal. Nodes must share the Python environment and see this checkout at the same path
(``PYTHONPATH`` is set for the actors); logs are written to the run directory on the node (a shared
filesystem brings them back).
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional, Sequence

from harness.core.paths import PROJECT_ROOT
from harness.vllm.launcher import InstanceSpec, StartStop, wait_http_healthy
from harness.vllm.nodes import NodeServer, node_address
from harness.vllm.placement import localize

log = logging.getLogger(__name__)


class ServerActor:
    """The Ray actor of one instance (see the module): a :class:`NodeServer` on the actor's node."""

    def __init__(self, spec: dict, log_path: str, host_mode: str):
        import ray
        self.server = NodeServer(spec, log_path, node_address(host_mode, ray.util.get_node_ip_address()))

    def start(self) -> dict:
        """Start the server; returns where it runs (``NodeServer.start``)."""
        return self.server.start()

    def returncode(self) -> Optional[int]:
        return self.server.returncode()

    def energy(self) -> dict:
        return self.server.energy()

    def stop(self, grace_s: float = 15.0) -> None:
        self.server.stop(grace_s)

    def kill(self) -> None:
        self.server.kill()


class RayLauncher(StartStop):
    """Launch and own vLLM servers as Ray actors (see the module). Same contract as
    :class:`harness.vllm.launcher.ServerLauncher`.

    Args:
        specs: the instances (from ``harness.vllm.cluster.instance_specs``); log_dir: run-directory logs;
        startup_timeout_s: for all servers (placement included), s; address: ``ray.init`` address
        (``auto``: a running cluster; used only when this process is not yet connected); gpus: GPUs per
        instance (``tensor_parallel_size``; 0 on ``device=cpu``); cpus: CPUs per instance; host_mode:
        ``loopback`` or ``node``; placement: ``pack`` or ``spread``; port_base, cpu_bind_offset: see
        ``harness.vllm.placement``.
    """

    def __init__(self, specs: Sequence[InstanceSpec], log_dir: Path, startup_timeout_s: float, *,
                 address: str = "auto", gpus: int = 0, cpus: float = 1, host_mode: str = "node",
                 placement: str = "pack", port_base: int = 8100, cpu_bind_offset: int = 0):
        self.specs = list(specs)
        self.log_dir = Path(log_dir)
        self.startup_timeout_s = startup_timeout_s
        self.address, self.gpus, self.cpus = address, gpus, cpus
        self.host_mode, self.placement_mode = host_mode, placement
        self.port_base, self.cpu_bind_offset = port_base, cpu_bind_offset
        self.startup_s: dict[str, float] = {}
        self.actors: dict[str, object] = {}
        self.info: dict[str, dict] = {}
        self.pg = None
        self._connected_here = False

    def start(self) -> None:
        """Place the instances, start every server (one at a time) and wait until each is healthy.

        Raises:
            RuntimeError: no placement within the timeout, or a server died or timed out (everything
                started is stopped first).
        """
        import ray
        from ray.util.placement_group import placement_group, placement_group_table
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        atexit.register(self.stop)
        try:
            t0 = time.monotonic()
            if not ray.is_initialized():
                ray.init(address=self.address, log_to_driver=False)
                self._connected_here = True
            alive = [n for n in ray.nodes() if n["Alive"]]
            bundle = {"CPU": float(self.cpus), **({"GPU": float(self.gpus)} if self.gpus else {})}
            strategy = {"pack": "PACK", "spread": "STRICT_SPREAD" if len(self.specs) <= len(alive) else "SPREAD"}[
                self.placement_mode]
            self.pg = placement_group([dict(bundle) for _ in self.specs], strategy=strategy)
            try:
                ray.get(self.pg.ready(), timeout=self.startup_timeout_s)
            except Exception as e:
                raise RuntimeError(f"Ray could not place {len(self.specs)} instance(s) of {bundle} with strategy "
                                   f"{strategy} within backend.startup_timeout_s={self.startup_timeout_s} s on nodes "
                                   f"{[(n['NodeManagerAddress'], n['Resources']) for n in alive]}: {e}") from e
            node_of = placement_group_table(self.pg)["bundles_to_node_id"]
            ip_of = {n["NodeID"]: n["NodeManagerAddress"] for n in alive}
            nodes = [node_of[i] for i in range(len(self.specs))]
            addrs = ["127.0.0.1" if self.host_mode == "loopback" and ip_of[nd].startswith("127.") else ip_of[nd]
                     for nd in nodes]
            self.specs = localize(self.specs, nodes, addrs, self.port_base, self.cpu_bind_offset,
                                  os.cpu_count() or 1)
            actor_cls = ray.remote(ServerActor)
            env = {"PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
            self.log_dir.mkdir(parents=True, exist_ok=True)
            for i, s in enumerate(self.specs):
                actor = actor_cls.options(
                    num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i),
                    runtime_env={"env_vars": env}).remote(asdict(s), str(self.log_dir / f"{s.name}.log"),
                                                          self.host_mode)
                self.actors[s.name] = actor
                info = ray.get(actor.start.remote())
                self.info[s.name] = info
                s.host = info["host"]
                left = max(1.0, self.startup_timeout_s - (time.monotonic() - t0))

                def exited(a=actor):
                    rc = ray.get(a.returncode.remote())
                    return "" if rc is None else f"exited with code {rc}"
                wait_http_healthy(s.url, left, exited, self.log_dir / f"{s.name}.log")
                self.startup_s[s.name] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise

    def kill(self, name: str) -> None:
        """Kill one server's process group at once (SIGKILL)."""
        import ray
        if name in self.actors:
            ray.get(self.actors[name].kill.remote())

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop every server through its actor, kill the actors, remove the placement group. Idempotent."""
        try:
            import ray
        except ImportError:
            return
        if ray.is_initialized():
            for name, a in list(self.actors.items()):
                try:
                    ray.get(a.stop.remote(grace_s), timeout=grace_s + 30)
                except Exception as e:  # the actor or its node is gone: its server got the parent-death signal
                    log.warning("stopping %s through its actor: %s", name, e)
                try:
                    ray.kill(a)
                except Exception:
                    pass
            if self.pg is not None:
                from ray.util.placement_group import remove_placement_group
                try:
                    remove_placement_group(self.pg)
                except Exception:
                    pass
            if self._connected_here:
                ray.shutdown()
        self.actors.clear()
        self.pg = None
        self._connected_here = False
        try:
            atexit.unregister(self.stop)
        except Exception:
            pass

    def energy_readers(self) -> list:
        """Per instance: the NVML counters of its GPUs, read on its node by its actor."""
        import ray
        return [lambda a=self.actors[s.name]: ray.get(a.energy.remote(), timeout=30) for s in self.specs]

    def placement(self) -> list[dict]:
        """Where each instance runs: name, Ray node id, url, CUDA_VISIBLE_DEVICES as Ray set it, GPU UUIDs."""
        return [{"name": s.name, "node": s.node, "url": s.url,
                 "devices": self.info.get(s.name, {}).get("cuda_visible_devices"),
                 "gpu_uuids": self.info.get(s.name, {}).get("gpu_uuids")} for s in self.specs]

    def pids(self) -> list[int]:
        """Process-group ids of the servers (== their leader pids; all nodes here share one machine only
        in tests)."""
        return [i["pid"] for i in self.info.values()]

    def exited(self) -> dict[str, str]:
        """``{name: why}`` for each started server whose process ended (asked of its actor, 5 s timeout);
        an actor that does not answer counts as dead."""
        import ray
        out = {}
        for name, actor in self.actors.items():
            if name not in self.startup_s:
                continue
            try:
                rc = ray.get(actor.returncode.remote(), timeout=5)
            except Exception as e:  # noqa: BLE001 -- the actor (or its node) is gone
                out[name] = f"is unreachable through its Ray actor ({type(e).__name__})"
                continue
            if rc is not None:
                out[name] = f"exited with code {rc}"
        return out
