"""GPUs a deployment can plan for: memory per GPU, and the speeds the roofline cost model uses.

Capacities: `memory_gb` is the data sheet's per-GPU figure (H100 SXM, H200, HGX/DGX B200 and
HGX/DGX B300). The planner plans with what the device itself reports, `device_mib` (nvidia-smi's
memory.total, what TensorRT-LLM's KV sizing sees), where that is known: the data sheets' "GB" is
not 10^9 bytes for Hopper or B200 (an H200 "141 GB" reports 143,771 MiB = 150.8e9 B, an H100
"80 GB" 81,559 MiB, a B200 "180 GB" 183,359 MiB: 6-7 % more than the decimal reading). Where it is
not known (B300) the data sheet's figure is read as decimal GB, the smaller reading. The planner
subtracts a runtime reserve (CUDA context, activations, CUDA graphs) from either.

Speeds (`trtspec.plan.roofline`) are the data sheets' per-GPU peaks, dense (without 2:4 sparsity):
HBM bandwidth, tensor-core TFLOPS per precision, NVLink bandwidth per GPU. Hopper has no FP4 tensor
cores: FP4 weights run as FP8 there. The B300 row follows NVIDIA's HGX B300 figures (same BF16/FP8
as B200, dense FP4 13.1 PFLOPS); sources disagree on Blackwell Ultra's BF16, so the conservative one
is kept.

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
    memory_gb: float  # the data sheet's GB per GPU
    arch: str
    hbm_tb_s: float  # data-sheet HBM bandwidth, 10^12 bytes/s
    bf16_tflops: float  # dense tensor-core peaks
    fp8_tflops: float
    fp4_tflops: float  # 0: no FP4 tensor cores (FP4 weights run at the FP8 rate)
    nvlink_gb_s: float  # NVLink bandwidth per GPU, GB/s (both directions)
    copy_tb_s: float | None = None  # measured device-to-device copy (read + write), where known
    device_mib: int | None = None  # memory.total the device reports (nvidia-smi), where known

    @property
    def memory_bytes(self) -> int:
        """Bytes of device memory the planner plans with: as the device reports it, else the data
        sheet's GB read as 10^9 bytes."""
        return self.device_mib * 2**20 if self.device_mib else int(self.memory_gb * 1e9)

    def peak_flops(self, bytes_per_param: float) -> float:
        """Tensor-core FLOP/s for weights stored at `bytes_per_param` (2 BF16, 1 FP8, < 1 FP4)."""
        if bytes_per_param < 1 and self.fp4_tflops:
            return self.fp4_tflops * 1e12
        return (self.fp8_tflops if bytes_per_param <= 1 else self.bf16_tflops) * 1e12


# device_mib: nvidia-smi's memory.total, as printed for every H100 80GB HBM3 (81559MiB), H200
# (143771MiB, also on this workplace's H200 machines, /work/.library/device/KINDS.md 2026-10-27) and
# B200 (183359MiB) in public nvidia-smi logs.
GPUS: dict[str, GPU] = {
    "H100": GPU("H100", 80, "Hopper (SM90), SXM 80 GB HBM3", 3.35, 989, 1979, 0, 900, device_mib=81559),
    # copy_tb_s: about 4.3 TB/s, read on this workplace's H200 machines (1 GiB-scale torch copy,
    # 2026-10-28 on gVisor and 2026-11-04 on Firecracker; /work/.library/device/KINDS.md). The data
    # sheet's 4.8 TB/s is the HBM3e peak, which no copy reaches; both are kept, for their own uses.
    "H200": GPU("H200", 141, "Hopper (SM90), 141 GB HBM3e", 4.8, 989, 1979, 0, 900, copy_tb_s=4.3,
                device_mib=143771),
    "B200": GPU("B200", 180, "Blackwell (SM100), 180 GB HBM3e per GPU in HGX/DGX B200", 8.0, 2250, 4500, 9000,
                1800, device_mib=183359),
    "B300": GPU("B300", 288, "Blackwell Ultra (SM103), 288 GB HBM3e", 8.0, 2250, 4500, 13125, 1800),
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
