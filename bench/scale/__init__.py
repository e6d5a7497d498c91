"""Scaling sweep: a large cluster's dataflow on one machine, and what the overheads imply.

What it measures
----------------
1. **Overheads of the runtime**: `bench.overhead`'s measurements (server CPU
   per inference request, learner CPU per sample, over real sockets without
   policy compute or updates), unless `--skip-overheads`.

2. **Sweep**: the real system (`python -m srl_jax.launch`), with a trivially
   cheap env (`bench.null_env`: a step costs about 2 us), a small network
   and a cheap PPO update, against 1..N inference servers and one learner. One
   launch per server count starts the largest actor count; the actors not
   needed at a point of the sweep are paused (SIGSTOP, resumed with SIGCONT), so
   each point is measured without paying the system's start-up again. Per point,
   after `--warmup` seconds, over `--window` seconds: env frames/s, inference
   requests/s, rows per batch, request latency, sample-stream samples/s, and
   every worker's CPU time from /proc/<pid>/stat, giving CPU us per request on
   the servers, per sample on the learner and per frame on the actors.

With both, it says how many actor cores one server core and one learner's
intake feed.

Run from the repository root::

    .venv/bin/python -m bench.scale            # 2-3 minutes on 2 cores
    .venv/bin/python -m bench.scale --quick    # under a minute

Figures go to stdout and to bench/results/scale.json. Every process this script
starts is stopped by its pid (the launcher, which stops its workers; the child).
"""
