"""A loaded deployment: tokenizer + target + drafter + verifier, and the decoders over them.

This is what the CLI, the Triton orchestration model and the benchmarks all call, so the text
they produce for one request is produced by the same code: `decoder` serves one request at a time
(`trtspec generate`), `batch_decoder()` up to `limits.max_concurrency` at once (serving), both the
same loop (`trtspec.spec.decoder.SpeculativeDecoder`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trtspec.chat import ChatTemplate, load_chat_template
from trtspec.config import BuildConfig, EngineConfig, ScheduleConfig, TreeConfig
from trtspec.errors import ConfigError
from trtspec.memory import check_slot_buffers
from trtspec.models.checkpoint import building
from trtspec.models.cuda_graphs import OUTPUT_BUDGET, graphs_wanted
from trtspec.models.drafter import Drafter, build_drafter
from trtspec.models.target import TargetModel, load_causal_lm
from trtspec.spec.cost import load_acceptance
from trtspec.spec.decoder import Emitted, SpeculativeDecoder
from trtspec.spec.grammar import Guide, GuideCompiler
from trtspec.spec.metrics import GenerationResult
from trtspec.spec.sampling import SamplingParams
from trtspec.spec.schedule import SPSTable
from trtspec.spec.verify import Verifier
from trtspec.tokenizer import TextTokenizer, end_ids_of, load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from trtspec.engine.target import EngineTarget

log = logging.getLogger(__name__)


def check_device(config: BuildConfig) -> None:
    """Refuse a checkpoint folder that is not there, or a device this machine does not have,
    naming the field, before anything loads."""
    parts = [("target", config.target)] + ([("drafter", config.drafter)] if config.drafter else [])
    for name, part in parts:
        part.check_folder(f"{name}.path")
    for name, part in parts:
        device = torch.device(part.device)
        if device.type != "cuda":
            continue
        if not torch.cuda.is_available():
            raise ConfigError(f"{name}.device is {part.device!r} but this machine has no CUDA GPU "
                              f"(torch {torch.__version__}); use `device: cpu`")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{name}.device is {part.device!r} but this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s)")
    if config.drafter is not None and config.drafter.device != config.target.device:
        raise ConfigError(f"drafter.device {config.drafter.device!r} differs from target.device "
                          f"{config.target.device!r}; both run in the same decode loop")


@dataclass
class Pipeline:
    config: BuildConfig
    tokenizer: TextTokenizer
    target: TargetModel | EngineTarget
    drafter: Drafter
    # the ids that end a request: the tokenizer's end of sequence and generation_config.json's
    end_ids: tuple[int, ...]
    verifier: Verifier = field(default_factory=Verifier)

    @property
    def capacity(self) -> int:
        """Positions one request may use: the target's, or the config's limits when set."""
        return self.config.limits.capacity(self.target.max_positions)

    @functools.cached_property
    def cost_table(self) -> SPSTable | None:
        """The machine's cost model: the config's `schedule.sps_table`, else measured once and cached."""
        drafter_config = self.config.drafter
        drafts = drafter_config is not None and self.drafter.num_draft_tokens
        if not drafts and self.config.lookup is None:  # prompt lookup prices its drafts with it too
            return None
        if drafter_config is not None and drafter_config.resolved_sps_table is not None:
            return SPSTable.load(drafter_config.resolved_sps_table)
        return _cached_cost_table(self)

    def check_buffers(self, max_slots: int) -> None:
        """Refuse, naming the limits, K/V slot buffers for `max_slots` requests (and the CUDA graphs'
        outputs) that the target's device cannot hold (`trtspec.memory`), before anything is allocated;
        and limits that leave no room in the target's positions."""
        self.config.limits.check_positions(self.target.max_positions, "the target's context")
        if isinstance(self.target, TargetModel):
            per_position = self.target.kv_bytes_per_position + self.drafter.kv_bytes_per_position
            graphed = self.target.cuda_graphs + self.drafter.cuda_graphs  # models with graphs' outputs
            check_slot_buffers(per_position, self.target.device, max_slots, self.capacity,
                               self.config.limits.max_input_tokens, graphed * OUTPUT_BUDGET)

    def decoder_for(self, max_slots: int, schedule: ScheduleConfig | None = None, use_drafter: bool = True,
                    cost_table: SPSTable | None = None,
                    tree: TreeConfig | None | str = "config",
                    prefix_reuse: bool | None = None) -> SpeculativeDecoder:
        """A decoder over this pipeline's models with its own slots (`schedule`: the config's;
        `cost_table`: this pipeline's measured one; `tree`: the config's `drafter.tree`, or a tree
        config, or None for chains; `prefix_reuse`: the config's `limits.prefix_reuse`, or on/off)."""
        self.check_buffers(max_slots)
        drafter = self.drafter if use_drafter else None
        lookup = self.config.lookup if use_drafter else None
        if schedule is None:  # prompt lookup alone: adaptive, its copies priced by the cost model
            schedule = self.config.drafter.schedule if self.config.drafter else \
                ScheduleConfig(mode="adaptive" if lookup else "full")
        needs_table = drafter is not None and drafter.num_draft_tokens and schedule.mode not in ("full",
                                                                                                "threshold")
        prior = None
        if drafter is not None and self.config.drafter is not None:
            prior = load_acceptance(self.config.drafter.resolved_path)
        if tree == "config":
            tree = self.config.drafter.tree if self.config.drafter else None
        lookup = lookup if tree is None else None  # its drafts are chains
        if (needs_table or (lookup is not None and schedule.mode == "adaptive")) and cost_table is None:
            cost_table = self.cost_table
        return SpeculativeDecoder(self.target, drafter, self.end_ids, self.verifier, schedule,
                                  cost_table, max_slots, self.capacity, prior,
                                  self.config.limits.max_input_tokens, tree,
                                  prefill_chunk=self.config.limits.prefill_chunk or None,
                                  prefix_reuse=self.config.limits.prefix_reuse if prefix_reuse is None
                                  else prefix_reuse,
                                  lookup=lookup)

    @functools.cached_property
    def decoder(self) -> SpeculativeDecoder:
        """One request at a time, with the config's schedule."""
        return self.decoder_for(1)

    def batch_decoder(self) -> SpeculativeDecoder:
        """Continuous batching: up to `limits.max_concurrency` requests per step."""
        return self.decoder_for(self.config.limits.max_concurrency)

    @functools.cached_property
    def guides(self) -> GuideCompiler:
        """Compiles a request's guide (`spec.grammar`) for this target's tokenizer."""
        return GuideCompiler(self.tokenizer, self.target.vocab_size, self.end_ids)

    def generate(
        self, prompt: str, max_tokens: int, sampling: SamplingParams | None = None, guide: Guide | None = None
    ) -> tuple[str, GenerationResult]:
        """Continue `prompt` (`guide`: what the new text must match)."""
        from trtspec.triton.request import TextStream, context_of

        if not prompt:
            raise ValueError("prompt is empty: give some text to continue")
        limit = self.config.limits.max_tokens
        if not 1 <= max_tokens <= limit:
            raise ValueError(f"max_tokens must be in [1, {limit}], got {max_tokens}")
        compiled = None if guide is None else self.guides.compile(guide)
        ids = self.tokenizer.encode(prompt)
        result = self.decoder.generate(ids, max_tokens, sampling, guide=compiled)
        # its text as a server streams it: decoded after the prompt's last ids
        text = TextStream(self.tokenizer.decode, end_ids=self.decoder.end_ids,
                          context=context_of(self.tokenizer.decode, ids))
        text.push(result.token_ids)
        return text.text, result

    @functools.cached_property
    def chat_template(self) -> ChatTemplate | None:
        return load_chat_template(self.config.target.resolved_path, self.target.config, self.tokenizer)

    def chat(self, messages: list[dict], max_tokens: int, sampling: SamplingParams | None = None,
             guide: Guide | None = None, **variables) -> tuple[str, GenerationResult]:
        """Answer a conversation as the OpenAI frontend does: rendered by the target's chat template
        (with `variables`), ended by an end id or the template's stop sequence (not returned)."""
        from trtspec.openai.stops import StopTrimmer
        from trtspec.triton.request import TextStream, context_of

        if self.chat_template is None:
            raise ConfigError(f"{self.config.target.resolved_path} has no chat template: send text instead")
        prompt = self.chat_template.render(messages, **variables)
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)  # the template wrote its specials
        stream = TextStream(self.tokenizer.decode, self.chat_template.stop, self.decoder.end_ids,
                            context=context_of(self.tokenizer.decode, ids))

        def stop_at_the_turns_end(emitted: Emitted) -> bool:
            stream.push(emitted.ids)
            return stream.stopped

        compiled = None if guide is None else self.guides.compile(guide)
        result = self.decoder.generate(ids, max_tokens, sampling, on_tokens=stop_at_the_turns_end,
                                       guide=compiled)
        return StopTrimmer(list(self.chat_template.stop)).push(stream.text, final=True), result


