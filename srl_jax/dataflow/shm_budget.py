"""How much shared memory a run maps, and whether this host's /dev/shm holds it: decided
once, before any worker starts (srl_jax/launch.py).

Each actor maps, per policy it serves, a request file (`REQUEST_SLOTS` request and reply
slots per split) and a chunk ring (`actors.send_queue` slots), sized by
srl_jax/dataflow/shm_layouts.py; binders map those files and make only their
doorbells. Under Docker /dev/shm is 64 MiB unless the container is started with
`--shm-size` (or `--ipc=host`): a run that does not fit runs on ZeroMQ (`auto`, with one
line that says what it needs) or does not start (`on`).
"""

from __future__ import annotations

import mmap
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from srl_jax.config.schema import ConfigError, ExperimentConfig, policy_names
from srl_jax.dataflow.chunk_spec import run_chunk_layout
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.shm_layouts import chunk_slot_layout, reply_layout, request_layout
from srl_jax.dataflow.worker_kinds import worker_plan
from srl_jax.wire.shm.layout import REQUEST_SLOTS
from srl_jax.wire.shm.place import SHM_ROOT, free_bytes, unsupported_reason
from srl_jax.wire.shm.slot_file import file_bytes

BACKENDS_THAT_OWN = frozenset({"local"})
"""Launch backends whose workers of one host are started by one owner."""


def actor_bytes(config: ExperimentConfig, spec: EnvSpec, policy: str, max_returns: int,
                chunks: bool = True) -> int:
    """Bytes one actor maps for `policy`, in whole pages as tmpfs holds them: its request
    file where servers answer it, and its chunk ring where it sends chunks (`chunks`:
    the policy is trained)."""
    files = []
    if not config.actors.inline_inference and config.inference.count:
        slots = REQUEST_SLOTS * config.actors.splits
        files.append(file_bytes([(slots, request_layout(config, spec, policy)),
                                 (slots, reply_layout(config, spec, policy))]))
    if chunks:
        layout = chunk_slot_layout(run_chunk_layout(config, spec), max_returns)
        files.append(file_bytes([(config.actors.send_queue, layout)]))
    return sum(-(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE for nbytes in files)


def run_bytes(config: ExperimentConfig, spec_of: Callable[[str], EnvSpec],
              max_returns: int) -> int:
    """Bytes of shared memory the whole run maps on this host (every actor's files)."""
    served: Counter[str] = Counter()
    for kind, _, policy in worker_plan(config):
        if kind == "actor":
            served.update([policy] if config.population.members else policy_names(config.env))
    return sum(actors * actor_bytes(config, spec_of(name), name, max_returns,
                                    chunks=name not in config.selfplay.frozen)
               for name, actors in served.items())


def plan_shared_memory(config: ExperimentConfig, backend: str,
                       spec_of: Callable[[str], EnvSpec] | None, max_returns: int,
                       root: Path = SHM_ROOT) -> tuple[bool, str | None]:
    """Whether the run's launcher owns shared memory for its workers, and the one line to
    print when it falls back to ZeroMQ; ConfigError (exit 2) where `on` cannot be had.
    `spec_of`: a policy's env spec (None: the size is not checked)."""
    mode = config.transport.shared_memory
    if mode == "off":
        return False, None
    problem = None if backend in BACKENDS_THAT_OWN else (
        f"the {backend} backend starts no owner of shared memory (only the local backend's "
        "workers share a host through it)")
    problem = problem or unsupported_reason(root)
    if problem is None and spec_of is not None:
        needed, free = run_bytes(config, spec_of, max_returns), free_bytes(root)
        if needed > free:
            problem = (f"the run needs {_size(needed)} of shared memory and {root} has "
                       f"{_size(free)} free (in a container, start it with "
                       f"--shm-size={_suggested_size(needed)} or --ipc=host)")
    if problem is None:
        return True, None
    if mode == "on":
        raise ConfigError(f"'transport.shared_memory: on': {problem}; set it to auto or off")
    return False, f"shared memory: {problem}; ZeroMQ carries the same-host streams"


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{-(-nbytes // 1024)} KiB"


def _suggested_size(needed: int) -> str:
    """A --shm-size with room to spare: twice what is needed, in whole MiB or GiB."""
    mib = max(64, -(-2 * needed // 2**20))
    return f"{-(-mib // 1024)}g" if mib > 1024 else f"{mib}m"

