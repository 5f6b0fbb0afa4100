"""What the frontend knows of the served model without loading its weights: name, tokenizer (to
count tokens and check lengths), chat template, context length, the deployment's limit, and the
sampling parameters the checkpoint's generation_config.json recommends (a request that leaves
`temperature`, `top_p` or `top_k` out gets them, as vLLM's default `--generation-config auto`
does)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.chat import ChatTemplate, load_chat_template
from trtspec.config import MAX_REQUEST_BYTES, BuildConfig, load_build_config
from trtspec.errors import ConfigError
from trtspec.models.checkpoint import read_sampling_defaults
from trtspec.triton.repo import BUILD_CONFIG_FILE, VERSION

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ServedModel:
    name: str  # the Triton model's
    tokenizer: object  # trtspec.tokenizer.TextTokenizer
    chat: ChatTemplate | None
    context_length: int  # prompt + generated tokens a request may use (the decoder's capacity)
    max_tokens: int  # the deployment's limits.max_tokens
    vocab_size: int  # the target's: token ids in prompts lie under it
    sampling_defaults: dict = field(default_factory=dict)  # generation_config.json's temperature, top_p, …
    max_input_tokens: int | None = None  # the deployment's limits.max_input_tokens (None: the context's)
    tool_parser: str | None = None  # the tool-call parser of tool_choice "auto" (None: auto is refused)
    reasoning_parser: str | None = None  # reads reasoning_content off chat answers (None: all is content)
    max_request_bytes: int = MAX_REQUEST_BYTES  # the deployment's limits.max_request_bytes
    compact_json: bool = False  # structured outputs' JSON written compactly (serve --compact-json)
    served_names: tuple[str, ...] = ()  # the names the API answers to, the first in its answers
    #                                     (serve --served-model-name; none: the Triton model's)
    max_held: int | None = None  # requests the deployment holds at once, decoding or waiting
    #                               (limits.max_concurrency + max_queued per instance; None: no bound)

    @property
    def api_names(self) -> tuple[str, ...]:
        """The names a request's `model` may give; the first is the one answers carry."""
        return self.served_names or (self.name,)

    @property
    def api_name(self) -> str:
        """The name answers carry."""
        return self.api_names[0]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens)

    def special_token(self, name: str) -> str | None:
        """The text of the tokenizer's `eos` / `bos` / `pad` token (None: it has none, or no text
        form, as the byte-level models' specials)."""
        hf = getattr(self.tokenizer, "hf", None)
        return None if hf is None else getattr(hf, f"{name}_token", None)


def served_model(config: BuildConfig) -> ServedModel:
    from transformers import AutoConfig

    from trtspec.tokenizer import load_tokenizer

    target_dir = config.target.resolved_path
    hf_config = AutoConfig.from_pretrained(target_dir, local_files_only=True)
    tokenizer = load_tokenizer(target_dir, hf_config)
    chat = load_chat_template(target_dir, hf_config, tokenizer)
    if chat is None:
        log.warning("%s has no chat template: /v1/chat/completions will refuse requests", target_dir)
    # as the decoder bounds a request: the target's positions, or max_input_tokens + max_tokens
    context = config.limits.capacity(int(getattr(hf_config, "max_position_embeddings", 0) or 1 << 20))
    defaults = read_sampling_defaults(target_dir)
    if defaults:
        log.info("requests without them sample with %s/generation_config.json's %s", target_dir,
                 ", ".join(f"{k} {v}" for k, v in defaults.items()))
    limits = config.limits
    held = None if limits.max_queued is None else \
        (limits.max_concurrency + limits.max_queued) * max(1, len(config.gpus))  # an instance per GPU
    return ServedModel(config.name, tokenizer, chat, context, limits.max_tokens,
                       int(hf_config.vocab_size), defaults, limits.max_input_tokens,
                       max_request_bytes=limits.max_request_bytes, max_held=held)


def served_model_of_repo(repo: Path, tool_parser: str | None = None, reasoning_parser: str | None = None,
                         compact_json: bool = False, served_names: tuple[str, ...] = ()) -> ServedModel:
    """The one trtspec model of a generated Triton model repository; `tool_parser`,
    `reasoning_parser`, `compact_json` and `served_names`: the server's --tool-call-parser,
    --reasoning-parser, --compact-json and --served-model-name."""
    found = sorted(repo.glob(f"*/{VERSION}/{BUILD_CONFIG_FILE}"))
    if len(found) != 1:
        raise ConfigError(f"{repo}: the OpenAI frontend serves one trtspec model (a `{BUILD_CONFIG_FILE}` "
                          f"under <model>/{VERSION}/), found {len(found)}")
    model = served_model(load_build_config(found[0]))
    model.tool_parser, model.reasoning_parser = tool_parser, reasoning_parser
    model.compact_json, model.served_names = compact_json, served_names
    check_parser_markers(model, repo)
    return model


def check_parser_markers(model: ServedModel, where: Path) -> None:
    """A ConfigError when the served text cannot show the tags the server's parsers read (a
    tokenizer whose `<think>` or `<tool_call>` is a special token, skipped in decoding)."""
    from trtspec.openai.reasoning import THINK_CLOSE, THINK_OPEN, lost_markers
    from trtspec.openai.tools import BLOCK_PARSERS, HERMES_CLOSE, HERMES_OPEN

    wanted = {}
    if model.reasoning_parser is not None:
        wanted[f"--reasoning-parser {model.reasoning_parser}"] = (THINK_OPEN, THINK_CLOSE)
    if model.tool_parser in BLOCK_PARSERS:
        wanted[f"--tool-call-parser {model.tool_parser}"] = (HERMES_OPEN, HERMES_CLOSE)
    for flag, markers in wanted.items():
        lost = lost_markers(model.tokenizer, markers)
        if lost:
            raise ConfigError(f"{where}: the target's tokenizer drops {lost[0]!r} from decoded text (a "
                              "special token; served text skips special tokens), so "
                              f"{flag} would never see it")
