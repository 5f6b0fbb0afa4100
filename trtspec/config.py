"""Build configs: pydantic models read from `build_configs/*.yaml`.

A path written `builtin:NAME` names a model shipped in `trtspec/assets/NAME`; any other relative
path is resolved against the directory of the YAML file that holds it. A bad field fails at load
with its dotted path and what was expected.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from trtspec.errors import ConfigError
from trtspec.files import too_long
from trtspec.plan.deployment import DeploymentConfig
from trtspec.spec.lookup import POOL_KEY
from trtspec.strict import MAX_SHOWN, StrictModel, message, shown

ASSETS_DIR = Path(__file__).parent / "assets"
BUILTIN_PREFIX = "builtin:"

Method = Literal["dflash", "dspark", "eagle3", "draft_model"]
Flavour = Literal["torch", "engine", "trtllm"]
MAX_GPU_ID = 1023  # a GPU id past it is a typo (Triton's instance group takes int32 ids; torch parses fewer)
DType = Literal["float32", "bfloat16", "float16"]


class _Strict(StrictModel):
    """A section of the build config: unknown keys and booleans for numbers refused."""


# a Triton model folder, an OpenAI model id and (flavour trtllm) Kubernetes object names are made of it
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
# Kubernetes Service names are RFC 1035 labels; `<name>-serve-config` must stay a valid object name too
K8S_NAME_PATTERN = r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?"
MAX_THREADS = 1024  # torch/OpenMP cannot start 20,000 threads here: the process dies (SIGSEGV)
# most positions a request may use: 16 Mi, beyond every published context window (10 M, Llama 4 Scout);
# `max_tokens: 1e12` loaded, built and was only refused request by request
MAX_CONTEXT = 1 << 24
MAX_REQUEST_BYTES = 32 * 2**20  # limits.max_request_bytes' default


def _short_enough(path: str) -> str:
    """A path field's value, or a ValueError when the file system would refuse it as too long."""
    if why := too_long(path):
        raise ValueError(f"the path {why}")
    return path


PathText = Annotated[str, AfterValidator(_short_enough)]  # a path as written in the YAML


def _beside_yaml(base: Path, path: str) -> Path:
    """`path` as written in a YAML file in `base`: ~ expanded, relative paths taken from `base`."""
    resolved = Path(path).expanduser()
    return resolved if resolved.is_absolute() else base / resolved


class _HasPath(_Strict):
    path: PathText = Field(description="checkpoint directory, `builtin:NAME` or relative to the YAML")
    dtype: DType = Field("float32", description="weights' dtype at run time")
    device: str = Field("cpu", description="where the model and every tensor of the decode loop live: "
                                           "cpu, cuda or cuda:N")
    cuda_graphs: bool = Field(True, description="on a CUDA device, replay this model's decode steps (the "
                                                "target's verify steps, chains and draft trees; a "
                                                "drafter's block forwards and context projections, "
                                                "chain and tree steps) as CUDA "
                                                "graphs, one per padded shape (batch bucket, fed tokens, "
                                                "context bucket, trees or not), captured on first use; "
                                                "prefills, trees of over 64 nodes and a failed capture "
                                                "run eagerly. "
                                                "Ignored on cpu. Flavour trtllm: the target's sets "
                                                "TensorRT-LLM's cuda_graph_config (null when false)")
    _base: Path = PrivateAttr(default=Path("."))

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        match = re.fullmatch(r"cpu|cuda(:(\d+))?", value)
        if not match or (match[2] and int(match[2]) > MAX_GPU_ID):
            raise ValueError(f"expected cpu, cuda or cuda:N (N in [0, {MAX_GPU_ID}]), got {shown(value)}")
        return value

    @property
    def resolved_path(self) -> Path:
        if self.path.startswith(BUILTIN_PREFIX):
            return ASSETS_DIR / self.path[len(BUILTIN_PREFIX) :]
        return _beside_yaml(self._base, self.path)

    def check_folder(self, field: str) -> Path:
        """`resolved_path`, or a ConfigError naming `field` (`target.path`) when it is no folder."""
        path = self.resolved_path
        if path.is_dir():
            return path
        if self.path.startswith(BUILTIN_PREFIX):
            shipped = sorted(p.name for p in ASSETS_DIR.iterdir() if (p / "config.json").is_file())
            raise ConfigError(f"{field} {self.path!r} names no shipped model; builtin: takes one of "
                              f"{', '.join(shipped)}")
        what = "is a file, not a checkpoint folder" if path.exists() else "does not exist"
        relative = not Path(self.path).expanduser().is_absolute()
        where = " (a relative path starts at the YAML's folder)" if relative else ""
        raise ConfigError(f"{field} {self.path!r} is {path}{where}, which {what}")


