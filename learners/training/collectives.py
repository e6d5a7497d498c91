"""Where JAX's collectives listen, and which ports they opened, for `status.json`.

Left to themselves, gloo (CPU collectives across learner processes) binds whatever the
host name resolves to, and NCCL (GPU collectives, one process or several) the first
network interface it likes, never loopback: a local run would listen on the network,
unauthenticated, on ports no one lists. Neither has authentication, so both take the
address the jax.distributed coordinator takes (`distributed.coordinator_host`):
loopback, or with `transport.allow_unauthenticated` the address the run's peers dial.
gloo is given that address (no public JAX setting takes it, in 0.11 and 0.12: the CPU
backend is registered again, through jax._src, with gloo collectives made for the address,
as JAX's own factory makes them for none); NCCL the interface that holds it
(`NCCL_SOCKET_IFNAME`, unless the environment sets one).

Their ports are chosen inside XLA, so they are found afterwards: the process's listening
sockets (from /proc) that its transport does not list yet are noted there, and its
heartbeats carry them to `status.json` like every other port.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import socket
import struct
from collections.abc import MutableMapping
from pathlib import Path

from jax._src import distributed, xla_bridge
from jax._src.lib import _jax

from srl_jax.wire.transport import Transport, is_loopback

log = logging.getLogger(__name__)

GLOO_KEY = "jax.gloo"
"""status.json's key for gloo's listening port (CPU collectives between learner processes)."""
NCCL_KEY = "jax.nccl"
"""... for NCCL's (its bootstrap and proxy sockets, made with a program's first collective)."""
NCCL_IFNAME = "NCCL_SOCKET_IFNAME"
SIOCGIFADDR = 0x8915
"""ioctl: an interface's IPv4 address (linux/sockios.h)."""
LISTEN = "0A"
"""TCP_LISTEN, as /proc/net/tcp writes a socket's state."""


def listening_sockets(pid: int | str = "self") -> set[tuple[str, int]]:
    """(address, port) of each TCP socket process `pid` listens on; an IPv4 address mapped
    into IPv6 as the IPv4 one. Read from /proc: the sockets of the process's network
    namespace, kept where the process holds them open."""
    inodes = set()
    fds = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fds):
        try:
            target = os.readlink(fds / fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:  # no IPv6
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                address, port = fields[1].split(":")
                found.add((_address(address), int(port, 16)))
    return found


def _address(hex_address: str) -> str:
    """/proc/net/tcp{,6}'s address: 32-bit words, each in the host's (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(raw)
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def interface_of(host: str) -> str | None:
    """The name of this machine's network interface that holds `host`'s IPv4 address
    (loopback's for any 127.x), or None."""
    try:
        address = "127.0.0.1" if is_loopback(host) else socket.gethostbyname(host)
    except OSError:  # a name that does not resolve here
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR,
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:  # an interface without an IPv4 address
                continue
            if socket.inet_ntoa(answer[20:24]) == address:
                return name
    return None


def pin_gloo(host: str) -> None:
    """Make gloo listen on `host` only; after jax.distributed starts its client, before
    JAX starts its backends."""

    def cpu_client() -> object:
        """JAX's CPU client, its gloo collectives bound to `host`."""
        return xla_bridge.make_cpu_client(_jax.make_gloo_tcp_collectives(
            distributed_client=distributed.global_state.client, hostname=host))

    xla_bridge.register_backend_factory("cpu", cpu_client, priority=0, fail_quietly=False)


def pin_nccl(host: str, environ: MutableMapping[str, str]) -> None:
    """NCCL's sockets on the interface that holds `host`, unless `environ` names one."""
    if NCCL_IFNAME in environ:
        return
    interface = interface_of(host)
    if interface is None:
        log.warning("no network interface holds %s: NCCL picks its own", host)
    else:
        environ[NCCL_IFNAME] = f"={interface}"  # '=': this name exactly, not a prefix


def note_new_ports(transport: Transport, key: str) -> list[str]:
    """Note in `transport`, under `key`, each port this process listens on that it does not
    list yet; returns them (host:port)."""
    listed = {port.bind.rpartition(":")[2] for port in transport.ports}
    new = [f"{host}:{port}" for host, port in sorted(listening_sockets())
           if str(port) not in listed]
    for address in new:
        transport.note_port(key, address)
    return new
