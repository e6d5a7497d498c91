"""Overhead microbenchmark: the runtime's CPU per inference request and per sample.

The figures that bound scale on a real cluster, measured with the runtime's
own code over real loopback TCP sockets between this process and one child
process (spawned, and stopped by its pid):

- *per inference request*: this process plays the actors: DEALER sockets send
  `infer_request` messages (`srl_jax.wire.streams.send`, the real wire encoding)
  of `--envs` rows and read the replies (`streams.receive`). The child runs a
  real `InferenceServer`, built by its constructor and its `setup`, whose
  policy runner acts with zeros instead of the jitted network (its
  `runner_factory`), so what is left is the runtime's work: gathering,
  batching, padding, replying. Measured: the server process's CPU time per
  request (its ZMQ I/O thread included) with 8 requests in flight, the actor
  side's CPU per request, and the wall round trip with one request in flight
  (max_batch = one request, so the server never waits for more).
- *per sample*: this process plays an actor: it fills trajectory chunks with
  the actor's `ChunkBuilder` (T x n steps, the real chunk layout) and pushes
  them on the sample stream (`streams.send`, blocking like
  `actors.send_policy=block`). The child runs the learner's intake (receive,
  decode, check against the chunk layout, sample queue, batch assembly,
  `put_batch` onto the device) without an update. Measured: CPU per sample
  (one env step) on each side, and per chunk.

Both for CartPole's observation (float32 [4]) and for Atari-sized frames
(uint8 [84, 84, 4]), given to the server and the learner by the env they are
configured with (`bench.null_env` with that observation).

Run from the repository root::

    .venv/bin/python -m bench.overhead             # about 20 s
    .venv/bin/python -m bench.overhead --seconds 0.3

It prints the figures; `python -m bench.scale` runs the same measurements before its
sweep and writes them to bench/results/scale.json.
"""