class TargetConfig(_HasPath):
    """The target model p."""


class ScheduleConfig(_Strict):
    """How many of each request's draft tokens one target forward verifies (`spec.schedule`)."""

    mode: Literal["adaptive", "full", "scheduler", "threshold", "argmax"] = Field(
        "adaptive",
        description="adaptive = each step picks the draft length k ≥ 0 for the running batch from the "
                    "measured cost model and each request's running acceptance (k = 0: plain decoding), "
                    "then DSpark's Algorithm 1 cuts each block when the drafter has confidences; full = "
                    "whole blocks; scheduler = DSpark Algorithm 1 over full blocks; threshold = slots "
                    "whose survival ≥ `threshold`; argmax is biased, kept only to demonstrate why "
                    "Algorithm 1 stops early")
    threshold: float = Field(0.5, ge=0, le=1, description="survival cut of the threshold mode")
    min_gain: float = Field(
        0.1, ge=0, le=1, description="adaptive: draft only when the cost model predicts at least this "
                                     "much more tokens/s than plain decoding (a margin for its error)")
    probe_every: int = Field(
        8, ge=0, le=4096,
        description="adaptive: after this many steps without drafting, draft one short probe for the whole "
                    "batch so the acceptance estimates learn what the workload now accepts (the interval "
                    "doubles after each probe that does not switch drafting on, up to 32×); 0 = never probe")
    sps_table: PathText | None = Field(
        None, description="`trtspec profile` output (target steps/s per verify batch, drafter seconds per "
                          "batch and draft length), relative to the YAML; unset = measured on first use "
                          "and cached")


class TreeConfig(_Strict):
    """Draft trees (`trtspec.spec.tree`): several candidates per position, verified in one target
    forward; absent = a chain."""

    nodes: int = Field(
        ge=1, le=256,
        description="N: draft nodes per request and step (the root, the last verified token, not "
                    "counted). Size it for the machine: `trtspec profile` prints the budget whose "
                    "verification costs about a chain's (`trtspec.spec.cost.tree_budget`)")
    topk: int = Field(8, ge=1, le=32, description="K: children tried per expanded node and nodes expanded "
                                                  "per depth (EAGLE-2's dynamic tree)")
    depth: int | None = Field(
        None, ge=1, le=64,
        description="deepest draft node; default the drafter's num_draft_tokens (DFlash B − 1, DSpark γ, "
                    "the chain length of EAGLE-3 and draft models)")


class DrafterConfig(_HasPath):
    """The drafter q and how many tokens it proposes per cycle."""

    method: Method = Field(description="drafting algorithm")
    num_draft_tokens: int | None = Field(
        None, ge=1, le=64,
        description="k: draft tokens per cycle; default 5 for draft models, block size − 1 for DFlash",
    )
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig,
                                     description="verification schedule for concurrent requests")
    tree: TreeConfig | None = Field(None, description="draft a token tree per request and step instead of "
                                                      "a chain; absent = chain")

    @model_validator(mode="after")
    def _tree_schedule(self) -> DrafterConfig:
        if self.tree is not None and self.schedule.mode not in ("adaptive", "full"):
            raise ValueError(f"drafter.tree works with schedule.mode adaptive or full, not "
                             f"{self.schedule.mode!r} (the confidence cuts apply to chains)")
        return self

    @property
    def resolved_sps_table(self) -> Path | None:
        sps_table = self.schedule.sps_table
        return None if sps_table is None else _beside_yaml(self._base, sps_table)