def check_served_files(config: BuildConfig) -> None:
    """Read now what a served model reads when it loads, so that `build` and `bench` refuse it by
    name (the server failed to load it after 25 s): the drafter's schedule.sps_table and the
    acceptance.json beside its weights."""
    if config.drafter is None:
        return
    if config.drafter.resolved_sps_table is not None:
        try:
            SPSTable.load(config.drafter.resolved_sps_table)
        except ConfigError as exc:
            raise ConfigError(f"drafter.schedule.sps_table: {exc}") from None
    if config.drafter.resolved_path.is_dir():
        load_acceptance(config.drafter.resolved_path)


def cost_table_path(config: BuildConfig) -> Path:
    """Where the cost model measured for `config` is cached: keyed by the models' weights and how
    they run, not by where their folders are (a build copies them) nor by how the schedule or a tree
    reads the table (`profile_cost` measures neither)."""
    from trtspec.bench.profile import cost_key
    from trtspec.export.bundle import cache_root, content_key

    models = content_key(config, True, ignore=("path", "schedule", "tree"))
    key = cost_key({"models": models, "flavour": config.flavour,
                    "slots": config.limits.max_concurrency, "device": config.target.device,
                    # 4: the drafter's catch-up; 3: the loop's own time; 2: the R × t verify grid,
                    # drafts timed after a commit
                    "table_format": 4,
                    # prompt lookup's drafts: the grid reaches them
                    **({"lookup_len": config.lookup.num_draft_tokens} if config.lookup else {})})
    return cache_root() / "cost" / f"{key}.json"


