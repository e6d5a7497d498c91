#!/usr/bin/env bash
# Run an experiment (default: cartpole_ppo) on the local backend, installing what it needs.
#   ./run.sh                                  # the default experiment
#   ./run.sh cartpole_ppo --set actors.count=4
source "$(dirname "$0")/scripts/ensure_venv.sh" ""
if [ $# -eq 0 ] || [[ "$1" == -* ]]; then set -- cartpole_ppo "$@"; fi
exec "$VENV/bin/python" -m srl_jax.launch "$@"
