"""`trtspec calibrate`: fit STS temperatures of a DSpark drafter on held-out prompts.

Outcomes are observed under GREEDY verification: the target continues every held-out prompt
greedily, and at every anchor a of that continuation the drafter drafts its block exactly as it
does at inference (backbone once, then the Markov head left to right on its own argmax tokens).
Slot j is accepted iff x_1..x_j equal the target's next j tokens — the greedy rule, because the
continuation IS the target's argmax path. Sampled verification would need one target forward
per drafted block (its context leaves the greedy path after a sampled acceptance) and is not
done here.

Prompts are split by parity: temperatures are fitted on the even ones, and the ECE before/after
is reported on the odd ones (and on the fit half), so the reported figure is out of sample.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from trtspec.errors import TrtspecError
from trtspec.models.dspark import DSparkDraftModel, load_dspark
from trtspec.models.target import load_causal_lm
from trtspec.prompts import load_prompts
from trtspec.spec.sts import STSCalibration, fit_sts, save_sts, survival_ece
from trtspec.train.dflash import target_taps
from trtspec.train.dspark import block_forward
from trtspec.train.prompts import check_fits_context, encode_prompts, regenerate

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Outcomes:
    logits: torch.Tensor  # [N, γ] raw confidence logits z_1..z_γ at N anchors
    survived: torch.Tensor  # [N, γ] bool: slots 1..j all accepted (greedy)
    prompt_index: torch.Tensor  # [N] which prompt each anchor came from


@torch.inference_mode()
def greedy_outcomes(model: DSparkDraftModel, seqs: torch.Tensor, lens: torch.Tensor,
                    prompt_lens: torch.Tensor, taps: torch.Tensor, chunk: int = 64) -> Outcomes:
    """Draft at every anchor of every continuation; record confidences and greedy survival."""
    gamma = model.spec.block_size
    logits, survived, owner = [], [], []
    for r in tqdm(range(len(seqs)), desc="draft held-out", unit="seq"):
        first, end = int(prompt_lens[r]) - 1, int(lens[r]) - gamma  # anchors a with a + γ ≤ len − 1
        if end <= first:  # a continuation shorter than one block (an early end of sequence)
            continue
        anchors = torch.arange(first, end)
        for i in range(0, len(anchors), chunk):
            a = anchors[None, i : i + chunk]  # [1, n]
            batch = block_forward(model, seqs[r : r + 1], taps[r : r + 1], a)
            hidden = batch.hidden[0]  # [n, γ, H]
            drafted = model.decode_block(hidden, batch.prev[0, :, 0], lambda _, z: z.argmax(-1))
            accepted = drafted.tokens == batch.labels[0]  # [n, γ]
            logits.append(drafted.confidence_logits)
            survived.append(accepted.int().cumprod(-1).bool())
            owner.append(torch.full((a.shape[1],), r))
    if not logits:
        raise TrtspecError(f"no held-out continuation is longer than its prompt + {gamma} tokens: raise "
                           "--response-tokens")
    return Outcomes(torch.cat(logits), torch.cat(survived), torch.cat(owner))


def calibrate(drafter_dir: Path, target_dir: Path, tasks: list[str], response_tokens: int = 256,
              bins: int = 10) -> STSCalibration:
    """Fit, report and store (`drafter_dir/sts.json`) the STS temperatures."""
    target = load_causal_lm(target_dir)
    model = load_dspark(drafter_dir, target.config)
    if model.confidence_head is None:
        raise TrtspecError(f"{drafter_dir}/config.json: enable_confidence_head is false; "
                           "nothing to calibrate")
    texts: list = [p for task in tasks for p in load_prompts(task)]
    source = Path(f"--tasks {','.join(tasks)}")
    prompts, end_ids = encode_prompts(target_dir, target.config, texts, source)
    check_fits_context(prompts, response_tokens, target.config, source, target_dir)
    seqs, lens = regenerate(target, prompts, response_tokens, end_ids)
    taps = target_taps(target, seqs, model.spec.target_layer_ids)
    out = greedy_outcomes(model, seqs, lens, torch.tensor([len(p) for p in prompts]), taps)
    fit, held = out.prompt_index % 2 == 0, out.prompt_index % 2 == 1
    if not fit.any() or not held.any():
        half = "fitting (even)" if not fit.any() else "held-out (odd)"
        raise TrtspecError(f"no {half} prompt has a continuation longer than {model.spec.block_size} "
                           f"tokens with --response-tokens {response_tokens}: raise --response-tokens")
    temps = fit_sts(out.logits[fit], out.survived[fit], bins=bins)
    before = survival_ece(out.logits[held], out.survived[held], None, bins)
    after = survival_ece(out.logits[held], out.survived[held], temps, bins)
    calibration = STSCalibration(
        temperatures=[round(float(t), 4) for t in temps], mode="greedy", bins=bins,
        ece_before=[round(e, 4) for e in before], ece_after=[round(e, 4) for e in after],
        source=f"tasks {','.join(tasks)}: {len(prompts)} prompts, {len(out.logits)} anchors; "
               f"fit on even prompts ({int(fit.sum())} anchors), ECE on odd ({int(held.sum())})",
    )
    save_sts(calibration, drafter_dir)
    return calibration


def pooled_ece(calibration: STSCalibration) -> tuple[float, float]:
    """Mean over slots of the held-out ECE, before and after."""
    n = max(1, len(calibration.ece_before))
    return sum(calibration.ece_before) / n, sum(calibration.ece_after) / n

