"""`python -m bench.startup`: start-up to the first frame and update, and what a JAX
worker's start costs (the package's docstring says how)."""

from __future__ import annotations

import sys

from bench.startup import main

if __name__ == "__main__":
    sys.exit(main())