class LookupConfig(_Strict):
    """Prompt lookup (`trtspec.spec.lookup`): drafts copied from the request's own tokens where they
    ended as they end now, verified as any draft. With no drafter it is n-gram speculation (vLLM's
    `ngram`, TensorRT-LLM's NGram); beside a drafter, a request drafts from its tokens in the steps
    where they match at least `min_match` of its last tokens, and from the drafter in the others."""

    num_draft_tokens: int = Field(8, ge=1, le=64, description="most tokens one step copies per request")
    min_match: int = Field(
        1, ge=1, le=64,
        description="fewest of the request's last tokens an earlier place must repeat to be copied from; "
                    "beside a drafter, set it high enough that a match beats the drafter's block (a byte-"
                    "level model repeats short runs everywhere)")
    max_match: int = Field(8, ge=1, le=64, description="most of the request's last tokens compared: of "
                                                       "several places, the one repeating the most is "
                                                       "copied from")
    pool_tokens: int = Field(
        0, ge=0, le=1 << 22,
        description="finished requests' tokens (prompt + answer, newest kept) every request may also copy "
                    "from where they repeat more of its last tokens than its own do (at least 3): a shared "
                    "n-gram pool, TensorRT-LLM's is_public_pool; 0 = each request copies from its own tokens "
                    "only. Shared between requests (a request's speed can hint that another's text resembled "
                    "it, as a shared prefix cache's can): a request's cache_salt limits it to requests sent "
                    "with the same salt")

    @model_validator(mode="after")
    def _ordered(self) -> LookupConfig:
        if self.min_match > self.max_match:
            raise ValueError(f"lookup.min_match {self.min_match} exceeds lookup.max_match {self.max_match}")
        if self.pool_tokens and self.max_match < POOL_KEY:
            raise ValueError(f"lookup.pool_tokens: a pool place repeats at least {POOL_KEY} tokens, above "
                             f"lookup.max_match {self.max_match}; raise max_match or set pool_tokens 0")
        return self


class EngineConfig(_Strict):
    """Where the engine flavour's graphs come from and what runs them."""

    folder: PathText | None = Field(
        None, description="a `trtspec build --flavour engine` output (relative to the YAML); "
                          "unset = export into the cache ($TRTSPEC_CACHE_DIR) on first use")
    backend: Literal["auto", "onnxruntime", "tensorrt"] = Field(
        "auto", description="auto = TensorRT when the folder has engines and TensorRT is installed, "
                            "else onnxruntime")
    _base: Path = PrivateAttr(default=Path("."))

    @property
    def resolved_folder(self) -> Path | None:
        """The folder, its `..` taken (a served build's YAML names its build `../../..`, which every
        error about a graph of it spelled out: `…/model_repository/trtspec/1/../../../target.onnx`)."""
        return None if self.folder is None else _beside_yaml(self._base, self.folder).resolve()


