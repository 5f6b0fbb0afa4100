"""Whether a deployment's K/V slot buffers fit the device, checked before they are allocated.

Each request in flight holds a slot of preallocated K/V buffers as long as its whole context (the
target's `max_position_embeddings` unless `limits.max_input_tokens` bounds it), in the target and
in the drafter: limits.max_concurrency × positions × `kv_bytes_per_position` of both models
(2 · layers · kv heads · head_dim · dtype bytes). Qwen3-8B in bf16 alone takes 144 KiB a position,
so 8 slots of its 40,960 positions take 45 GiB and 32 slots 180 GiB, more than an H200 holds.
Allocating that would end in a CUDA out-of-memory traceback inside the model's start (or, on the
CPU, the kernel's OOM killer), so it is refused first, naming the limits that set it and what
they would need. On a CUDA device with `cuda_graphs`, each graphed model's captured decode steps
keep up to `cuda_graphs.OUTPUT_BUDGET` bytes of output buffers, which the check sets aside too.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from trtspec.errors import ConfigError

log = logging.getLogger(__name__)

MEMINFO = Path("/proc/meminfo")
CGROUP_V2_MEMORY = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current"))
GIB = 1 << 30


def free_bytes(device: torch.device) -> int | None:
    """Memory free for new buffers on `device`: the GPU's free memory, or on the CPU what the
    kernel reports available (MemAvailable) within the cgroup's limit; None when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    free = None
    try:
        for line in MEMINFO.read_text(encoding="utf-8").splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
        limit, used = (p.read_text(encoding="utf-8").strip() for p in CGROUP_V2_MEMORY)
        if limit != "max":
            room = int(limit) - int(used)
            free = room if free is None else min(free, room)
    except (OSError, ValueError):
        log.debug("unreadable memory figures", exc_info=True)
    return free


def check_slot_buffers(per_position: int, device: torch.device, num_slots: int, positions: int,
                       max_input_tokens: int | None, graph_bytes: int = 0) -> None:
    """Refuse, naming `limits.*`, K/V slot buffers (`per_position` bytes a slot position: the
    target's and the drafter's) larger than what `device` has free after `graph_bytes` (the CUDA
    graphs' output buffers)."""
    need, free = num_slots * positions * per_position + graph_bytes, free_bytes(device)
    if free is None or need <= free:
        return
    fits = max(free - graph_bytes, 0) // (num_slots * per_position)
    where = f"limits.max_input_tokens {max_input_tokens} + limits.max_tokens" if max_input_tokens else \
        "the target's max_position_embeddings, as limits.max_input_tokens is unset"
    requests = f"{num_slots} requests (limits.max_concurrency)" if num_slots > 1 else "1 request"
    raise ConfigError(
        f"the K/V buffers (target and drafter) for {requests} of {positions:,} positions each ({where}) "
        f"need {need / GIB:.1f} GiB, {per_position:,} bytes a position"
        + (f" (with {graph_bytes / GIB:.1f} GiB for the CUDA graphs' outputs)" if graph_bytes else "")
        + f", but {device} has {free / GIB:.1f} "
        f"GiB free: set limits.max_input_tokens so that it + limits.max_tokens <= {fits:,}"
        + (" or lower limits.max_concurrency" if num_slots > 1 else "")
        + (" or set cuda_graphs: false on the target and drafter" if graph_bytes else ""))
