"""What one host offers JAX workers, read without importing JAX: nvidia-smi, the TPU device
files, XLA_FLAGS and the launcher's JAX_PLATFORMS / CUDA_VISIBLE_DEVICES
(srl_jax/runtime/placement.py plans the workers onto it)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

FORCED_CPU_DEVICES = re.compile(r"--xla_force_host_platform_device_count=(\d+)")
GPU_PLUGIN = re.compile(r"^jax[-_]cuda\d+[-_]plugin$")


@dataclass(frozen=True)
class HostDevices:
    """What one host offers JAX workers."""

    platform: str = "cpu"
    """'cpu', 'gpu' or 'tpu'."""
    count: int = 1
    """Devices of that platform (on a CPU host: forced host devices, else 1)."""
    name: str = "cpu"
    """What the devices are ('NVIDIA H200', 'TPU', 'cpu')."""
    memory_mib: int = 0
    """Memory of each device (0: not known)."""
    visible: tuple[str, ...] = ()
    """GPUs: what CUDA_VISIBLE_DEVICES names for devices 0..count-1 of this description."""
    note: str = ""
    """Why an accelerator that is present is not used, if one is."""

    def text(self) -> str:
        if self.platform == "cpu":
            forced = f" ({self.count} forced host devices)" if self.count > 1 else ""
            return f"no accelerator: CPU{forced}" + (f"; {self.note}" if self.note else "")
        memory = f", {self.memory_mib} MiB each" if self.memory_mib else ""
        return f"{self.count} x {self.name} ({self.platform}{memory})"



def _gpu_plugin_installed() -> bool:
    return any(GPU_PLUGIN.match((d.metadata["Name"] or "").lower())
               for d in importlib.metadata.distributions())


def _nvidia_gpus() -> list[tuple[str, str, str, int]]:
    """(index, uuid, name, MiB) of each GPU nvidia-smi lists; [] without one."""
    if shutil.which("nvidia-smi") is None:
        devices = len(list(Path("/dev").glob("nvidia[0-9]*")))  # a driver, but no tool
        return [(str(i), "", "NVIDIA GPU", 0) for i in range(devices)]
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20,
            check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_gpu_query(out)


def parse_gpu_query(text: str) -> list[tuple[str, str, str, int]]:
    """nvidia-smi's `--query-gpu=index,uuid,name,memory.total` CSV as (index, uuid, name,
    MiB); lines that do not parse are skipped."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        index, uuid, memory = parts[0], parts[1], parts[-1]
        name = ",".join(parts[2:-1])
        gpus.append((index, uuid, name, int(memory) if memory.isdigit() else 0))
    return gpus


def _visible(gpus: list[tuple[str, str, str, int]], setting: str | None) -> list:
    """The GPUs CUDA_VISIBLE_DEVICES leaves, in its order (CUDA stops at a bad entry)."""
    if setting is None:
        return gpus
    chosen = []
    for entry in (e.strip() for e in setting.split(",")):
        match = [g for g in gpus if entry and (g[0] == entry or g[1].startswith(entry))]
        if not match:
            break
        chosen.append(match[0])
    return chosen


def describe_host(environ: Mapping[str, str] | None = None) -> HostDevices:
    """This host's devices as JAX workers started here would see them, read without
    importing JAX. The launcher's JAX_PLATFORMS=cpu means CPU only; its
    CUDA_VISIBLE_DEVICES, which GPUs count (device ids index that list)."""
    environ = os.environ if environ is None else environ
    match = FORCED_CPU_DEVICES.search(environ.get("XLA_FLAGS", ""))
    cpu = HostDevices(count=int(match.group(1)) if match else 1)
    platforms = environ.get("JAX_PLATFORMS", "").lower()
    if platforms and not re.search(r"cuda|gpu|tpu", platforms):
        return cpu
    chips = sorted(Path("/dev").glob("accel[0-9]*")) or sorted(
        Path("/dev/vfio").glob("[0-9]*"))
    if chips and importlib.util.find_spec("libtpu") is not None:
        return HostDevices("tpu", len(chips), "TPU")
    gpus = _visible(_nvidia_gpus(), environ.get("CUDA_VISIBLE_DEVICES"))
    if not gpus:
        return cpu
    if not _gpu_plugin_installed():
        return HostDevices(count=cpu.count, note=(
            f"{len(gpus)} GPU(s) found but JAX has no CUDA plugin "
            "(pip install 'jax[cuda12]')"))
    return HostDevices("gpu", len(gpus), gpus[0][2], gpus[0][3],
                       tuple(g[1] or g[0] for g in gpus))