class GenerationLimits(_Strict):
    """Bounds a deployment enforces on every request."""

    max_tokens: int = Field(2048, ge=1, le=MAX_CONTEXT,
                            description="largest `max_tokens` a request may ask for; below the target's "
                                        "positions (a request's prompt needs one at least)")
    max_input_tokens: int | None = Field(
        None, ge=1, le=MAX_CONTEXT,
        description="longest prompt in tokens, below the target's positions; unset = what the target's "
                    "positions leave after `max_tokens` (a request's prompt + max_tokens must fit them)")
    max_concurrency: int = Field(
        8, ge=1, le=256,
        description="requests one served model instance decodes together (continuous batching: one "
                    "packed target forward per step for all of them); more wait in its queue")
    max_queued: int | None = Field(
        None, ge=0, le=1_000_000,
        description="requests one served model instance lets wait for a decoder slot beyond the "
                    "max_concurrency it decodes: one more is refused at once as busy (to Triton's clients an "
                    "error that begins 'the server is busy'; the OpenAI API's 503 server_error with "
                    "Retry-After, Anthropic's overloaded_error) so that "
                    "a client or load balancer retries later or elsewhere instead of waiting without "
                    "bound; 0 = none wait; unset = no bound (vLLM's default). Not for flavour trtllm")
    prefill_chunk: int = Field(
        512, ge=0, le=MAX_CONTEXT,
        description="prompt tokens one decode step prefills at most, over all new requests (chunked "
                    "prefill): a longer prompt is fed over several steps while the running requests "
                    "keep decoding in each; 0 = every new prompt whole in the step it joins. Flavour "
                    "trtllm: > 0 turns enable_chunked_prefill on, and TensorRT-LLM sizes the chunks by "
                    "deployment.max_num_tokens (trtspec/trtllm/args.py)")
    stream_interval: int = Field(
        1, ge=1, le=1024,
        description="decode steps per streamed response: a streaming request gets one response with the "
                    "new text of every `stream_interval` steps (its first step's at once, what is left "
                    "with its last), so a server under load sends fewer responses, each a crossing from "
                    "the model to Triton and a message to the client, at the cost of burstier text; 1 = "
                    "a response per step. Flavour trtllm: TensorRT-LLM's stream_interval")
    max_request_bytes: int = Field(
        MAX_REQUEST_BYTES, ge=1024, le=2**31,
        description="largest request body the OpenAI frontend takes, in bytes: a larger one is a 413 before "
                    "it is read whole (a long-context prompt is a few bytes a token as text, about 7 as "
                    "token ids; 32 MiB holds a million tokens)")
    prefix_reuse: bool = Field(
        True, description="a new request keeps the K/V (and drafter state) a finished request left in "
                          "its slot for the prompt tokens they share (16 at least), and prefills only the "
                          "rest (automatic prefix caching: a chat's next turn, a shared system prompt); "
                          "false = every prompt prefilled whole. Flavour engine keeps none (its cache "
                          "compacts freed positions away; true is refused there). Flavour trtllm: "
                          "TensorRT-LLM's kv_cache_config.enable_block_reuse, so it must agree with "
                          "deployment.enable_block_reuse")

    def check_positions(self, positions: int, where: str) -> None:
        """Refuse limits that no request could reach in `positions` (`where` names them: the target's
        max_position_embeddings, deployment.max_seq_len): each of max_tokens and max_input_tokens
        must leave one position at least for the other part of a request. Only values the config
        sets: the default max_tokens (2048) is capped per request by a smaller target's context."""
        for name in ("max_tokens", "max_input_tokens"):
            value = getattr(self, name)
            if name in self.model_fields_set and value is not None and value >= positions:
                raise ConfigError(f"limits.{name} {value} leaves no room in {where} of {positions} positions "
                                  "(a request's prompt + max_tokens must fit them): "
                                  f"expected [1, {positions - 1}]")

    def capacity(self, positions: int) -> int:
        """Positions one request may use (prompt + generated): the target's `positions`, or
        max_input_tokens + max_tokens when that is fewer."""
        if self.max_input_tokens is None:
            return positions
        return min(positions, self.max_input_tokens + self.max_tokens)


class RuntimeConfig(_Strict):
    """How the process that decodes uses this machine (`trtspec.runtime`)."""

    threads: Literal["auto"] | int = Field(
        "auto", description="torch intra-op threads per model instance: auto = the CPUs this process "
                            "may use (affinity, cgroup quota) split over the served instances, at most "
                            f"one per GiB of weights, unless OMP_NUM_THREADS is set; or a number in "
                            f"[1, {MAX_THREADS}]")

    @field_validator("threads", mode="before")
    @classmethod
    def _auto_or_positive(cls, value):
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool)
                               and 1 <= value <= MAX_THREADS):
            return value
        raise ValueError(f"expected 'auto' or an integer in [1, {MAX_THREADS}]")


class SamplingConfig(_Strict):
    """How the deployment samples the requests it serves with temperature > 0."""

    coupling: Literal["rejection", "gumbel"] = Field(
        "rejection",
        description="rejection = Leviathan et al.'s rule: the highest acceptance, and the text's law is the "
                    "target's, but a seed repeats a text only under the same schedule; gumbel = every "
                    "sampled token is argmax(log p + g(seed, position)) (`trtspec.spec.coupling`): the "
                    "text is token for token what the target alone samples with that seed, whatever the "
                    "batch, schedule, drafter or tree (acceptance at least (1 − TV)/(1 + TV) per draft "
                    "instead of 1 − TV)")


