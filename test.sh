#!/usr/bin/env bash
# Lint, build the documentation site and run the whole test suite (slow multi-process tests
# and the type check, tests/test_types.py, included), installing what it needs.
#   ./test.sh                 # everything, as CI runs it
#   ./test.sh -m "not slow"   # the quick part
source "$(dirname "$0")/scripts/ensure_venv.sh" dev
cd "$ROOT"
# The dev install is not compiled to bytecode (scripts/ensure_venv.sh): Python writes it as
# modules are first imported, once, where PYTHONDONTWRITEBYTECODE would have every process of
# every test compile them anew.
unset PYTHONDONTWRITEBYTECODE
"$VENV/bin/ruff" check .
# --strict: a broken link or anchor fails; the site goes to build/site/ (ignored by git).
NO_MKDOCS_2_WARNING=1 "$VENV/bin/mkdocs" build --strict
exec "$VENV/bin/python" -m pytest "$@"
