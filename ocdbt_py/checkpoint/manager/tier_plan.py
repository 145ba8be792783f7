"""Decisions of the multi-tier manager that every process must take identically.

Pure functions of data every process holds after an exchange (no JAX, no I/O), so they are
unit-testable and, given the same inputs, agree across processes:

* :func:`complete_per_replica` -- a local step is *complete* in a replica when every process
  of that replica has it (each process holds only its own shards);
* :func:`plan_restore` -- which step to restore and from where: every process's own local
  tier, one replica's local tier broadcast to the others (``peer``), or the persistent tier.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from ocdbt_py.errors import NotFoundError

__all__ = ["LOCAL", "PEER", "PERSISTENT", "RestorePlan", "complete_per_replica", "plan_restore",
           "restorable_steps"]

#: Every process reads its own local tier.
LOCAL = "local"
#: The processes of one replica read their local tiers and broadcast to the other replicas.
PEER = "peer"
#: Every process reads its regions from the persistent tier.
PERSISTENT = "persistent"


@dataclasses.dataclass(frozen=True)
class RestorePlan:
    """The step to restore and its source (``replica``: the source replica of a peer restore)."""

    step: int
    source: str
    replica: int | None = None


def complete_per_replica(local_steps: Mapping[int, Iterable[int]], replicas: Sequence[Sequence[int]]
                         ) -> list[set[int]]:
    """For each replica, the local steps every one of its processes holds.

    ``local_steps`` maps a process index to its usable local steps (a process missing from
    the mapping holds none); ``replicas[r]`` lists the processes of replica ``r``.
    """
    out: list[set[int]] = []
    for procs in replicas:
        common: set[int] | None = None
        for p in procs:
            mine = set(local_steps.get(p, ()))
            common = mine if common is None else common & mine
        out.append(common or set())
    return out


def restorable_steps(local_steps: Mapping[int, Iterable[int]], replicas: Sequence[Sequence[int]],
                     persistent_steps: Iterable[int]) -> set[int]:
    """Every step complete somewhere: in one replica's local tiers or in the persistent tier."""
    out = set(persistent_steps)
    for steps in complete_per_replica(local_steps, replicas):
        out |= steps
    return out


def plan_restore(
    step: int | None,
    local_steps: Mapping[int, Iterable[int]],
    replicas: Sequence[Sequence[int]],
    persistent_steps: Iterable[int],
    *,
    peer_ok: bool = True,
) -> RestorePlan:
    """Choose the step (``None``: the newest complete somewhere) and its source.

    * every replica holds the step completely: ``LOCAL`` (each process reads its own tier);
    * else some replica does and ``peer_ok`` (the state is replicated across replicas): ``PEER``
      from the lowest such replica;
    * else the persistent tier has it: ``PERSISTENT``;
    * else :class:`~ocdbt_py.errors.NotFoundError`.

    A single replica that is complete while ``peer_ok`` is false cannot serve the others; the
    step is then restorable only from the persistent tier.
    """
    complete = complete_per_replica(local_steps, replicas)
    persistent = set(persistent_steps)
    everywhere = set.intersection(*complete) if complete else set()
    usable = set(persistent) | everywhere
    if peer_ok:
        for steps in complete:
            usable |= steps
    if step is None:
        if not usable:
            raise NotFoundError("no step is complete in any local tier or in the persistent tier")
        step = max(usable)
    if step in everywhere:
        return RestorePlan(step, LOCAL)
    if peer_ok:
        for r, steps in enumerate(complete):
            if step in steps:
                return RestorePlan(step, PEER, r)
    if step in persistent:
        return RestorePlan(step, PERSISTENT)
    partial = sorted(r for r, steps in enumerate(complete) if step in steps)
    why = (f"; replicas {partial} hold it locally but the state is not replicated across replicas"
           if partial else "")
    raise NotFoundError(f"step {step} is not complete in any replica's local tiers nor in the persistent tier"
                        f" (restorable: {sorted(usable)}){why}")
