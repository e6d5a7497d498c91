"""Orbax's arrays in an s3:// bucket, written through tensorstore's s3 driver.

orbax 0.12 builds tensorstore specs for gs:// and local paths only: the arrays of an
s3:// step went to a local directory named `s3:` under the working directory while its
metadata went to the bucket (through epath), and the save failed. `install` wraps orbax's
one builder of key-value store specs so that an s3:// directory gets the s3 driver, at the
endpoint and region of the standard AWS variables
(`srl_jax.config.checkpoint_location.s3_kvstore`); every other directory is orbax's own.
"""

from __future__ import annotations

import os
from typing import Any

from orbax.checkpoint._src.serialization import tensorstore_utils

from srl_jax.config.checkpoint_location import s3_kvstore

_ORBAX_BUILDER = tensorstore_utils.build_kvstore_tspec


def _kvstore_spec(directory: str, name: str | None = None, *, use_ocdbt: bool = True,
                  **options: Any) -> dict[str, Any]:
    """orbax's `build_kvstore_tspec`, with the s3 driver for an s3:// `directory`."""
    directory = os.fspath(directory)
    if not directory.startswith("s3://"):
        return _ORBAX_BUILDER(directory, name, use_ocdbt=use_ocdbt, **options)
    if use_ocdbt:
        raise ValueError(f"{directory}: srl_jax writes s3:// checkpoints without OCDBT")
    return s3_kvstore(directory.rstrip("/") + (f"/{name}" if name else ""))


def install() -> None:
    """Route orbax's s3:// arrays through `_kvstore_spec` (orbax reads the builder from
    its module at every call, its own calls included); idempotent."""
    tensorstore_utils.build_kvstore_tspec = _kvstore_spec
