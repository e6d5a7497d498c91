"""`python -m srl_jax.cluster`: the launch scripts for Slurm and TPU VMs (cli.py)."""

import sys

from srl_jax.cluster.cli import main

sys.exit(main())