class TestOnlyConfig(_Strict):
    """Deliberate faults that let the test suite check its own checks. Never set in a deployment."""

    biased_acceptance: bool = Field(
        False, description="TEST ONLY: verify sampled drafts with the biased rule of "
                           "`trtspec.spec.biased_verify` (acceptance min(1, p/2q)): the output is NOT the "
                           "target's distribution; `trtspec verify` must fail such a server")
    fail_on_max_tokens: int | None = Field(
        None, ge=1, description="TEST ONLY: a served step with a request of this max_tokens raises, as a "
                                "step that fails for a reason of the model's own would (the served model "
                                "must answer every running request with its error, log why and serve on)")


class BuildConfig(_Strict):
    """One deployment recipe: which target, which drafter, where it runs."""

    name: str = Field(
        "trtspec", description="deployment (and served model) name: the Triton model's folder, so letters, "
                               "digits, '_', '.' and '-', starting with a letter or digit, at most 64; "
                               "flavour trtllm: also the Kubernetes objects' name, so lowercase letters, "
                               "digits and '-', starting with a letter")
    flavour: Flavour = Field("torch", description="runtime: torch, engine (TensorRT) or trtllm")
    target: TargetConfig
    drafter: DrafterConfig | None = Field(None, description="omit for autoregressive decoding (or prompt "
                                                            "lookup alone, with `lookup`)")
    lookup: LookupConfig | None = Field(
        None, description="draft from each request's own tokens (prompt lookup), alone or beside the "
                          "drafter; absent = off")
    limits: GenerationLimits = Field(default_factory=GenerationLimits)
    engine: EngineConfig | None = Field(None, description="graphs and backend of flavour engine")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig,
                                   description="threads of the decoding process")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig,
                                     description="how requests with temperature > 0 are sampled and verified")
    gpus: list[int] = Field(
        default_factory=list,
        description="GPU ids of a Triton node: one orchestrator instance on each; empty = one CPU instance",
    )
    deployment: DeploymentConfig | None = Field(
        None, description="GPUs, parallelism and KV policy for planning and TensorRT-LLM artifacts")
    test_only: TestOnlyConfig | None = Field(
        None, description="TEST ONLY: deliberate faults (flavour torch) for testing `trtspec verify`")

    @model_validator(mode="after")
    def _coupling_flavour(self) -> BuildConfig:
        if self.sampling.coupling == "gumbel" and self.flavour == "trtllm":
            raise ValueError("sampling.coupling gumbel needs flavour torch or engine: TensorRT-LLM verifies "
                             "sampled drafts with its own rejection sampler")
        return self

    @model_validator(mode="after")
    def _lookup_with_chains(self) -> BuildConfig:
        if self.lookup is not None and self.drafter is not None and self.drafter.tree is not None:
            raise ValueError("lookup drafts chains, and drafter.tree verifies trees: remove one of them")
        return self

    @model_validator(mode="after")
    def _lookup_in_trtllm(self) -> BuildConfig:
        if self.lookup is None or self.flavour != "trtllm":
            return self
        if self.drafter is not None:  # TensorRT-LLM's suffix-automaton enhancer (sa_config)
            if self.drafter.method != "eagle3":
                raise ValueError(f"lookup beside a {self.drafter.method} drafter needs flavour torch or "
                                 "engine: TensorRT-LLM copies beside a drafter only for EAGLE-3 (and MTP), "
                                 "by Eagle3DecodingConfig.sa_config; remove lookup or use an eagle3 drafter")
            return self
        if self.lookup.min_match != 1:
            raise ValueError(f"lookup.min_match {self.lookup.min_match}: TensorRT-LLM's NGram drafter "
                             "matches down to one token and has no such field; set it to 1 for flavour "
                             "trtllm")
        return self

    @model_validator(mode="after")
    def _drafter_is_the_deployments(self) -> BuildConfig:
        """drafter.method agrees with the method of deployment.drafter_id (found fuzzing: an eagle3
        config over a DFlash drafter_id was written as decoding_type Eagle3 and planned as EAGLE-3)."""
        from trtspec.plan.models import DRAFTER_METHODS

        drafter_id = self.deployment and self.deployment.drafter_id
        method = DRAFTER_METHODS.get(drafter_id or "")
        if self.drafter is not None and method is not None and self.drafter.method != method:
            raise ValueError(f"drafter.method {self.drafter.method} but deployment.drafter_id {drafter_id} "
                             f"is a {method} drafter: make them agree")
        return self

    @model_validator(mode="after")
    def _drafter_in_trtllm(self) -> BuildConfig:
        """What flavour trtllm cannot write is refused, not dropped (found fuzzing build configs)."""
        if self.drafter is None or self.flavour != "trtllm":
            return self
        if self.drafter.tree is not None:
            raise ValueError("drafter.tree: flavour trtllm writes draft chains only; remove drafter.tree, "
                             "or build flavour torch or engine")
        mode = self.drafter.schedule.mode
        if mode not in ("adaptive", "full"):
            raise ValueError(f"drafter.schedule.mode {mode}: flavour trtllm verifies TensorRT-LLM's "
                             "draft_len_schedule (adaptive: planned from the cost model) or whole drafts "
                             "(full); set one of them, or build flavour torch or engine")
        return self

    @model_validator(mode="after")
    def _queue_bound_in_trtllm(self) -> BuildConfig:
        if self.flavour == "trtllm" and self.limits.max_queued is not None:
            raise ValueError(f"limits.max_queued {self.limits.max_queued}: trtspec's served model bounds its "
                             "queue, and flavour trtllm serves TensorRT-LLM's, for which trtspec writes no "
                             "such bound; remove it, or bound requests in front of the server")
        return self

    @model_validator(mode="after")
    def _kubernetes_name(self) -> BuildConfig:
        if self.flavour == "trtllm" and not re.fullmatch(K8S_NAME_PATTERN, self.name):
            raise ValueError(f"name {self.name!r}: flavour trtllm names its Kubernetes Service after it, "
                             "which takes lowercase letters, digits and '-', starting with a letter and "
                             "ending with a letter or digit")
        return self

    @model_validator(mode="after")
    def _one_reuse_switch(self) -> BuildConfig:
        if self.deployment is not None and self.limits.prefix_reuse != self.deployment.enable_block_reuse \
                and "prefix_reuse" in self.limits.model_fields_set \
                and "enable_block_reuse" in self.deployment.model_fields_set:
            dep = self.deployment
            on, block = (str(v).lower() for v in (self.limits.prefix_reuse, dep.enable_block_reuse))
            raise ValueError(f"limits.prefix_reuse {on} contradicts deployment.enable_block_reuse {block}: "
                             "both say whether a prompt's prefix is reused; set them alike, or only one")
        return self

    @model_validator(mode="after")
    def _no_reuse_asked_of_the_engine(self) -> BuildConfig:
        asked = "prefix_reuse" in self.limits.model_fields_set and self.limits.prefix_reuse
        if self.flavour == "engine" and asked:  # (the served config leaves it out: `served_build_config`)
            raise ValueError("limits.prefix_reuse true: flavour engine keeps no prefix for a next request "
                             "(its cache compacts freed positions away); remove it, set it false, or serve "
                             "flavour torch for prefix caching")
        return self

    @model_validator(mode="after")
    def _test_only_in_torch(self) -> BuildConfig:
        if self.test_only is not None and self.test_only.biased_acceptance and self.flavour != "torch":
            raise ValueError(f"test_only.biased_acceptance is for flavour torch only, not {self.flavour!r}")
        return self

    @field_validator("name")
    @classmethod
    def _folder_name(cls, value: str) -> str:
        if not re.fullmatch(NAME_PATTERN, value):
            raise ValueError("expected letters, digits, '_', '.' and '-', starting with a letter or digit, "
                             f"at most 64 (the Triton model's folder), got {shown(value)}")
        return value

    @field_validator("gpus")
    @classmethod
    def _distinct_gpus(cls, value: list[int]) -> list[int]:
        if any(not 0 <= g <= MAX_GPU_ID for g in value) or len(set(value)) != len(value):
            raise ValueError(f"GPU ids must be distinct and in [0, {MAX_GPU_ID}], got {value}")
        return value


