"""How the inference server cuts requests into batches, without sockets or a policy."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

import learners.inference_server as server_module
from learners.inference_server import Batcher, InferenceServer, Request
from srl_jax.streams import RejectCounter


def request(rows: int, tag: int = 0, width: int = 21) -> Request:
    return Request([b"actor-%d" % tag], {"seq": tag}, np.full((rows, width), tag, np.float32))


def test_a_request_that_would_overflow_max_batch_waits_for_the_next_batch():
    """mpe_spread_ppo: 24-row requests and max_batch 32; two must not make a 48-row batch."""
    batcher = Batcher(max_batch=32)
    batcher.add(request(24, 1))
    assert not batcher.full
    batcher.add(request(24, 2))
    assert batcher.full
    first = batcher.take()
    assert [r.meta["seq"] for r in first] == [1]
    assert [r.meta["seq"] for r in batcher.pending] == [2] and batcher.rows == 24
    assert [r.meta["seq"] for r in batcher.take()] == [2]
    assert batcher.take() == [] and batcher.rows == 0


@pytest.mark.parametrize("seed", range(5))
def test_batches_never_exceed_max_batch_and_keep_requests_whole_and_in_order(seed):
    rng = np.random.default_rng(seed)
    max_batch = int(rng.integers(1, 40))
    sizes = rng.integers(1, max_batch + 1, size=200)
    batcher, batches = Batcher(max_batch), []
    for tag, rows in enumerate(sizes):
        batcher.add(request(int(rows), tag, width=1))
        if batcher.full or rng.random() < 0.2:
            batches.append(batcher.take())
    batches.append(batcher.take())
    assert all(sum(r.obs.shape[0] for r in batch) <= max_batch for batch in batches)
    served = [r for batch in batches for r in batch]
    assert [r.meta["seq"] for r in served] == list(range(len(sizes)))
    assert all(r.obs.shape[0] == rows for r, rows in zip(served, sizes, strict=True))


class FakeRouter:
    """What `_gather` asks of its ROUTER socket: waiting requests, and a poll."""

    def __init__(self, requests: list[Request]) -> None:
        self.waiting = deque(requests)

    def poll(self, timeout_ms: int = 0) -> int:
        return int(bool(self.waiting))


def fake_receive(router: FakeRouter, kinds, rejects, envelope: int):
    if not router.waiting:
        return None
    routing, meta, obs = router.waiting.popleft()
    return routing, SimpleNamespace(meta=meta, arrays={"obs": obs})


def test_the_server_serves_two_24_row_requests_as_two_batches_of_max_batch_32(monkeypatch):
    monkeypatch.setattr(server_module, "receive", fake_receive)
    server = InferenceServer.__new__(InferenceServer)
    server.config = SimpleNamespace(inference=SimpleNamespace(max_batch=32, max_wait_ms=1.0))
    server.batcher = Batcher(32)
    server.rejects = RejectCounter()
    server.runner = SimpleNamespace(spec=SimpleNamespace(obs_shape=(21,), obs_dtype=np.float32))
    server.router = FakeRouter([request(24, 1), request(24, 2), request(40, 3)])
    assert [r.meta["seq"] for r in server._gather()] == [1]
    assert [r.meta["seq"] for r in server._gather()] == [2], "the held request comes next"
    assert server.rejects.count == 1, "a request larger than max_batch is refused"
    assert server._gather() == []
