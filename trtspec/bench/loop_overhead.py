"""What one draft–verify cycle costs outside the two forwards: the loop's own overhead.

Measured on the shipped tiny model through the real decode loop (`decoder.generate`): the decode
time of a request minus the time spent inside the target's forward and the drafter's proposal,
over the number of cycles. What is left is verification, rewind, tensor bookkeeping and Python,
which a real-size forward does not change (the verify step on a real vocabulary is timed apart,
as the `confidence_verify` rows of `trtspec profile --synthetic`).

Everything that knows the loop's surfaces (how a pipeline is put on a device, which methods are
the forwards) is in this module.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

TINY_CONFIG = Path(__file__).parents[2] / "build_configs" / "tiny-dflash.yaml"


def tiny_pipeline(device: torch.device, use_drafter: bool = True, cuda_graphs: bool = True,
                  dtype: str = "float32", schedule: str | None = None):
    """The shipped tiny target with its DFlash drafter (or alone), every tensor of the loop on
    `device` (the config's target.device / drafter.device), `cuda_graphs` and `dtype` (both
    models'); `schedule` a drafter.schedule.mode other than the config's (adaptive)."""
    from trtspec.config import load_build_config
    from trtspec.pipeline import load_pipeline

    config = load_build_config(TINY_CONFIG)
    placed = {"device": str(device), "cuda_graphs": cuda_graphs, "dtype": dtype}
    drafter = config.drafter.model_copy(update=placed)
    if schedule is not None:
        mode = drafter.schedule.model_copy(update={"mode": schedule})
        drafter = drafter.model_copy(update={"schedule": mode})
    config = config.model_copy(update={"target": config.target.model_copy(update=placed), "drafter": drafter})
    return load_pipeline(config, use_drafter=use_drafter)


def timed_calls(fn, spent: list[float], device: torch.device | str):
    """`fn` wrapped to append the seconds of each call (the device synchronised around it) to `spent`."""
    device = torch.device(device)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        spent.append(time.perf_counter() - t0)
        return out

    return wrapper


def measure_loop_overhead(device: torch.device, prompts: int = 2, max_tokens: int = 48) -> dict:
    """Per-cycle milliseconds of the decode loop outside the target forward and the drafter's
    proposal, on `device`; falls back to the CPU (saying why) where the loop cannot run there."""
    from trtspec.prompts import load_prompts

    try:
        return _measure(device, load_prompts("code")[:prompts], max_tokens)
    except Exception as exc:  # the core may not run on this device yet: measure where it does
        if device.type == "cpu":
            raise
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        log.warning("decode loop failed on %s (%s); measuring its overhead on the CPU", device, reason)
        result = _measure(torch.device("cpu"), load_prompts("code")[:prompts], max_tokens)
        result["note"] = f"measured on the CPU: the decode loop failed on {device} ({reason})"
        return result


def _measure(device: torch.device, prompts: list[str], max_tokens: int) -> dict:
    from trtspec.config import ScheduleConfig

    spec = tiny_pipeline(device)
    decoder = spec.decoder_for(1, ScheduleConfig(mode="full"))  # whole blocks: one cycle per step
    forward_s: list[float] = []
    propose_s: list[float] = []
    decoder.target.forward = timed_calls(decoder.target.forward, forward_s, device)
    decoder.drafter.propose = timed_calls(decoder.drafter.propose, propose_s, device)

    def decode(text: str) -> tuple[float, float, int]:
        """-> seconds outside the forwards and proposals, seconds of the whole decode, cycles."""
        forward_s.clear()
        propose_s.clear()
        result = decoder.generate(spec.tokenizer.encode(text), max_tokens)
        # forward_s[0] is the prefill, which is not part of result.decode_s
        outside = result.decode_s - sum(forward_s[1:]) - sum(propose_s)
        return outside, result.decode_s, result.num_target_calls - 1

    decode(prompts[0])  # warm-up, not counted
    outside_s, decode_s, cycles = 0.0, 0.0, 0
    for text in prompts:
        o, d, c = decode(text)
        outside_s, decode_s, cycles = outside_s + o, decode_s + d, cycles + c
    per_cycle = 1e3 / max(1, cycles)
    return {"per_cycle_ms": outside_s * per_cycle, "cycle_ms": decode_s * per_cycle, "cycles": cycles,
            "device": str(device), "model": "tiny-dflash (shipped)",
            "note": "decode time minus target forwards and drafter proposals"}
