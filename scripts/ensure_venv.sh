# shellcheck shell=bash
# Sourced by run.sh and test.sh with the extras to install ("" or "dev"): make .venv from
# the lock (requirements/base.lock or requirements/dev.lock, hashes checked, installed by uv
# from requirements/installer.lock), then srl_jax itself (editable); reinstall only when
# pyproject.toml or a lock changed.
# Needs Python 3.12+ as $PYTHON, else finds one (python3, python3.1x, pyenv's).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
EXTRAS="${1:-}"
LOCK="$ROOT/requirements/${EXTRAS:-base}.lock"
new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; }
if [ -z "${PYTHON:-}" ]; then  # python3, else a newer one beside it or one pyenv installed
    pyenv_pythons=()
    if command -v pyenv >/dev/null; then
        pyenv_pythons=("$(pyenv root)"/versions/3.1[2-9]*/bin/python3)
    fi
    for candidate in python3 python3.13 python3.12 "${pyenv_pythons[@]}"; do
        if new_enough "$candidate"; then PYTHON="$candidate"; break; fi
    done
    PYTHON="${PYTHON:-python3}"
fi
if ! new_enough "$PYTHON"; then
    echo "srl_jax needs Python 3.12 or newer as '$PYTHON' (set PYTHON=...)" >&2
    exit 1
fi
STAMP="$VENV/.installed-$EXTRAS"
WANT="$(cat "$ROOT/pyproject.toml" "$LOCK" "$ROOT/requirements/installer.lock" |
        "$PYTHON" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    "$PYTHON" "$ROOT/scripts/lockfile.py" check "$ROOT/pyproject.toml" "$LOCK"
    echo "setting up $VENV ..." >&2
    if [ -x "$VENV/bin/python" ] && ! new_enough "$VENV/bin/python"; then
        rm -rf "$VENV"  # made by an older Python, before srl_jax needed 3.12
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        # Debian and Ubuntu ship venv's ensurepip apart, in python3-venv.
        if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
            echo "'$PYTHON -m venv' is missing: install it (Debian/Ubuntu: apt install python3-venv)" >&2
            exit 1
        fi
        "$PYTHON" -m venv "$VENV"
    fi
    # uv installs the lock (pip took 90 s of the suite's 9 minutes on 2 cores, uv 2 s without
    # compiling); uv itself comes by pip from its own lock, hashes checked too.
    "$VENV/bin/python" -m pip install -q --require-hashes -r "$ROOT/requirements/installer.lock" >&2
    uv_install() { "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" "$@" >&2; }
    # run.sh's lean install is compiled to bytecode here, so a run's processes never compile
    # it (not even where PYTHONDONTWRITEBYTECODE is set). test.sh's is not: compiling all of
    # the dev lock's 20,000 files took 24 s of a fresh clone's suite on 2 cores, and the
    # suite writes the bytecode of what it imports as it goes (test.sh).
    compile=()
    if [ -z "$EXTRAS" ]; then compile=(--compile-bytecode); fi
    uv_install --require-hashes ${compile[@]+"${compile[@]}"} -r "$LOCK"
    # The lock holds the build backend, so srl_jax installs with nothing fetched unpinned.
    uv_install --no-deps --no-build-isolation -e "$ROOT"
    echo "$WANT" > "$STAMP"
fi