def method_name(config: BuildConfig) -> str:
    """How a config drafts, as bench names it: its drafter's method, `lookup` (prompt lookup alone;
    `lookup-pool` with a pool), `<method>-lookup[-pool]` (both), or `none`."""
    lookup = "" if config.lookup is None else "lookup-pool" if config.lookup.pool_tokens else "lookup"
    if config.drafter is None:
        return lookup or "none"
    return "-".join(filter(None, (config.drafter.method, lookup)))


def with_flavour(config: BuildConfig, flavour: str) -> BuildConfig:
    """`config` run as `flavour` (`generate`/`build --flavour`), held to the checks across fields
    the YAML would be (a plain copy built a gumbel-coupled config for TensorRT-LLM)."""
    copy = config.model_copy(update={"flavour": flavour})
    try:  # the fields the YAML set, as set: a check of what a YAML asks for sees the same request
        BuildConfig.model_validate(copy.model_dump(exclude_unset=True))
    except ValidationError as exc:
        raise ConfigError("; ".join(message(e) for e in exc.errors())) from None
    return copy


MAX_MISTAKES = 20  # mistakes an error lists
# characters of one mistake's message: room for the longest advice a check gives (about 220) around
# a value quoted to MAX_SHOWN; only a message quoting its input whole is cut
MAX_MESSAGE = 3 * MAX_SHOWN


