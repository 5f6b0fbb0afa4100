"""Timing device work: median of repetitions after warm-up, eager or as a replayed CUDA graph.

On CUDA each repetition is bracketed by CUDA events (device work is asynchronous, so a host clock
would time the launch, not the work); on the CPU by `time.perf_counter`. A CUDA graph is captured
the way PyTorch's documentation and gpt-fast do it: warm up on a side stream (so lazy
initialisation stays out of the capture), capture one call into `torch.cuda.CUDAGraph`, then time
`graph.replay()`. Inputs must be static buffers the caller refills in place.

Before each timed repetition on CUDA the timer overwrites L2_FLUSH_BYTES of scratch, as
`triton.testing.do_bench` does: a repetition over the same buffers would otherwise read inputs the
last one left in L2 (60 MB on an H200, more than the plugin kernels' inputs at most of the
profile's shapes), and such a time, set against a floor of bytes over HBM bandwidth, comes out
faster than the floor.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

L2_FLUSH_BYTES = 256 << 20  # what triton.testing.do_bench overwrites; an H200's L2 holds 60 MB


@functools.cache
def flush_buffer(device: torch.device, nbytes: int) -> torch.Tensor:
    """The scratch a `DeviceTimer` overwrites before each timed run (one per device and size)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


class Deadline:
    """Seconds left of a time budget; `expired` once it is spent."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    @property
    def expired(self) -> bool:
        return self.left() <= 0


@dataclass(frozen=True, slots=True)
class DeviceTimer:
    """Median milliseconds of a callable on `device` over `reps` runs after `warmup` runs."""

    device: torch.device
    warmup: int = 3
    reps: int = 10
    # bytes overwritten before each timed run; None: L2_FLUSH_BYTES on CUDA, none elsewhere
    flush_bytes: int | None = None

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def flush_size(self) -> int:
        if self.flush_bytes is not None:
            return self.flush_bytes
        return L2_FLUSH_BYTES if self.cuda else 0

    def flush(self) -> None:
        """Overwrite the scratch, then wait for it: the timed run starts with nothing of its inputs
        in the cache and an idle device, as without the flush."""
        if self.flush_size:
            flush_buffer(self.device, self.flush_size).zero_()
            self.sync()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def median_ms(self, fn: Callable[[], object], between: Callable[[], object] | None = None) -> float:
        """`between` runs after each call, outside the timed region (e.g. a cache rewind)."""
        for _ in range(self.warmup):
            fn()
            if between is not None:
                between()
        self.sync()
        times = []
        for _ in range(self.reps):
            self.flush()
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            if between is not None:
                between()
        self.sync()
        return statistics.median(times)

    def capture(self, fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
        """A CUDA graph of one call of `fn` (warmed up on a side stream first)."""
        if not self.cuda:
            raise RuntimeError("CUDA graphs need a CUDA device")
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        self.sync()
        return graph

    def graph_median_ms(self, fn: Callable[[], object]) -> float:
        """Median milliseconds of replaying a CUDA graph of `fn` (the graph is freed afterwards)."""
        graph = self.capture(fn)
        try:
            return self.median_ms(graph.replay)
        finally:
            del graph

    def copy_bandwidth_gbs(self, nbytes: int) -> float:
        """Bytes read plus bytes written per second by a device-to-device copy of `nbytes`, in GB/s."""
        src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=self.device)
        dst = torch.empty_like(src)
        ms = self.median_ms(lambda: dst.copy_(src))
        return 2 * nbytes / (ms * 1e-3) / 1e9
