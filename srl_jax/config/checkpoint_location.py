"""Where a run's checkpoints live, and what a complete step there looks like; no JAX.

`checkpoint.dir` empty: `<run_dir>/checkpoints/`. Otherwise an absolute path on the
learner's host (it need not exist on the controller's), or a URI of a store orbax
and tensorstore write to: `gs://bucket/run`, `s3://bucket/run`, or `file:///path`
(a local path written as a URI). Every file access to checkpoints goes through
`etils.epath.Path`, orbax's own path type, which reads local paths and buckets alike.

A step is complete when its directory carries its plain step number: on a local
file system orbax writes into a temporary directory and renames it once every file
is on disk. A bucket has no atomic rename, so there orbax writes the step in place
and adds `commit_success.txt` last (its commit-file mode, which
`learners.training.checkpoint` asks for on every bucket): a bucket's step counts only with it.

In an s3:// bucket the arrays go through tensorstore's s3 driver, which reads credentials
from the standard AWS variables but neither the endpoint nor the region: `s3_kvstore`
takes both from the variables the AWS SDKs and s3fs read (AWS_ENDPOINT_URL_S3 or
AWS_ENDPOINT_URL, AWS_REGION or AWS_DEFAULT_REGION), so one environment points both at the
same store. Credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and
AWS_SESSION_TOKEN) where set, else each one's default chain (profile, instance role).

Listings of a bucket are never cached (s3fs and gcsfs would keep a directory's first
listing for the life of the process): other processes add steps to it.

Every step records the checkpoint format it was written in (`FORMAT_KEY` in its `meta`),
and this srl_jax restores only its own `FORMAT`: another format's train state would not
fit the live one, and orbax would fail deep in a tree comparison. A step without one was
written before steps carried it (format 1).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from srl_jax.config.schema import ConfigError

if TYPE_CHECKING:
    from etils import epath

CHECKPOINTS = "checkpoints"
BUCKET_SCHEMES = ("gs", "s3")
"""URI schemes of the stores orbax writes to through tensorstore (and epath reads)."""
SCHEMES = (*BUCKET_SCHEMES, "file")
FILESYSTEMS = {"gs": "gcsfs", "s3": "s3fs"}
"""The fsspec package epath needs for each bucket: orbax lists, creates and deletes steps
through epath (tensorstore writes the arrays on its own)."""
S3_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
"""Where an S3-compatible store other than AWS's is reached, first found first (botocore's
order: the service's own variable, then the general one)."""
S3_REGION_VARIABLES = ("AWS_REGION", "AWS_DEFAULT_REGION")
COMMIT_FILE = "commit_success.txt"
"""What orbax writes last into a step on a bucket (`orbax.checkpoint` atomicity)."""
FORMAT = 3
"""The checkpoint format this srl_jax writes and restores. Raise it, and describe it in
`FORMATS`, whenever what a step holds changes (the train state's tree, the meta's keys)."""
FORMATS = {
    1: "written before checkpoints recorded their format",
    2: "the train state with live hyperparameters, its format recorded",
    3: "MuZero's train state with its target network and L2 optimizer state",
}
FORMAT_KEY = "checkpoint_format"
"""Where a step's `meta` records its format."""


class CheckpointFormatError(ConfigError):
    """A checkpoint in a format this srl_jax does not restore; the message is one line
    naming both formats and what to do."""


def location_problem(directory: str) -> str | None:
    """Why `directory` (`checkpoint.dir`) cannot hold checkpoints, or None if it can."""
    if not directory:
        return None
    if "://" not in directory:
        return None if os.path.isabs(directory) else \
            f"'{directory}' must be an absolute path or a URI ({', '.join(SCHEMES)})"
    parts = urlsplit(directory)
    if parts.scheme not in SCHEMES:
        return f"unknown scheme '{parts.scheme}://' (known: {', '.join(SCHEMES)})"
    if parts.scheme == "file":
        return None if parts.netloc in ("", "localhost") and parts.path.startswith("/") else \
            f"'{directory}' is no local file URI (file:///absolute/path)"
    return None if parts.netloc else f"'{directory}' names no bucket"


def filesystem_problem(directory: str) -> str | None:
    """What this host lacks to read and write `directory`, or None."""
    scheme = urlsplit(directory).scheme if "://" in directory else ""
    package = FILESYSTEMS.get(scheme)
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return f"{scheme}:// needs {package} on every host that reads or writes it: " \
        f"pip install {package}"


def checkpoint_location(run_dir: str | Path, directory: str = "") -> epath.Path:
    """The root of a run's checkpoints: `directory` (`checkpoint.dir`), or
    `<run_dir>/checkpoints` when it is empty; local paths come back absolute."""
    from etils import epath  # 50 ms: only where checkpoints are read or written

    if directory.startswith("file://"):
        directory = urlsplit(directory).path
    if "://" in directory:
        _uncached_listings()
        return epath.Path(directory)
    return epath.Path(os.path.abspath(directory or Path(run_dir) / CHECKPOINTS))


def s3_kvstore(uri: str, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """tensorstore's spec of the key prefix `uri` (s3://bucket/key) in the store that
    `environ`'s AWS variables name; AWS's own S3, where none names an endpoint."""
    parts = urlsplit(uri)
    spec: dict[str, Any] = {"driver": "s3", "bucket": parts.netloc,
                            "path": parts.path.lstrip("/")}
    for key, variables in (("endpoint", S3_ENDPOINT_VARIABLES),
                           ("aws_region", S3_REGION_VARIABLES)):
        if value := next((environ[v] for v in variables if environ.get(v)), ""):
            spec[key] = value
    if environ.get("AWS_ACCESS_KEY_ID"):
        # what the default chain would find first, without its complaints about a
        # missing ~/.aws/config on every open
        spec["aws_credentials"] = {"type": "environment"}
    return spec


def _uncached_listings() -> None:
    """Every bucket file system epath makes from now on lists afresh each time (epath keeps
    the first one it makes for the process: this comes before any bucket's path)."""
    import fsspec.config

    for scheme in BUCKET_SCHEMES:
        fsspec.config.conf.setdefault(scheme, {})["use_listings_cache"] = False


def is_bucket(path: epath.Path | Path) -> bool:
    """Whether `path` is in a bucket (no atomic rename, no hard links) rather than local."""
    return urlsplit(os.fspath(path)).scheme in BUCKET_SCHEMES


def seen_here(location: epath.Path) -> bool:
    """Whether this host can tell what `location` holds: a bucket (given credentials), or
    a local path that exists here. A learner's local directory usually does not exist
    on the controller's host."""
    return is_bucket(location) or location.is_dir()


def steps_in(root: epath.Path | Path) -> list[int]:
    """Complete orbax steps under `root`, oldest first."""
    if not root.is_dir():
        return []
    bucket = is_bucket(root)
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir()
                  and (not bucket or (p / COMMIT_FILE).exists()))


def check_format(meta: dict[str, Any], what: str) -> None:
    """Raise CheckpointFormatError unless `meta` (a step's, which `what` names) is in this
    srl_jax's `FORMAT`; a meta without a format is of format 1."""
    found = meta.get(FORMAT_KEY, 1)
    if found == FORMAT:
        return
    newer = isinstance(found, int) and found > FORMAT
    written = FORMATS.get(found) or ("written by a newer srl_jax" if newer
                                     else "no format this srl_jax knows")
    raise CheckpointFormatError(
        f"{what} is in checkpoint format {found!r} ({written}), but this srl_jax writes and "
        f"restores format {FORMAT} only: start a fresh run (a new run directory and "
        "checkpoint.dir), or use the srl_jax that wrote it")