def _format_error(path: Path, exc: ValidationError) -> str:
    """Every mistake, one per line: `field `a.b`: what was expected, got X` (at most MAX_MISTAKES)."""
    lines = []
    errors = exc.errors()
    for err in errors[:MAX_MISTAKES]:
        field = ".".join(str(p)[:MAX_SHOWN] for p in err["loc"]) or "(top level)"
        got, msg = err.get("input"), message(err)
        said = isinstance(got, dict) or msg.endswith(f"got {shown(got)}")  # a validator named it
        msg = msg if len(msg) <= MAX_MESSAGE else msg[:MAX_MESSAGE] + "…"
        lines.append(f"field `{field}`: {msg}" + ("" if said else f", got {shown(got)}"))
    if len(errors) > MAX_MISTAKES:
        lines.append(f"... and {len(errors) - MAX_MISTAKES} more")
    if len(lines) == 1:
        return f"{path}: {lines[0]}"
    return f"{path}: {len(errors)} mistakes:\n" + "\n".join(f"  {line}" for line in lines)


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error: PyYAML keeps the
    last one silently, so a second `drafter:` section would replace the first unseen."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice (first at line {seen[key]})", key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        except TypeError:  # an unhashable key: construct_mapping says so
            continue
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)
# YAML 1.1's base-60 numbers are strings here, as in YAML 1.2 (`max_tokens: 1:30` was read as 90):
# PyYAML's int and float resolvers less their `:` alternatives
_INT = r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"
_FLOAT = (r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
          r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _NUMBER_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(_INT), list("-+0123456789"))
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_FLOAT), list("-+0123456789."))


def load_build_config(path: str | Path) -> BuildConfig:
    """Read and validate a YAML build config; relative model paths resolve against its folder."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder; give a YAML build config")
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not path.is_file():  # /dev/null, a fifo: a read would be empty or never end
        raise ConfigError(f"config file {path} is not a regular file; give a YAML build config")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None)
        raise ConfigError(f"{path}: not valid YAML{where}" + (f": {problem}" if problem else "")) from None
    except (ValueError, RecursionError) as exc:  # an int past 4,300 digits; nesting past Python's stack
        raise ConfigError(f"{path}: not a config trtspec reads ({type(exc).__name__}: "
                          f"{str(exc)[:MAX_SHOWN]})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of fields at the top level")
    try:
        config = BuildConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_error(path, exc)) from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deep for a config") from None
    for part in (config.target, config.drafter, config.engine):
        if part is not None:
            part._base = path.parent
    return config
