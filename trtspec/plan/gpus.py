"""GPUs a deployment can plan for, with their memory and memory bandwidth per GPU.

Capacities are NVIDIA's published per-GPU figures in decimal gigabytes (10^9 bytes), as on the
H100 SXM, H200, HGX/DGX B200 and HGX/DGX B300 data sheets. The planner subtracts a runtime reserve
from them (CUDA context, activations, CUDA graphs), so the exact usable figure need not be known.

Bandwidth: `hbm_tb_s` is the data sheet's HBM figure (10^12 bytes/s); `copy_tb_s` is what a
device-to-device copy reached where one was measured (bytes read + bytes written per second), the
figure a bandwidth floor should use, since no kernel beats a plain copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtspec.errors import ConfigError


@dataclass(frozen=True, slots=True)
class GPU:
    name: str
    memory_gb: float  # decimal GB per GPU
    arch: str
    hbm_tb_s: float  # data-sheet HBM bandwidth, 10^12 bytes/s
    copy_tb_s: float | None = None  # measured device-to-device copy (read + write), where known

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)


GPUS: dict[str, GPU] = {
    "H100": GPU("H100", 80, "Hopper (SM90), SXM 80 GB HBM3", hbm_tb_s=3.35),
    # copy_tb_s: about 4.3 TB/s, read on this workplace's H200 machines (1 GiB-scale torch copy,
    # 2026-10-28 on gVisor and 2026-11-04 on Firecracker; /work/.library/device/KINDS.md)
    "H200": GPU("H200", 141, "Hopper (SM90), 141 GB HBM3e", hbm_tb_s=4.8, copy_tb_s=4.3),
    "B200": GPU("B200", 180, "Blackwell (SM100), 180 GB HBM3e per GPU in HGX/DGX B200", hbm_tb_s=8.0),
    "B300": GPU("B300", 288, "Blackwell Ultra (SM103), 288 GB HBM3e", hbm_tb_s=8.0),
}


def gpu_for_device(device_name: str) -> GPU | None:
    """The table's entry for a CUDA device name such as 'NVIDIA H200', or None."""
    words = device_name.upper().replace("-", " ").split()
    return next((gpu for key, gpu in GPUS.items() if key in words), None)


def get_gpu(name: str) -> GPU:
    try:
        return GPUS[name]
    except KeyError:
        raise ConfigError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}") from None
