"""Chat templates: a conversation rendered as the prompt text the target was trained on.

- A Hugging Face checkpoint whose tokenizer carries a `chat_template`: the tokenizer's own
  `apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`.
- A trtspec byte-level model: `chat_template.jinja` beside its weights, rendered by the same
  transformers function (`render_jinja_template`), with the stop sequences its config lists under
  `trtspec_chat_stop` (where its training text starts the next turn). See docs/EMBEDDED_MODEL.md.
- Neither: no chat endpoint for this model (`/v1/chat/completions` answers 400; completions work).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trtspec.errors import CheckpointError
from trtspec.train.corpus import CHAT_TEMPLATE_FILE

Messages = list[dict]


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    # (messages, extra template variables) -> prompt text ending where the assistant answers
    render: Callable[..., str]
    stop: tuple[str, ...]  # added to every chat request's stop sequences
    source: str  # where the template came from, for logs and errors
    text: str | None = None  # the Jinja template itself (vLLM's /tokenizer_info shows it)


def _byte_model_template(target_dir: Path, hf_config) -> ChatTemplate | None:
    path = target_dir / CHAT_TEMPLATE_FILE
    if not path.is_file():
        return None
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        template = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    check_parses(template, str(path))

    def render(messages: Messages, **variables) -> str:
        rendered, _ = render_jinja_template([messages], chat_template=template, add_generation_prompt=True,
                                            **variables)
        return rendered[0]

    stop = getattr(hf_config, "trtspec_chat_stop", None) or ()
    if not isinstance(stop, (list, tuple)) or not all(isinstance(text, str) and text for text in stop):
        raise CheckpointError(f"{target_dir / 'config.json'}: trtspec_chat_stop must be a list of texts that "
                              f"end a chat answer, got {stop!r}")
    stop = tuple(stop)
    return ChatTemplate(render, stop, str(path), template)


def _tokenizer_template(target_dir: Path, tokenizer) -> ChatTemplate | None:
    if not getattr(tokenizer, "chat_template", None):
        return None
    # a dict: named templates, as transformers keeps them; true was a TypeError traceback at the first chat
    if not isinstance(tokenizer.chat_template, str | dict):
        raise CheckpointError(f"{target_dir / 'tokenizer_config.json'}: chat_template must be a Jinja "
                              f"template text, got {tokenizer.chat_template!r}")

    def render(messages: Messages, **variables) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **variables)

    text = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    if text is not None:
        check_parses(text, f"{target_dir} (the tokenizer's chat_template)")
    return ChatTemplate(render, (), f"{target_dir} tokenizer", text)


def check_parses(template: str, source: str) -> None:
    """Refuse a chat template that is no Jinja (checked when the deployment is built and served:
    else every chat request would be refused as if its messages were at fault). Parsed as
    transformers renders it, with its Jinja extensions."""
    from jinja2 import TemplateSyntaxError

    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template as compile_template
    except ImportError:  # its name in transformers 4.4x to 5.x; elsewhere plain Jinja with loop controls
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        compile_template = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).from_string
    try:
        compile_template(template)
    except TemplateSyntaxError as exc:
        raise CheckpointError(f"{source}: the chat template is not valid Jinja (line {exc.lineno}): "
                              f"{exc.message}") from None


def load_chat_template(target_dir: Path, hf_config, tokenizer) -> ChatTemplate | None:
    """The chat template of the checkpoint in `target_dir`, or None when it has none.
    `tokenizer`: the target's, as `trtspec.tokenizer.load_tokenizer` loaded it."""
    if getattr(hf_config, "trtspec_special_tokens", None) is not None:
        return _byte_model_template(target_dir, hf_config)
    return _tokenizer_template(target_dir, tokenizer.hf)
