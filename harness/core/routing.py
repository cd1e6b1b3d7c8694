"""``workload.model_map``: which instances serve a call, by the model its trace recorded.

A session trace records each call's model (``TurnRecord.model``: Claude Code's Opus / Sonnet / Haiku,
sub-agents mostly Haiku; docs/traces.md). By default every call goes to the run's one served model on every
instance (no map: the policy sees the whole cluster). ``workload.model_map`` sends calls to **instance
groups** by name: a mapping ``{pattern: group name}``, the pattern a shell-style glob (``fnmatch``, case
sensitive) matched against the call's recorded model, the first matching pattern in the mapping's order
winning; a group name is the ``name`` of one or more ``cluster.instances`` entries (groups sharing a name form
one pool, e.g. a prefiller group and a decoder group). A call no pattern matches (or without a recorded
model) goes to the **default pool**: the instances of the groups that have no name.

What a pool is to a policy: the controller shows the policy only the pool's instances, renumbered
``0 .. m-1`` (its own sub-cluster: the policy's roles must be present in each pool), with the turn's previous
placement and cached prefixes kept where they are inside the pool and dropped where they are outside it (a
call to another model has no KV on the other pool), and maps the placement back. Admission sees the whole
cluster. Every instance serves the run's one model profile (``model``): the simulator has one per run, so a
map separates where calls run (their instances, queues, KV and prefix caches), not their step times.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence


@dataclass(frozen=True)
class ModelRoutes:
    """``workload.model_map`` resolved on a cluster (:func:`resolve_routes`).

    patterns: ``(glob, group name)`` in the map's order; pools: group name -> the global indices of its
    instances (ascending); default: the instances of the unnamed groups (may be empty).
    """

    patterns: tuple[tuple[str, str], ...]
    pools: tuple[tuple[str, tuple[int, ...]], ...]
    default: tuple[int, ...]

    def group_of(self, model: Optional[str]) -> Optional[str]:
        """The group a call with recorded ``model`` goes to, or ``None`` for the default pool."""
        if model is not None:
            for pat, group in self.patterns:
                if fnmatch.fnmatchcase(model, pat):
                    return group
        return None

    def pool_of(self, model: Optional[str]) -> tuple[int, ...]:
        """The global instance indices that may serve a call with recorded ``model``."""
        g = self.group_of(model)
        return self.default if g is None else dict(self.pools)[g]


def resolve_routes(model_map: Optional[Mapping[str, str]], groups: Sequence[Optional[str]],
                   roles: Sequence[str], needed_roles: Sequence[str] = (),
                   where: str = "workload.model_map", cluster: str = "") -> Optional[ModelRoutes]:
    """Resolve ``model_map`` on a cluster whose instance ``i`` belongs to the group named ``groups[i]``
    (``None``: unnamed) and has role ``roles[i]``.

    ``needed_roles``: the roles the run's scheduler requires (``harness.core.registry`` ``roles``): every pool a
    pattern names, and the default pool when it has instances, must hold one instance of each. Returns
    ``None`` for no map (``None`` or empty: every call on every instance).

    Raises:
        ValueError: naming ``where[<pattern>]``: a pattern or group name that is not a non-empty string, a group
            the cluster (``cluster``, for the message) does not declare (the declared names listed), or a pool
            lacking a role the scheduler needs.
    """
    if not model_map:
        return None
    if len(groups) != len(roles):
        raise ValueError(f"{where}: {len(groups)} group names for {len(roles)} instances")
    declared = sorted({g for g in groups if g is not None})
    pools: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        if g is not None:
            pools.setdefault(g, []).append(i)
    patterns = []
    for pat, group in model_map.items():
        key = f"{where}[{pat!r}]"
        if not isinstance(pat, str) or not pat:
            raise ValueError(f"{where}: a pattern must be a non-empty string (a glob on the call's model), got {pat!r}")
        if not isinstance(group, str) or not group:
            raise ValueError(f"{key} must name an instance group (a non-empty string), got {group!r}")
        if group not in pools:
            on = f" {cluster}" if cluster else ""
            raise ValueError(f"{key}: instance group {group!r} is not in cluster{on} (cluster.instances[*].name "
                             f"declares {declared if declared else 'no named group'})")
        have = {roles[i] for i in pools[group]}
        miss = [r for r in needed_roles if r not in have]
        if miss:
            raise ValueError(f"{key}: instance group {group!r} has no {miss[0]} instance, which the scheduler needs "
                             f"(its roles: {sorted(have)})")
        patterns.append((pat, group))
    default = tuple(i for i, g in enumerate(groups) if g is None)
    if default:
        have = {roles[i] for i in default}
        miss = [r for r in needed_roles if r not in have]
        if miss:
            raise ValueError(f"{where}: the default pool (the unnamed groups of cluster.instances) has no {miss[0]} "
                             f"instance, which the scheduler needs (its roles: {sorted(have)})")
    return ModelRoutes(tuple(patterns), tuple((g, tuple(ix)) for g, ix in pools.items()), default)
