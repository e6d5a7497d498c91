"""Learner update throughput: samples per second through the compiled update.

What it measures
----------------
For each case, one (network, device count) pair, it builds the update exactly
as the learner worker does (`learners/learner_worker.py`): the algorithm's
optimizer and `make_update`, `make_learner_mesh(devices, B)`, the train state
put replicated on the mesh, `compile_update` on an example batch shaped by
`chunk_layout`, and batches turned into the update's input by `to_batch` and
`put_batch`. It then feeds it random host batches the way the learner does:
the update is dispatched, the *next* batch is put onto the mesh while it runs
(prefetch), then the metrics are fetched, which waits for the update.

Cases:

- ``mlp``: the default experiment (``configs/cartpole_ppo.yaml``): the
  actor-critic MLP from `learners/models/networks.py`, obs float32 [4], 2 discrete
  actions, PPO with its settings (T=32, B=32, 4 epochs x 4 minibatches).
- ``cnn``: the learner's Nature-CNN (Mnih et al. 2015; `network.kind: nature_cnn`)
  on 84x84x4 uint8 frames with 6 discrete actions, through the same PPO
  update. Its batch and epochs default smaller (T=32, B=8, 1 epoch x 2
  minibatches of 128) so that the four cases finish in minutes on 2 CPU
  cores; the table says what was used.

With ``network.conv: xla`` the CNN update is slow on XLA:CPU: PPO's update runs
its gradient steps inside `lax.scan` (epochs, minibatches), XLA:CPU's
`ConvCanonicalization` pass only visits the entry computation, so the backward
convolutions in those loop bodies run on the naive loop emitter, and even
unrolled, the 3x3 layer's gradients take most of the update. ``auto`` therefore
computes the convolutions as matmuls on a CPU (`learners/models/conv.py`).

``--levers`` runs the CNN case on one device with each ``network.conv`` and,
in Sample Factory's venv (`bench.peers.sample_factory`), the same network,
PPO loss and minibatches in torch (`bench.peers.torch_cnn`), and prints each
figure as a ratio to torch's; it writes ``bench/results/learner_cnn.json``,
from which `python -m bench.report` makes the README's table.

Each runs on 1 device and on 4 devices. The 4-device case uses forced host CPU
devices (``--xla_force_host_platform_device_count``), which must be set before
JAX is imported, so the parent runs every case in a fresh subprocess
(``python -m bench.learner --case NAME --devices N``) and collects the one JSON line each child
prints. On a machine with 2 cores, 4 forced devices share the same 2 cores: the
figure shows the cost of the sharded program (collectives, the all-gather of
the shuffle) rather than a speed-up.

Per case, after ``--warmup`` updates, ``--repeats`` times:

1. **pipelined**: ``--updates`` updates fed as above, each with a new host
   batch (to_batch + put_batch included). ``samples/s`` is ``T*B`` / (wall time
   per update); ``ms/upd`` is the wall time per update. Per update the time is
   split into ``put`` (to_batch + put_batch of the next batch, on the learner's
   thread), ``dispatch`` and ``wait`` (blocked until the metrics are back):
   ``outside = 1 - (dispatch + wait) / total`` is the share of wall time the
   loop spends outside the compiled update, i.e. putting batches.
2. **bare**: the same number of updates on one batch already on the mesh, no
   puts: the compiled update alone. ``feed = 1 - bare / pipelined`` is what
   feeding new batches costs in throughput (it can be ~0 when the put fully
   overlaps the update, and on a small CPU machine the put and the update
   compete for the same cores).

Figures are medians over the repeats. ``cpu`` is the child's CPU time over its
wall time in the timed loops (2.0 = both cores of a 2-core machine busy): far
below nproc while the machine's load average is high means other processes
took cores and the figures are low.

Why
---
The learner must keep up with the actors: with samples/s of the update known,
``actors * envs`` frames per second that one learner can consume follows, and
``outside`` / ``feed`` tell whether the host->device feed or the update itself
is the limit. The 1- vs 4-device figures check that the data-parallel mesh
path costs little when it cannot gain (on CPU) and show its scaling where it
can (on real devices).

Run from the repository root::

    .venv/bin/python -m bench.learner            # all 4 cases
    .venv/bin/python -m bench.learner --quick    # smoke run, a few seconds a case
    .venv/bin/python -m bench.learner --cases cnn --devices 1 --cnn-batch-envs 8
    .venv/bin/python -m bench.learner --levers   # CNN: XLA's vs matmul convs vs torch
"""
