#!/usr/bin/env bash
# Refresh requirements/dev.lock (./test.sh), requirements/base.lock (./run.sh) and
# requirements/cluster.lock (the TPU VM hosts: srl_jax.cluster tpu-vm) from
# pyproject.toml, for Python 3.12+ on every platform, with hashes; and
# requirements/installer.lock, the uv that installs them, pinned below. Pins that still fit
# are kept; `scripts/lock.sh --upgrade` (or --upgrade-package NAME) moves them on.
# Needs uv: $UV, else a pinned copy installed into .tools/uv on first use.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
UV_VERSION="0.13.9"
UV="${UV:-$ROOT/.tools/uv/bin/uv}"
if [ ! -x "$UV" ]; then
    "$PYTHON" -m venv "$ROOT/.tools/uv"
    "$ROOT/.tools/uv/bin/python" -m pip install -q "uv==$UV_VERSION"
fi
cd "$ROOT"
compile() {  # LOCK, then uv options
    local lock="$1"
    shift
    # The build backend is locked too: ensure_venv.sh installs srl_jax without build isolation.
    # --python-version: pyproject.toml's requires-python (else uv takes the running python's).
    "$PYTHON" scripts/lockfile.py build-requires pyproject.toml |
        "$UV" pip compile --quiet --universal --generate-hashes --python-version 3.12 \
            --custom-compile-command scripts/lock.sh --output-file "$lock" \
            pyproject.toml - "$@"
    "$PYTHON" scripts/lockfile.py stamp pyproject.toml "$lock"
}
mkdir -p requirements
compile requirements/dev.lock --extra dev "$@"
# Constrained by the dev lock, so both commands run the same versions of what they share.
compile requirements/base.lock --constraint requirements/dev.lock "$@"
# What `srl_jax.cluster tpu-vm` installs on every TPU host and CPU VM.
compile requirements/cluster.lock --extra cluster --constraint requirements/dev.lock "$@"
# The installer ensure_venv.sh installs the other locks with: this uv, hashes checked.
echo "uv==$UV_VERSION" | "$UV" pip compile --quiet --universal --generate-hashes \
    --python-version 3.12 --custom-compile-command scripts/lock.sh \
    --output-file requirements/installer.lock -
echo "locked: requirements/dev.lock requirements/base.lock requirements/cluster.lock" \
     "requirements/installer.lock" >&2
