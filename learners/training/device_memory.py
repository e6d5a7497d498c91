"""Device memory a JAX worker holds, from the devices' own allocator statistics."""

from __future__ import annotations

from collections.abc import Iterable

import jax

MIB = 2**20


def device_memory_counters(devices: Iterable[jax.Device] | None = None) -> dict[str, float]:
    """`device_memory_mib` and `device_memory_peak_mib` (bytes in use and their peak,
    summed over `devices`; None: the process's default device, where a server's policy
    runs) for a heartbeat; {} where the platform keeps no statistics (the CPU)."""
    stats = []
    for device in jax.local_devices()[:1] if devices is None else devices:
        try:
            stats.append(device.memory_stats())
        except RuntimeError:  # a platform that does not implement them
            continue
    stats = [s for s in stats if s]
    if not stats:
        return {}
    return {"device_memory_mib": sum(s.get("bytes_in_use", 0) for s in stats) / MIB,
            "device_memory_peak_mib": sum(s.get("peak_bytes_in_use", 0) for s in stats) / MIB}
