#!/usr/bin/env bash
# Lint and run the whole test suite (slow multi-process tests included), installing what it needs.
#   ./test.sh                 # everything, as CI runs it
#   ./test.sh -m "not slow"   # the quick part
source "$(dirname "$0")/scripts/ensure_venv.sh" dev
cd "$ROOT"
"$VENV/bin/ruff" check .
exec "$VENV/bin/python" -m pytest "$@"