def _cached_cost_table(pipeline: Pipeline) -> SPSTable:
    """`profile_cost` of this pipeline, measured on first use and kept in the cache folder."""
    from trtspec.bench.profile import profile_cost

    config = pipeline.config
    path = cost_table_path(config)
    if path.is_file():
        try:
            return SPSTable.load(path)
        except ConfigError:
            log.warning("%s is not a readable cost table; measuring again", path)
    log.warning("measuring this machine's cost model for adaptive speculation (once; cached in %s)", path)
    table = profile_cost(pipeline.target, pipeline.drafter, reps=3, max_batch=config.limits.max_concurrency,
                         progress=False, verify_len=config.lookup.num_draft_tokens if config.lookup else 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table.model_dump(), indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return table


def load_pipeline(config: BuildConfig, use_drafter: bool = True, model: PreTrainedModel | None = None,
                  ) -> Pipeline:
    """Load the config's target (and drafter and prompt lookup unless `use_drafter` is False):
    flavour torch in torch; flavour engine over onnxruntime sessions of the exported graphs
    (`trtspec.engine.load`).
    `model`: flavour torch, the config's target already loaded (another pipeline's
    `target.model`), shared instead of loaded again; each pipeline keeps its own slots and taps."""
    check_device(config)
    if not use_drafter:  # the target alone: no drafter, no prompt lookup
        config = config.model_copy(update={"lookup": None})
    if config.flavour == "engine":
        return _load_engine_pipeline(config, use_drafter)
    if config.flavour != "torch":
        raise ConfigError(
            f"flavour {config.flavour!r} runs under TensorRT-LLM (its build's deploy/launch.sh), not in this "
            "command; use `flavour: torch` or `engine` (generate: --flavour torch)"
        )
    drafter_config = config.drafter if use_drafter else None
    with building(config.target.resolved_path / "config.json", "the target"):
        if model is None:
            model = load_causal_lm(config.target.resolved_path, config.target.dtype, config.target.device)
        tokenizer = load_tokenizer(config.target.resolved_path, model.config)
        end_ids = end_ids_of(config.target.resolved_path, tokenizer, model.config.vocab_size)
    # the drafter decides which target layers to tap, so build a bare target first
    drafter_file = drafter_config.resolved_path / "config.json" if drafter_config else None
    with building(drafter_file, "the drafter") if drafter_file else contextlib.nullcontext():
        drafter = build_drafter(drafter_config, TargetModel(model))
    verifier = Verifier()
    if config.test_only is not None and config.test_only.biased_acceptance:
        from trtspec.spec.biased_verify import BiasedVerifier

        log.warning("config %r: test_only.biased_acceptance, sampling is deliberately biased", config.name)
        verifier = BiasedVerifier()
    graphs = graphs_wanted(config.target.cuda_graphs, model.device)
    return Pipeline(config, tokenizer, TargetModel(model, drafter.tap_layer_ids, graphs), drafter, end_ids,
                    verifier)


def _load_engine_pipeline(config: BuildConfig, use_drafter: bool) -> Pipeline:
    from transformers import AutoConfig

    from trtspec.engine.load import load_engine_models

    engine = config.engine or EngineConfig()
    target, drafter, verifier = load_engine_models(config, use_drafter, folder=engine.resolved_folder,
                                                   backend=engine.backend)
    hf_config = AutoConfig.from_pretrained(config.target.resolved_path, local_files_only=True)
    tokenizer = load_tokenizer(config.target.resolved_path, hf_config)
    end_ids = end_ids_of(config.target.resolved_path, tokenizer, hf_config.vocab_size)
    return Pipeline(config, tokenizer, target, drafter, end_ids, verifier)
