"""How many torch intra-op threads a process (or one served model instance) decodes with.

torch's default is one thread per core it can see. A parallel region ends at a barrier, so when
another process holds one of those cores, every op of the decode step waits for the thread that
is not running: a scheduler time slice (milliseconds) per op instead of microseconds. On the
embedded model (a few MB of weights, hundreds of small ops per token) that made `trtspec generate`
up to 40–60× slower beside one busy process on a 2-core machine (README, `runtime.threads`); one
thread costs 10–25% against two when the machine is otherwise idle.

`threads: auto` (the build config's `runtime.threads`) therefore picks
    min(CPUs this process may use / model instances sharing them, weights / BYTES_PER_THREAD)
and at least 1, where
- CPUs this process may use = its affinity mask (`os.sched_getaffinity`), further capped by a
  cgroup CPU quota when one is set (containers: cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`);
- model instances = the Triton model's instance count on this machine (each instance is its
  own process with its own threads);
- BYTES_PER_THREAD = 1 GiB of weights: below that a layer's matrix products are too short for a
  second thread to pay for its barrier (measured here: a 317M-parameter float32 model ran no faster
  with 2 threads than with 1 on an idle 2-core machine, and 5× slower with a busy neighbour).
An explicit `OMP_NUM_THREADS` in the environment is the operator's choice and wins over `auto`;
`threads: N` wins over both.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

BYTES_PER_THREAD = 1 << 30
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
CGROUP_V2_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def cgroup_cpu_limit(v2_max: Path = CGROUP_V2_MAX, v1_quota: Path = CGROUP_V1_QUOTA,
                     v1_period: Path = CGROUP_V1_PERIOD) -> float | None:
    """CPUs' worth of time the cgroup may use per period (quota / period); None when unlimited."""
    try:
        if v2_max.is_file():
            quota, period = v2_max.read_text(encoding="utf-8").split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        if v1_quota.is_file() and v1_period.is_file():
            quota = int(v1_quota.read_text(encoding="utf-8"))
            return None if quota <= 0 else quota / int(v1_period.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        log.debug("unreadable cgroup CPU limit", exc_info=True)
    return None


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = cgroup_cpu_limit()
    if limit is not None:
        cpus = min(cpus, max(1, math.floor(limit)))
    return max(1, cpus)


def weights_bytes(folders: Iterable[Path]) -> int:
    """Bytes of weight files in the checkpoint folders (not recursive; missing folders count 0)."""
    total = 0
    for folder in folders:
        if Path(folder).is_dir():
            total += sum(f.stat().st_size for f in Path(folder).iterdir()
                         if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES))
    return total


@dataclass(frozen=True, slots=True)
class ThreadChoice:
    threads: int
    reason: str


def choose_threads(setting: str | int, cpus: int, weights: int, instances: int = 1,
                   env_threads: str | None = None) -> ThreadChoice:
    """The policy above, as a pure function of what it depends on."""
    if setting != "auto":
        return ThreadChoice(int(setting), f"runtime.threads: {setting}")
    if env_threads:
        try:
            return ThreadChoice(max(1, int(env_threads)), f"OMP_NUM_THREADS={env_threads}")
        except ValueError:
            log.warning("ignoring OMP_NUM_THREADS=%r: not an integer", env_threads)
    per_instance = max(1, cpus // max(1, instances))
    by_size = max(1, weights // BYTES_PER_THREAD)
    threads = min(per_instance, by_size)
    return ThreadChoice(threads, f"auto: {cpus} usable CPU(s) / {instances} instance(s), "
                                 f"{weights / 2**20:.0f} MiB of weights -> {threads}")


def configure_threads(config, instances: int = 1) -> ThreadChoice:
    """Apply `config.runtime.threads` to torch in this process (call before loading models)."""
    import torch

    folders = [config.target.resolved_path] + ([config.drafter.resolved_path] if config.drafter else [])
    choice = choose_threads(config.runtime.threads, usable_cpus(), weights_bytes(folders), instances,
                            os.environ.get("OMP_NUM_THREADS"))
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    log.info("torch intra-op threads: %s", choice.reason)
    return choice
