"""Same-host streams through shared memory: slot files, doorbells, and where they live.

Where binder and connecter of the inference, samples or inserts stream run on one host
(they were started by one owner, srl_jax/wire/shm/place.py), messages skip ZeroMQ: the
connecter writes each into a slot of a file in /dev/shm it owns (slot_file.py) and rings
the binder's doorbell, a FIFO that carries only the slot (bell.py); the binder claims
the slot, decodes it with the wire's own checks and, for a request, answers into the
same slot (channels.py). Who lives and who owns what is the kernel's word (locks held
for a life), never a pid's. `transport.shared_memory` (auto, on, off) chooses; the
launcher sizes the run's files against /dev/shm before it starts
(srl_jax/dataflow/shm_budget.py); srl_jax/runtime/shm_attach.py opens them for a worker,
whose stream ends (srl_jax/wire/stream_ends.py) hold them beside its sockets. ZeroMQ stays
between hosts and wherever shared memory is off.
"""
