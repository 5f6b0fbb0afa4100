"""GPUs a deployment can plan for, with their memory per GPU.

Capacities are NVIDIA's published per-GPU figures in decimal gigabytes (10^9 bytes), as on the
H100 SXM, H200, HGX/DGX B200 and HGX/DGX B300 data sheets. The planner subtracts a runtime reserve
from them (CUDA context, activations, CUDA graphs), so the exact usable figure need not be known.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtspec.errors import ConfigError


@dataclass(frozen=True, slots=True)
class GPU:
    name: str
    memory_gb: float  # decimal GB per GPU
    arch: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)


GPUS: dict[str, GPU] = {
    "H100": GPU("H100", 80, "Hopper (SM90), SXM 80 GB HBM3"),
    "H200": GPU("H200", 141, "Hopper (SM90), 141 GB HBM3e"),
    "B200": GPU("B200", 180, "Blackwell (SM100), 180 GB HBM3e per GPU in HGX/DGX B200"),
    "B300": GPU("B300", 288, "Blackwell Ultra (SM103), 288 GB HBM3e"),
}


def get_gpu(name: str) -> GPU:
    try:
        return GPUS[name]
    except KeyError:
        raise ConfigError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}") from None
