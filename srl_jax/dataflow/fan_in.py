"""Bounded fan-in: an actor connects to a few of its policy's inference servers, not all.

With every actor connected to every server, 10,000 actors and 100 servers hold a million
connections, and a restarted server takes 10,000 handshakes. Here each actor connects to
`inference.servers_per_actor` of them: those of its own host first, then the others from
its index on (`server_order`, SRL's `rank % n`), so that the actors of a run spread
evenly. A server it loses (its connection drops: killed, or silent for
`runtime.heartbeat_timeout_s`, ZeroMQ's heartbeat) is replaced by the next one in that
order that is not lost (srl_jax/wire/peer_set.py), and the actor sends its unanswered
requests again at once (`Worker.peers_dropped`): the lost server's requests are answered
by a live one, not after `actors.inference_timeout_s`. Once the lost server is back (it
rebinds its port, or registers a new endpoint that the actor follows), the actor returns
to it and lets the stand-in go. Learners are not bounded: every actor still pushes chunks
to every learner process of its policy, which are few and each needs its share.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit


def endpoint_host(endpoint: str) -> str:
    """The host part of a `tcp://host:port` endpoint ('' for another transport)."""
    return urlsplit(endpoint).hostname or ""


def server_order(rank: int, own_host: str, hosts: Sequence[str]) -> list[int]:
    """The binders' indices in the order a connecter of index `rank` on `own_host` takes
    them: those on its host first, then the others, each group from `rank % its size` on,
    round, so that consecutive ranks start at consecutive servers."""
    local = [i for i, host in enumerate(hosts) if host == own_host]
    others = [i for i, host in enumerate(hosts) if host != own_host]
    return [group[(rank + k) % len(group)] for group in (local, others)
            for k in range(len(group))]


def servers_per_actor(bound: int, count: int) -> int:
    """How many of `count` servers an actor connects to (`inference.servers_per_actor`,
    0: every one)."""
    return count if bound <= 0 else min(bound, count)
