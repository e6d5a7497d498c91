# shellcheck shell=bash
# Sourced by run.sh and test.sh: make .venv with srl_jax installed (editable) and
# reinstall only when pyproject.toml changed. Needs Python 3.11+ as $PYTHON or python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
EXTRAS="${1:-}"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "srl_jax needs Python 3.11 or newer as '$PYTHON' (set PYTHON=...)" >&2
    exit 1
fi
STAMP="$VENV/.installed-$EXTRAS"
WANT="$("$PYTHON" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())' < "$ROOT/pyproject.toml")"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    echo "setting up $VENV ..." >&2
    if [ ! -x "$VENV/bin/python" ]; then
        # Debian and Ubuntu ship venv's ensurepip apart, in python3-venv.
        if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
            echo "'$PYTHON -m venv' is missing: install it (Debian/Ubuntu: apt install python3-venv)" >&2
            exit 1
        fi
        "$PYTHON" -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2
    "$VENV/bin/python" -m pip install -q -e "$ROOT${EXTRAS:+[$EXTRAS]}" >&2
    echo "$WANT" > "$STAMP"
fi
