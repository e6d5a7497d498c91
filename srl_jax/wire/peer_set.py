"""A connecter socket joined to a bounded set of binders, which replaces the ones it loses.

The choice of binders and why it is bounded: srl_jax/dataflow/fan_in.py. The set watches
its socket's connection events (ZeroMQ's monitor): a connection lost marks its binder
lost and connects the next one in order that is not; a lost preferred binder whose
connection is made again (it rebinds its port, or registers a new endpoint that the
worker follows) lets the newest stand-in go. Either may lose requests in flight, which
`check` tells its worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import zmq
from zmq.utils.monitor import parse_monitor_message

EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED
"""What a peer set watches on its socket: a connection lost, one refused (ZeroMQ tries
again), one made."""


class PeerSet:
    """The binders one connecter socket holds, at most `bound` live at once, in `order`
    of preference (keys), replacing each one it loses by the next that is not lost."""

    def __init__(self, socket: zmq.Socket, order: Sequence[str], bound: int,
                 connect: Callable[[str], None], disconnect: Callable[[str], None],
                 keys_at: Callable[[], dict[str, str]]) -> None:
        """`connect`, `disconnect`: join and leave the binder under a key (and follow it);
        `keys_at`: the key of each endpoint the socket is connected to now."""
        self.socket = socket
        self.order = list(order)
        self.preferred = self.order[:bound]
        self.stand_ins: list[str] = []
        """Keys connected in place of lost preferred ones, newest last."""
        self.lost: set[str] = set()
        """Keys whose connection dropped or was refused, until one is made again."""
        self.up: set[str] = set()
        """Keys whose connection is made: requests may be in flight to them."""
        self._connect, self._disconnect, self._keys_at = connect, disconnect, keys_at
        self._monitor = socket.get_monitor_socket(EVENTS)
        for key in self.preferred:
            connect(key)

    @property
    def connected(self) -> list[str]:
        """The keys it holds a connection to, or tries to (lost preferred ones included)."""
        return [*self.preferred, *self.stand_ins]

    def check(self) -> bool:
        """Take the socket's connection events; True where a connection with requests
        possibly in flight was lost or let go (the caller sends them again)."""
        # Runs the socket's pending commands: a connection it left closes only then, and
        # a socket whose messages go through shared memory is otherwise never touched.
        self.socket.getsockopt(zmq.EVENTS)
        dropped = False
        while self._monitor.poll(0):
            event = parse_monitor_message(self._monitor.recv_multipart())
            key = self._keys_at().get(event["endpoint"].decode())
            if key is None:  # an endpoint it has left since
                continue
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                dropped |= self._on_up(key)
            else:
                dropped |= self._on_lost(key)
        return dropped

    def _on_lost(self, key: str) -> bool:
        """`key`'s connection dropped, or was refused: connect the next binder in its
        place. True where requests may have been in flight to it."""
        was_up = key in self.up
        self.up.discard(key)
        if key in self.lost:  # refused again, as ZeroMQ retries
            return was_up
        self.lost.add(key)
        if key in self.stand_ins:
            self.stand_ins.remove(key)
            self._disconnect(key)
        self._fill()
        return was_up

    def _on_up(self, key: str) -> bool:
        """`key`'s connection is made; a lost preferred binder back lets the newest
        stand-in go (True: requests may have been in flight to that)."""
        self.up.add(key)
        back = key in self.lost
        self.lost.discard(key)
        if not back or key not in self.preferred or not self.stand_ins:
            return False
        let_go = self.stand_ins.pop()
        self.up.discard(let_go)
        self._disconnect(let_go)
        return True

    def _fill(self) -> None:
        """Connect stand-ins until `bound` connections are live, or none is left to try."""
        live = sum(key not in self.lost for key in self.connected)
        unused = [key for key in self.order if key not in self.connected]
        # Lost ones it let go are tried last: they may be back, and are marked live again
        # when their handshake succeeds.
        spare = [key for key in unused if key not in self.lost] + \
            [key for key in unused if key in self.lost]
        for key in spare[:max(0, len(self.preferred) - live)]:
            self._connect(key)
            self.stand_ins.append(key)

    def close(self) -> None:
        self.socket.disable_monitor()
        self._monitor.close(linger=0)
