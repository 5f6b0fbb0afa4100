"""Sequential Temperature Scaling (STS, from the DSpark paper) of the confidence head.

The scheduler trusts the survival `a_j = ∏_{i≤j} c_i` = P(slots 1..j all accepted). A head
trained on `c*_k = 1 − ½‖p_d − p_t‖₁` is not calibrated for that product, so on held-out data
we fit one temperature per slot, left to right: with T_1..T_{j−1} fixed, T_j is the grid point
minimising the ECE of `a_j` against the observed outcome "slots 1..j accepted". A temperature
divides the logit, `c_j = σ(z_j / T_j)`, T_j > 0: monotone per slot, so rankings within a slot
never change. DeepSpec's released code has no STS; the file format below is trtspec's own.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from pydantic import BaseModel, Field, ValidationError

from trtspec.errors import CheckpointError
from trtspec.files import write_text
from trtspec.strict import first_mistake

STS_FILE = "sts.json"
DEFAULT_GRID = torch.logspace(-2, 1, 121).tolist()  # 0.01 … 10, 1.0 included


class STSCalibration(BaseModel):
    """Per-slot temperatures fitted by `trtspec calibrate`, stored beside the drafter's weights."""

    temperatures: list[float] = Field(description="T_j for draft slot j = 1..γ; c_j = σ(z_j / T_j)")
    mode: str = Field("greedy", description="verification the outcomes were observed under")
    bins: int = Field(10, ge=2, description="equal-width bins of the ECE")
    ece_before: list[float] = Field(default_factory=list, description="held-out ECE of a_j, T = 1")
    ece_after: list[float] = Field(default_factory=list, description="held-out ECE of a_j, fitted T")
    source: str = Field("", description="what the temperatures were fitted on")


def expected_calibration_error(pred: torch.Tensor, outcome: torch.Tensor, bins: int = 10) -> float:
    """Σ_b n_b/N · |mean pred − mean outcome| over equal-width bins.  pred, outcome: [N]"""
    if pred.numel() == 0:
        return 0.0
    idx = (pred.double() * bins).long().clamp(0, bins - 1)
    n = torch.bincount(idx, minlength=bins).double()
    gap = torch.bincount(idx, weights=pred.double() - outcome.double(), minlength=bins)
    return float(gap.abs().sum() / n.sum())


def confidences(logits: torch.Tensor, temperatures: torch.Tensor | None) -> torch.Tensor:
    """c_j = σ(z_j / T_j).  logits [..., k]; temperatures [≥k] or None -> [..., k]"""
    if temperatures is None:
        return torch.sigmoid(logits)
    return torch.sigmoid(logits / temperatures[: logits.shape[-1]].to(logits))


def survival_ece(logits: torch.Tensor, survived: torch.Tensor, temperatures: torch.Tensor | None,
                 bins: int = 10) -> list[float]:
    """ECE of a_j = ∏_{i≤j} c_i per slot.  logits, survived: [N, γ]"""
    surv = confidences(logits, temperatures).cumprod(-1)
    return [expected_calibration_error(surv[:, j], survived[:, j], bins) for j in range(logits.shape[1])]


def fit_sts(logits: torch.Tensor, survived: torch.Tensor, grid: list[float] | None = None,
            bins: int = 10) -> torch.Tensor:
    """Left-to-right 1-D grid search.  logits [N, γ] raw confidence logits; survived [N, γ] bool
    (slots 1..j all accepted) -> temperatures [γ]"""
    grid_t = torch.tensor(grid or DEFAULT_GRID, dtype=torch.float64)
    # break ties towards T = 1 (no change) so flat stretches of the ECE do not move T
    order = torch.argsort((grid_t.log()).abs(), stable=True)
    temps = torch.ones(logits.shape[1], dtype=torch.float64)
    prefix = torch.ones(logits.shape[0], dtype=torch.float64)  # ∏_{i<j} c_i with fitted T_i
    z = logits.double()
    for j in range(logits.shape[1]):
        errors = [expected_calibration_error(prefix * torch.sigmoid(z[:, j] / t), survived[:, j], bins)
                  for t in grid_t[order]]
        temps[j] = grid_t[order][int(torch.tensor(errors).argmin())]
        prefix = prefix * torch.sigmoid(z[:, j] / temps[j])
    return temps.float()


def save_sts(calibration: STSCalibration, drafter_dir: Path) -> Path:
    path = drafter_dir / STS_FILE
    write_text(path, calibration.model_dump_json(indent=1) + "\n")
    return path


def load_sts(drafter_dir: Path, block_size: int) -> torch.Tensor | None:
    """The stored temperatures [γ], or None when the drafter was never calibrated."""
    path = drafter_dir / STS_FILE
    if not path.is_file():
        return None
    try:  # strict: the string "1" or true is no temperature
        calibration = STSCalibration.model_validate(json.loads(path.read_text(encoding="utf-8")), strict=True)
    except ValidationError as exc:  # its first line named no field
        raise CheckpointError(f"{path}: {first_mistake(exc)}; rerun `trtspec calibrate`") from None
    except ValueError as exc:  # no JSON, or not UTF-8
        raise CheckpointError(f"{path}: not a valid STS calibration ({str(exc).splitlines()[0]}); "
                              "rerun `trtspec calibrate`") from None
    temps = calibration.temperatures
    # NaN passed `min(temps) <= 0` (every comparison is false) and made every confidence NaN
    bad = [t for t in temps if not 0 < t < math.inf]
    if bad:
        raise CheckpointError(f"{path}: temperatures must be numbers > 0, got {bad[0]}; rerun "
                              "`trtspec calibrate`")
    if len(temps) != block_size:
        raise CheckpointError(f"{path}: temperatures has {len(temps)} values (all > 0 expected) but "
                              f"block_size is {block_size}; rerun `trtspec calibrate`")
    return torch.tensor(temps)
