"""What a benchmark samples with, and which texts must be equal (`trtspec bench --temperature`).

A benchmark is greedy (temperature 0: every method's text must be the target alone's, `none`'s) or
sampled at one temperature / top-p / top-k, where prompt i samples with seed `seed + i` in every
method and repetition. How a sampled method verifies drafts is its coupling (`SamplingParams.coupling`,
a deployment's `sampling.coupling`):

- `rejection` (Leviathan et al.): lossless in law, but a text depends on the schedule that drew it,
  so no single text can be checked against the target alone's;
- `gumbel` (`trtspec.spec.coupling`): every token is argmax(log p + g(seed, position)), so the text
  must equal, token for token, what the target alone samples with the same seed and coupling. A
  sampled run with a coupled method also runs that reference, `none+gumbel` (the target alone with
  Gumbel-max sampling: timed like any method, so its row shows what the noise costs).

Coupled methods are named `NAME+gumbel`; `none` always samples plainly (torch's multinomial draw),
so every speedup is against the target alone as a server without a drafter runs it.
"""

from __future__ import annotations

from trtspec.config import BuildConfig
from trtspec.spec.sampling import SamplingParams

GREEDY_REFERENCE = "none"
COUPLED_REFERENCE = "none+gumbel"
COUPLED_SUFFIX = "+gumbel"
COUPLINGS = ("rejection", "gumbel")


def with_couplings(configs: dict[str, BuildConfig], sampling: SamplingParams,
                   coupling: str | None = None) -> dict[str, BuildConfig]:
    """The methods of a run: `configs` (method name -> config) each with its coupling — the config's
    `sampling.coupling`, or `coupling` ("rejection", "gumbel", or "both": each config twice) — and
    named NAME+gumbel where that is Gumbel. A greedy run keeps `configs` as they are."""
    if sampling.greedy:
        return dict(configs)
    out: dict[str, BuildConfig] = {}
    for name, cfg in configs.items():
        wanted = COUPLINGS if coupling == "both" else (coupling or cfg.sampling.coupling,)
        for c in wanted:
            copy = cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"coupling": c})})
            out[name + COUPLED_SUFFIX if c == "gumbel" else name] = copy
    return out


def method_couplings(configs: dict[str, BuildConfig], sampling: SamplingParams) -> dict[str, str]:
    """Each method's coupling: `none` samples plainly, a config's method by its `sampling.coupling`,
    and a sampled run with a coupled method adds its reference `none+gumbel` (placed before the
    methods checked against it)."""
    couplings = {"none": "rejection"}
    if not sampling.greedy and any(cfg.sampling.coupling == "gumbel" for cfg in configs.values()):
        couplings[COUPLED_REFERENCE] = "gumbel"
    couplings.update({name: cfg.sampling.coupling for name, cfg in configs.items()})
    return couplings


def request_params(sampling: SamplingParams, index: int, coupling: str) -> SamplingParams:
    """Prompt `index`'s parameters: the run's, seeded `sampling.seed + index` modulo 2^64 (a seed is
    a UINT64; 0 + index without a seed), verified by `coupling`. Greedy stays greedy."""
    if sampling.greedy:
        return sampling
    return sampling.model_copy(update={"seed": ((sampling.seed or 0) + index) % 2**64, "coupling": coupling})


def reference_of(sampling: SamplingParams, coupling: str | None) -> str | None:
    """The method whose texts a method of `coupling` must equal token for token, or None where texts
    cannot be compared (rejection sampling; transformers' reference columns, coupling None)."""
    if sampling.greedy:
        return GREEDY_REFERENCE
    return COUPLED_REFERENCE if coupling == "gumbel" else None


def check_key(sampling: SamplingParams) -> str:
    """The prefix of the results' fields that count a method's texts that differ from its
    reference's: `greedy_mismatches` / `greedy_near_ties`, or `sampled_…` (Gumbel-coupled).
    Near-ties are texts that part only where the target's two best scores are within its rounding
    (`trtspec.spec.near_ties`: bf16/fp16)."""
    return "greedy" if sampling.greedy else "sampled"


def check_fields(key: str | None, mismatches: int, near_ties: int) -> dict:
    """A method's check as results fields (none where its texts are not compared, key None)."""
    return {f"{key}_mismatches": mismatches, f"{key}_near_ties": near_ties} if key else {}


def describe(sampling: SamplingParams) -> str:
    """One phrase for reports: "greedy decoding" or the sampling and its seeds."""
    if sampling.greedy:
        return "greedy decoding"
    cuts = [f"top-p {sampling.top_p:g}"] if sampling.top_p < 1 else []
    cuts += [f"top-k {sampling.top_k}"] if sampling.top_k else []
    return (f"sampling at temperature {sampling.temperature:g}" + "".join(f", {c}" for c in cuts)
            + f", prompt i seeded {sampling.seed or 0} + i in every method")
