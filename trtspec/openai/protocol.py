"""The OpenAI API's request and response bodies, as far as trtspec serves them.

Requests are pydantic models that forbid unknown fields (OpenAI itself answers
"Unrecognized request argument supplied: X") and values of another JSON type ("Invalid type for
'max_tokens'"). Fields OpenAI clients commonly send that change
nothing here (`user`; on chat only, as in OpenAI's API, `metadata`, `store`, …)
are accepted; fields whose non-default values trtspec cannot honour are checked in `check_*` and
refused by name. Any refusal is an `ApiError`, answered as HTTP 400 in OpenAI's error shape
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtspec import json_text
from trtspec.spec.logprobs import MAX_TOP_LOGPROBS
from trtspec.spec.sampling import MAX_LOGIT_BIAS, MAX_PENALTY
from trtspec.triton.request import MAX_SALT_CHARS, MAX_STOP_WORD_CHARS

MAX_STOP = 32  # stop sequences per request (OpenAI allows 4, vLLM any number; lm-eval sends a task's all)
# reasoning_effort's values: OpenAI's (none .. xhigh), and Anthropic's output_config.effort's max
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
MAX_CHOICES = 64  # choices in one request: prompts × n
MAX_TEMPLATE_DEPTH = 64  # how deep chat_template_kwargs' values may nest (templates take flags)
FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32 (the model's sampling inputs)
FLOAT32_NORMAL = 1.1754943508222875e-38  # the smallest normal float32
FLOAT32_TINY = 7.006492321624086e-46  # half the smallest float32: from here down a number arrives as 0


class ApiError(Exception):
    """An OpenAI-shaped error: HTTP status, message, offending parameter, code."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", code: str | None = None,
                 retry_after_s: int | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.kind, self.code = message, param, status, kind, code
        self.retry_after_s = retry_after_s  # a Retry-After header: when to try again (the SDKs wait so long)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class _Forbid(BaseModel):
    # strict, as OpenAI: `max_tokens: true`, `n: 2.0` or `stream: "yes"` are refused by name, not read
    # as 1, 2 and true (an integer is still a number)
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Forbid):
    include_usage: bool = Field(False, description="send a last chunk with the request's usage")
    continuous_usage_stats: bool = Field(False, description="with include_usage, every chunk carries its "
                                         "choice's usage so far (vLLM's option)")


class SamplingFields(_Forbid):
    """How the text is sampled and where it stops: the parameters /v1/completions,
    /v1/chat/completions and /v1/responses share, under the same names."""

    temperature: float | None = Field(None, description="0 = greedy; default 1 as OpenAI")
    top_p: float | None = Field(None, description="nucleus mass in (0, 1]")
    top_k: int | None = Field(None, description="keep the k most likely (vLLM/SGLang extension); -1, 0 = all")
    min_p: float | None = Field(None, description="in [0, 1]: drop the tokens less likely than min_p times "
                                "the most likely one (vLLM extension); 0 = off")
    min_tokens: int | None = Field(None, description="no end of sequence, stop token or stop sequence before "
                                                    "this many tokens (vLLM's)")
    seed: int | None = Field(None, description="sampling seed: the same text under Gumbel coupling; under "
                             "rejection sampling only under the same draft lengths (else another draw "
                             "of the same law)")
    stop: str | list[str] | None = Field(None, description=f"up to {MAX_STOP} sequences that end generation, "
                                         "not sent")
    bad_words: list[str] | None = Field(None, description="words the text may not hold: a word's last token "
                                        "is banned where its others were just generated (vLLM extension)")
    stop_token_ids: list[int] | None = Field(None, description="ids that end generation besides the model's "
                                             "end ids (vLLM extension)")
    include_stop_str_in_output: bool | None = Field(False, description="a `stop` sequence that ends "
                                                    "generation stays at the end of the text (vLLM "
                                                    "extension)")
    presence_penalty: float | None = Field(0.0, description="in [-2, 2], subtracted from the logit of every "
                                           "token generated so far")
    frequency_penalty: float | None = Field(0.0, description="in [-2, 2], times each token's count so far, "
                                            "subtracted from its logit")
    repetition_penalty: float | None = Field(None, description="> 0: the logits of the prompt's and output's "
                                             "tokens divided by it where positive, multiplied where negative "
                                             "(vLLM extension); default 1, not the checkpoint's")
    logit_bias: dict[str, float] | None = Field(None, description="token id (as a string) -> bias in "
                                                "[-100, 100] added to its logit")
    user: str | None = Field(None, description="end-user id; accepted, not used")
    ignore_eos: bool | None = Field(False, description="the end of sequence does not end generation; "
                                    "stop and stop_token_ids still do (vLLM extension)")
    cache_salt: str | None = Field(None, description="requests share cached prompts (prefix reuse) and the "
                                   "prompt-lookup pool only with requests sent with the same salt, so one "
                                   "tenant's speed cannot tell what another sent (vLLM extension); "
                                   f"1 to {MAX_SALT_CHARS} characters")


class _Common(SamplingFields):
    """Parameters shared by /v1/completions and /v1/chat/completions."""

    model: str = Field(description="served model name")
    max_tokens: int | None = Field(None, description="most tokens to generate")
    stream: bool | None = Field(False, description="server-sent events, one chunk per decode step")
    stream_options: StreamOptions | None = Field(None, description="streaming options")
    n: int | None = Field(1, description="choices per prompt, sampled independently (with a seed s, choice j "
                          "samples with seed s + j)")
    add_special_tokens: bool | None = Field(None, description="add the tokenizer's special tokens (a BOS) to "
                                            "the prompt (vLLM extension); default true for completions, "
                                            "false for chat, whose template holds them")
    response_format: dict | None = Field(None, description='what the text must match: {"type": "text"}, '
                                         '"json_object", "json_schema" (with "json_schema": {"name", '
                                         '"schema"}), or TensorRT-LLM\'s "regex" (with "regex") and "ebnf" '
                                         '(with "ebnf")')
    structured_outputs: dict | None = Field(None, description='vLLM\'s: one of "json" (a schema), "regex", '
                                            '"choice" (a list of strings), "grammar" (EBNF), "json_object": '
                                            'true; and "disable_any_whitespace": JSON written compactly (or '
                                            'not: the server\'s --compact-json)')
    guided_json: dict | str | None = Field(None, description="vLLM's older name for structured_outputs.json")
    guided_regex: str | None = Field(None, description="vLLM's older name for structured_outputs.regex")
    guided_choice: list[str] | None = Field(None, description="vLLM's older name for "
                                            "structured_outputs.choice")
    guided_grammar: str | None = Field(None, description="vLLM's older name for structured_outputs.grammar")


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="a text prompt or token ids, or a list of them: a choice each")
    logprobs: int | None = Field(None, description=f"return each token's log-probability and the 0 to "
                                 f"{MAX_TOP_LOGPROBS} most likely tokens' (the target's raw distribution)")
    echo: bool | None = Field(False, description="return the prompt before the completion (with logprobs: "
                              "its tokens' too, the first null)")
    suffix: str | None = Field(None, description="only null")
    best_of: int | None = Field(None, description="only 1")


class ContentPart(BaseModel):
    # any type parses, so that check_messages can refuse an image or audio part by its type
    model_config = ConfigDict(extra="allow")

    type: str = Field(description='only "text"')
    text: str | None = Field(None, description="the text")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # what an SDK message dumped whole holds; checked in check_chat

    role: str = Field(description="system, developer, user, assistant or tool")
    content: str | list[ContentPart] | None = Field(None, description="text, or a list of text parts (an "
                                                    "assistant's with tool_calls may be null)")
    name: str | None = Field(None, description="the participant's name, given to the chat template as vLLM "
                             "gives it (most templates leave it out)")
    tool_calls: list | None = Field(None, description="an assistant's tool calls: [{id, type: function, "
                                    "function: {name, arguments}}], arguments a JSON object's text")
    tool_call_id: str | None = Field(None, description="a tool message's: the call it answers")
    reasoning_content: str | None = Field(None, description="an assistant's reasoning, as a reasoning parser "
                                          "answered it; given to the chat template (Qwen3's reads it)")
    reasoning: str | None = Field(None, description="vLLM's newer name for reasoning_content")


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(description="the conversation so far")
    max_completion_tokens: int | None = Field(None, description="OpenAI's newer name for max_tokens")
    logprobs: bool | None = Field(None, description="return each token's log-probability (the target's raw "
                                  "distribution)")
    top_logprobs: int | None = Field(None, description=f"with logprobs: the 0 to {MAX_TOP_LOGPROBS} most "
                                     "likely tokens at each position too")
    tools: list | None = Field(None, description="functions the model may call: [{type: function, function: "
                               "{name, description, parameters}}] (trtspec.openai.tools)")
    tool_choice: Any = Field(None, description='"none", "auto" (the default with tools; needs the server\'s '
                             '--tool-call-parser), "required", or {"type": "function", "function": {"name"}}')
    parallel_tool_calls: bool | None = Field(None, description="false: at most one tool call")
    metadata: dict | None = Field(None, description="accepted, not used")
    store: bool | None = Field(None, description="accepted, nothing is stored")
    service_tier: str | None = Field(None, description="accepted, one tier")
    prompt_cache_key: str | None = Field(None, description="accepted: prefixes are reused by their tokens")
    prompt_cache_retention: str | None = Field(
        None, description='"in_memory" or "24h", a maximum: accepted (a prefix is kept while a decoder slot '
                          "holds it, `limits.prefix_reuse`)")
    safety_identifier: str | None = Field(None, description="accepted, not used")
    verbosity: str | None = Field(None, description='only "medium": the model has no verbosity setting')
    prediction: dict | None = Field(
        None, description='predicted outputs: {"type": "content", "content": text or text parts} the answer '
                          "is expected to repeat; its tokens are drafted where they continue the answer (the "
                          "target decides: the answer is the same)")
    modalities: list[str] | None = Field(None, description='only ["text"]')
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="variables for the chat template, e.g. Qwen3's enable_thinking (vLLM extension)")
    reasoning_effort: str | None = Field(
        None, description="the chat template's `reasoning_effort` variable (gpt-oss's template reads it; a "
                          "template that does not, as Qwen3's, ignores it); none, minimal, low, medium, "
                          "high, xhigh (OpenAI's) or max (Anthropic's)")
    include_reasoning: bool | None = Field(None, description="false: the reasoning is generated but not sent "
                                           "(needs the server's --reasoning-parser; vLLM extension)")
    thinking_token_budget: int | None = Field(
        None, description="most tokens in the reasoning block, then its end is forced (needs the server's "
                          "--reasoning-parser; TensorRT-LLM extension)")


def parse(model: type[BaseModel], body: Any):
    """Validate a JSON body; the first problem becomes an ApiError naming its parameter."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = _param(err["loc"])
        if param is not None and param.endswith(".content") and param.startswith("messages["):
            raise _content_error(param, err["input"]) from None
        loc = err["loc"]
        if loc and loc[0] in _UNIONS and len(loc) > 1 and isinstance(loc[1], str) and _is_tag(loc[1]):
            # a value no member of the union takes: pydantic's first words name only the first member
            raise ApiError(f"Invalid type for '{loc[0]}': expected {_UNIONS[loc[0]]}.", loc[0],
                           code="invalid_type") from None
        if err["type"] == "extra_forbidden":
            raise ApiError(f"Unrecognized request argument supplied: {param}", param) from None
        if err["type"] == "missing":
            raise ApiError(f"Missing required parameter: '{param}'.", param,
                           code="missing_required_parameter") from None
        if err["type"] == "float_type" and type(err["input"]) is int:  # past what a float holds
            raise ApiError(f"Invalid value for '{param}': an integer out of range.", param,
                           code="invalid_value") from None
        if err["type"] in _TYPE_ERRORS:
            raise ApiError(f"Invalid type for '{param}': expected {_TYPE_ERRORS[err['type']]}, got "
                           f"{_json_type(err['input'])}.", param, code="invalid_type") from None
        raise ApiError(f"Invalid value for '{param}': {err['msg']}.", param, code="invalid_value") from None


_TYPE_ERRORS = {"int_type": "an integer", "float_type": "a number", "bool_type": "a boolean",
                "string_type": "a string", "dict_type": "an object", "list_type": "an array",
                "model_type": "an object"}


def _json_type(value: Any) -> str:
    """A JSON value's kind in OpenAI's words (`true` is a boolean, `2.0` a decimal number)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "null" if value is None else "an object"


def _content_error(param: str, content: Any) -> ApiError:
    """A message's content that is neither text nor a list of parts, or a list with a part that is
    not an object with a string `type` (pydantic's own words name only the string branch)."""
    part = '{"type": "text", "text": "..."}'
    if isinstance(content, list):
        k = next((k for k, c in enumerate(content)
                  if not isinstance(c, dict) or not isinstance(c.get("type"), str)
                  or not isinstance(c.get("text"), str | None)), 0)
        return ApiError(f"Invalid value for '{param}[{k}]': expected a content part like {part}.",
                        f"{param}[{k}]", code="invalid_value")
    return ApiError(f"Invalid value for '{param}': expected a string or a list of content parts like "
                    f"{part}.", param, code="invalid_value")


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}
_UNIONS = {"prompt": "a string, an array of strings, an array of token ids (integers) or an array of arrays "
                     "of token ids",
           "stop": "a string or an array of strings"}


def _is_tag(part: str) -> bool:
    """A union-member tag pydantic inserts in an error location (`str`, `list[int]`)."""
    return part in _TYPE_TAGS or "[" in part


def _param(loc: tuple) -> str | None:
    """A pydantic error location as OpenAI names parameters (`messages[0].content`), without the
    union-member tags pydantic inserts (`str`, `list[ContentPart]`)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_tag(part):
            out += f".{part}" if out else part
    return out or None


def check_text(body: Any) -> None:
    """Refuse a body holding a lone UTF-16 surrogate in a string or a key (JSON's `"\\ud800"`
    escape without its pair): no character, it cannot be encoded as UTF-8, so every tokenizer, Triton
    input and answer that carries it fails (it was an HTTP 500). The ApiError names where it is."""
    found = json_text.half_pair(body)
    if found is None:
        return
    loc, text, key = found
    param = _param(loc)
    if param is not None:
        param = param.encode("utf-8", "backslashreplace").decode()  # its own keys may hold one
    where = f"'{param}'" if param is not None else "the request body"
    code = f"\\u{ord(json_text.HALF_PAIR.search(text).group()):04x}"
    what = "key in " if key else ""
    raise ApiError(f"Invalid {what}{where}: it holds a lone UTF-16 surrogate ({code}), which is no "
                   "character; send the character itself, or both halves of its surrogate pair.",
                   param, code="invalid_value")


def refuse(param: str, value, why: str) -> ApiError:
    return ApiError(f"'{param}'={value!r} is not supported by trtspec: {why}.", param,
                    code="unsupported_value")


CACHE_RETENTIONS = ("in_memory", "24h")


def check_cache_retention(value: str | None) -> None:
    """OpenAI's prompt_cache_retention, a maximum: either is honoured by keeping a prefix while a
    decoder slot holds it."""
    if value not in (None, *CACHE_RETENTIONS):
        raise ApiError(f"Invalid value for 'prompt_cache_retention': {value!r}; expected one of "
                       f"{', '.join(CACHE_RETENTIONS)}.", "prompt_cache_retention", code="invalid_value")


def only_keys(value, keys: tuple[str, ...], param: str) -> None:
    """Refuse `value` at `param` unless it is an object of `keys` only, naming the first other key."""
    if not isinstance(value, dict):
        raise ApiError(f"Invalid type for '{param}': expected an object.", param, code="invalid_type")
    extra = sorted(set(value) - set(keys))
    if extra:
        raise ApiError(f"Unrecognized request argument supplied: {param}.{extra[0]}", f"{param}.{extra[0]}")


Renames = tuple[tuple[re.Pattern, str], ...]  # chat's parameter names -> another API's


def rename(text: str, renames: Renames) -> str:
    """`text` with chat's parameter names as another API names them."""
    for pattern, name in renames:
        text = pattern.sub(name, text)
    return text


def renamed(exc: ApiError, renames: Renames) -> ApiError:
    """A chat refusal of a request translated from another API (Responses, Anthropic's Messages),
    its parameter names in the message and `param` replaced as that API names them."""
    return ApiError(rename(exc.message, renames), None if exc.param is None else rename(exc.param, renames),
                    exc.status, exc.kind, exc.code)


def check_common(req: _Common, vocab_size: int) -> None:
    """Refuse values trtspec cannot honour, naming the parameter; token ids lie under `vocab_size`."""
    if req.stream_options is not None and not req.stream:
        raise ApiError("Invalid 'stream_options': only allowed when 'stream' is true.", "stream_options",
                       code="invalid_value")
    if req.n is not None and not 1 <= req.n <= MAX_CHOICES:
        raise ApiError(f"Invalid 'n': {req.n}; expected 1 to {MAX_CHOICES} choices.", "n",
                       code="invalid_value")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value is not None and not -MAX_PENALTY <= value <= MAX_PENALTY:  # NaN fails too
            raise ApiError(f"Invalid '{name}': {value}; expected a number in [-{MAX_PENALTY:g}, "
                           f"{MAX_PENALTY:g}].", name, code="invalid_value")
    # the model takes it as a float32: past its range it would arrive as inf or 0 (NaN fails too)
    if req.repetition_penalty is not None and not FLOAT32_NORMAL <= req.repetition_penalty <= FLOAT32_MAX:
        raise ApiError(f"Invalid 'repetition_penalty': {req.repetition_penalty}; expected a number > 0 "
                       f"(1: none) within a float32's range, [{FLOAT32_NORMAL:.3g}, {FLOAT32_MAX:.3g}].",
                       "repetition_penalty", code="invalid_value")
    logit_bias_pairs(req.logit_bias, vocab_size)
    guide = guide_of(req)
    if guide is not None and req.min_tokens:
        raise ApiError("'min_tokens' cannot be combined with a structured output: the format decides where "
                       "the text may end.", "min_tokens", code="invalid_value")
    if req.temperature is not None and not (math.isfinite(req.temperature) and 0 <= req.temperature <= 2):
        raise ApiError(f"Invalid 'temperature': {req.temperature}; expected a number in [0, 2].",
                       "temperature", code="invalid_value")
    # the model takes it as a float32: a mass under its smallest would arrive as the refused 0
    if req.top_p is not None and not FLOAT32_TINY < req.top_p <= 1:
        raise ApiError(f"Invalid 'top_p': {req.top_p}; expected a number in (0, 1] (over 0 as a float32, "
                       f"> {FLOAT32_TINY:.3g}).", "top_p", code="invalid_value")
    if req.min_p is not None and not 0 <= req.min_p <= 1:
        raise ApiError(f"Invalid 'min_p': {req.min_p}; expected a number in [0, 1].", "min_p",
                       code="invalid_value")
    if req.top_k is not None and req.top_k < -1:
        raise ApiError(f"Invalid 'top_k': {req.top_k}; expected -1 or 0 (all tokens) or k >= 1.", "top_k",
                       code="invalid_value")
    if req.seed is not None and not 0 <= req.seed < 2**64:
        raise ApiError(f"Invalid 'seed': {req.seed}; expected an integer in [0, 2^64).", "seed",
                       code="invalid_value")
    bad = [i for i in req.stop_token_ids or () if not 0 <= i < vocab_size]
    if bad:
        raise ApiError(f"Invalid 'stop_token_ids': token id {bad[0]} is outside the vocabulary "
                       f"[0, {vocab_size}).", "stop_token_ids", code="invalid_value")
    stops = stop_list(req.stop)
    if len(stops) > MAX_STOP or any(not s for s in stops):
        raise ApiError(f"Invalid 'stop': up to {MAX_STOP} non-empty strings, got {req.stop!r}.", "stop",
                       code="invalid_value")
    long = next((s for s in stops if len(s) > MAX_STOP_WORD_CHARS), None)
    if long is not None:
        raise ApiError(f"Invalid 'stop': a sequence of {len(long)} characters; at most {MAX_STOP_WORD_CHARS} "
                       "each.", "stop", code="invalid_value")


def check_completion(req: CompletionRequest, vocab_size: int) -> list[str | list[int]]:
    """The prompts of a completion request, each a text or token ids (under `vocab_size`)."""
    check_common(req, vocab_size)
    _check_top(req.logprobs, "logprobs")
    if req.suffix is not None:
        raise refuse("suffix", req.suffix, "no insertion")
    if req.best_of not in (None, 1):
        raise refuse("best_of", req.best_of, "one candidate per request")
    prompt = req.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise ApiError("'prompt' must hold at least one prompt.", "prompt", code="invalid_value")
    if len(prompts) * (req.n or 1) > MAX_CHOICES:
        raise ApiError(f"'prompt' holds {len(prompts)} prompts, {len(prompts) * (req.n or 1)} choices with "
                       f"n={req.n or 1}; at most {MAX_CHOICES} per request.", "prompt", code="invalid_value")
    for i, one in enumerate(prompts):
        param = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        if not one:
            raise ApiError(f"'{param}' must not be empty.", param, code="invalid_value")
        bad = [t for t in one if not 0 <= t < vocab_size] if isinstance(one, list) else []
        if bad:
            raise ApiError(f"Invalid '{param}': token id {bad[0]} is outside the vocabulary "
                           f"[0, {vocab_size}).", param, code="invalid_value")
    return prompts


ROLES = ("system", "developer", "user", "assistant", "tool")
# what rendering a chat template sets itself: a request's chat_template_kwargs may not
TEMPLATE_ARGUMENTS = frozenset({"messages", "conversation", "tools", "documents", "add_generation_prompt",
                                "continue_final_message", "tokenize", "chat_template", "return_dict"})


def check_chat(req: ChatRequest, vocab_size: int) -> list[dict]:
    """The conversation as plain {role, content} dicts, text only; token ids lie under `vocab_size`."""
    check_common(req, vocab_size)
    if req.max_tokens is not None and req.max_completion_tokens is not None \
            and req.max_tokens != req.max_completion_tokens:
        raise ApiError("'max_tokens' and 'max_completion_tokens' disagree; give one.",
                       "max_completion_tokens")
    _check_top(req.top_logprobs, "top_logprobs")
    if req.top_logprobs and not req.logprobs:
        raise ApiError("'top_logprobs' needs 'logprobs': true.", "top_logprobs", code="invalid_value")
    if req.modalities not in (None, ["text"]):
        raise refuse("modalities", req.modalities, "text only")
    check_cache_retention(req.prompt_cache_retention)
    if req.verbosity not in (None, "medium"):
        raise refuse("verbosity", req.verbosity, "the model has no verbosity setting")
    prediction_text(req)
    if req.reasoning_effort not in (None, *REASONING_EFFORTS):
        raise ApiError(f"Invalid 'reasoning_effort': {req.reasoning_effort!r}; expected one of "
                       f"{', '.join(REASONING_EFFORTS)}.", "reasoning_effort", code="invalid_value")
    return check_messages(req.messages, req.chat_template_kwargs)


def prediction_text(req: ChatRequest) -> str:
    """A chat request's predicted output as text ("": none): OpenAI's {"type": "content", "content":
    a string or text parts}."""
    if req.prediction is None:
        return ""
    only_keys(req.prediction, ("type", "content"), "prediction")
    if req.prediction.get("type") != "content":
        raise ApiError(f"Invalid value for 'prediction.type': {req.prediction.get('type')!r}; expected "
                       "'content'.", "prediction.type", code="invalid_value")
    content = req.prediction.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and
                                         isinstance(p.get("text"), str) and set(p) <= {"type", "text"}
                                         for p in content):
        return "".join(p["text"] for p in content)
    raise ApiError("Invalid 'prediction.content': expected a string or a list of text parts "
                   '({"type": "text", "text": ...}).', "prediction.content", code="invalid_type")


def template_variables(req: ChatRequest) -> dict | None:
    """The chat template's variables: the request's chat_template_kwargs, and its reasoning_effort
    as `reasoning_effort` (a chat_template_kwargs' own wins, as vLLM merges them)."""
    if req.reasoning_effort is None:
        return req.chat_template_kwargs
    return {"reasoning_effort": req.reasoning_effort, **(req.chat_template_kwargs or {})}


def check_messages(given: list[ChatMessage], template_kwargs: dict | None) -> list[dict]:
    """The conversation as plain {role, content} dicts, text only; template variables the server
    sets itself refused by name."""
    taken = sorted(set(template_kwargs or {}) & TEMPLATE_ARGUMENTS)
    if taken:
        raise ApiError(f"'chat_template_kwargs.{taken[0]}' is set by the server, not the request.",
                       f"chat_template_kwargs.{taken[0]}", code="invalid_value")
    deep = json_text.depth(template_kwargs)
    if deep > MAX_TEMPLATE_DEPTH:  # rendering them, Jinja recursed past Python's limit
        raise ApiError(f"Invalid 'chat_template_kwargs': its values nest {deep} deep; at most "
                       f"{MAX_TEMPLATE_DEPTH}.", "chat_template_kwargs", code="invalid_value")
    if not given:
        raise ApiError("'messages' must hold at least one message.", "messages", code="invalid_value")
    messages = []
    for i, msg in enumerate(given):
        if msg.role not in ROLES:
            raise ApiError(f"Invalid value for 'messages[{i}].role': {msg.role!r}; expected one of "
                           f"{', '.join(ROLES)}.", f"messages[{i}].role", code="invalid_value")
        # a field the client sends empty (an SDK message dumped whole: refusal, function_call, audio,
        # annotations … null) is absent; one with a value is not served
        extra = sorted(key for key, value in (msg.model_extra or {}).items() if value not in (None, [], {}))
        if extra:
            raise refuse(f"messages[{i}].{extra[0]}", msg.model_extra[extra[0]], "text messages only")
        content = msg.content
        if isinstance(content, list):  # text parts one a line, as vLLM and trtllm-serve join them
            content = "\n".join(_part_text(part, f"messages[{i}].content", k)
                                 for k, part in enumerate(content))
        message = {"role": "system" if msg.role == "developer" else msg.role, "content": content}
        if msg.tool_calls:
            if msg.role != "assistant":
                raise ApiError(f"'messages[{i}].tool_calls' belongs to an assistant message, not a "
                               f"{msg.role!r} one.", f"messages[{i}].tool_calls", code="invalid_value")
            message |= {"content": content or "", "tool_calls": _tool_calls(msg.tool_calls, i)}
        elif content is None:
            raise ApiError(f"'messages[{i}].content' is required.", f"messages[{i}].content",
                           code="invalid_value")
        if msg.role == "tool":
            if msg.tool_call_id is None:
                raise ApiError(f"Missing required parameter: 'messages[{i}].tool_call_id'.",
                               f"messages[{i}].tool_call_id", code="missing_required_parameter")
            message["tool_call_id"] = msg.tool_call_id
        elif msg.tool_call_id is not None:
            raise ApiError(f"'messages[{i}].tool_call_id' belongs to a tool message, not a {msg.role!r} one.",
                           f"messages[{i}].tool_call_id", code="invalid_value")
        reasoning = msg.reasoning_content if msg.reasoning_content is not None else msg.reasoning
        if reasoning is not None:
            if msg.role != "assistant":
                field = "reasoning_content" if msg.reasoning_content is not None else "reasoning"
                raise ApiError(f"'messages[{i}].{field}' belongs to an assistant message, not a {msg.role!r} "
                               "one.", f"messages[{i}].{field}", code="invalid_value")
            message["reasoning_content"] = reasoning
        messages.append(message if msg.name is None else {**message, "name": msg.name})
    return messages


def _tool_calls(calls: list, i: int) -> list[dict]:
    """An assistant message's tool calls for the chat template: each call's arguments as the object
    its JSON text holds (as vLLM gives them; templates write them with `tojson`)."""
    out = []
    for k, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{k}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(f"Invalid '{where}': expected {{\"id\", \"type\": \"function\", \"function\": "
                           "{\"name\", \"arguments\"}}.", where, code="invalid_value")
        arguments = function.get("arguments", "{}")
        try:
            arguments = json_text.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError as exc:
            raise ApiError(f"Invalid '{where}.function.arguments': not JSON ({exc}).",
                           f"{where}.function.arguments", code="invalid_value") from None
        if not isinstance(arguments, dict):
            raise ApiError(f"Invalid '{where}.function.arguments': expected a JSON object's text.",
                           f"{where}.function.arguments", code="invalid_value")
        out.append({"id": call.get("id"), "type": "function",
                    "function": {"name": function["name"], "arguments": arguments}})
    return out


def required_string(obj: dict, key: str, where: str) -> str:
    """`obj[key]`, a string: absent (or null) it is a missing parameter, of another JSON type a value
    of the wrong type, each named `where.key`."""
    value = obj.get(key)
    if value is None:
        raise ApiError(f"Missing required parameter: '{where}.{key}' (a string).", f"{where}.{key}",
                       code="missing_required_parameter")
    if not isinstance(value, str):
        raise ApiError(f"Invalid type for '{where}.{key}': expected a string, got {_json_type(value)}.",
                       f"{where}.{key}", code="invalid_type")
    return value


def _part_text(part: ContentPart, param: str, k: int) -> str:
    if part.type != "text":
        raise ApiError(f"Invalid value for '{param}': part {k} is of type {part.type!r}; only text content "
                       "parts (type 'text') are supported by trtspec.", param, code="unsupported_value")
    if part.text is None:
        raise ApiError(f"Missing required parameter: '{param}[{k}].text'.", f"{param}[{k}].text",
                       code="missing_required_parameter")
    if part.model_extra:
        extra = sorted(part.model_extra)[0]
        where = f"{param}[{k}].{extra}"
        raise ApiError(f"Unrecognized request argument supplied: {where}", where)
    return part.text


def _check_top(k: int | None, param: str) -> None:
    if k is not None and not 0 <= k <= MAX_TOP_LOGPROBS:
        raise ApiError(f"Invalid '{param}': {k}; expected an integer in [0, {MAX_TOP_LOGPROBS}].", param,
                       code="invalid_value")


# response_format types -> TensorRT-LLM's guide type and the field that holds the guide
RESPONSE_FORMATS = {"json_object": ("json", None), "json_schema": ("json_schema", "json_schema"),
                    "json": ("json_schema", "schema"), "regex": ("regex", "regex"),
                    "ebnf": ("ebnf_grammar", "ebnf")}


STRUCTURED_OUTPUTS = ("json", "regex", "choice", "grammar", "json_object")  # vLLM's kinds
STRUCTURED_OPTIONS = ("disable_any_whitespace",)  # vLLM's options beside them that trtspec takes
GUIDE_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                "guided_grammar")


def _guide_fields(req: _Common) -> dict:
    """The request's fields that ask for a structured output, by name (response_format: not text)."""
    given = {name: getattr(req, name) for name in GUIDE_FIELDS}
    return {name: value for name, value in given.items()
            if value is not None and not (name == "response_format" and value == {"type": "text"})
            and not (name == "structured_outputs" and isinstance(value, dict) and value
                     and set(value) <= set(STRUCTURED_OPTIONS))}  # options for another field's guide


def compact_json_wanted(req: _Common) -> bool | None:
    """vLLM's structured_outputs.disable_any_whitespace: a JSON guide written compactly (True) or
    with any whitespace (False); None: as the server does."""
    value = (getattr(req, "structured_outputs", None) or {}).get("disable_any_whitespace")
    if value is not None and not isinstance(value, bool):
        raise ApiError("Invalid 'structured_outputs.disable_any_whitespace': expected true or false.",
                       "structured_outputs.disable_any_whitespace", code="invalid_type")
    return value


def guide_field(req: _Common) -> str | None:
    """The field that asked for the request's structured output (None: plain text)."""
    return next(iter(_guide_fields(req)), None)


def guide_of(req: _Common) -> tuple[str, str] | None:
    """The request's structured output as a guide (TensorRT-LLM's guided_decoding_guide_type and
    guided_decoding_guide), from whichever one field asks for it: response_format, vLLM's
    structured_outputs or its older guided_json / guided_regex / guided_choice / guided_grammar. None:
    plain text. An ApiError names what is wrong."""
    given = _guide_fields(req)
    if len(given) > 1:
        first, second = list(given)[:2]
        raise ApiError(f"'{first}' and '{second}' both ask for a structured output; give one.", second,
                       code="invalid_value")
    if not given:
        return None
    name, value = next(iter(given.items()))
    if name == "response_format":
        return _response_format_guide(value)
    if name == "structured_outputs":
        kinds = [k for k in value if k in STRUCTURED_OUTPUTS]
        other = sorted(set(value) - set(STRUCTURED_OUTPUTS) - set(STRUCTURED_OPTIONS))
        if other:
            raise ApiError(f"Unsupported field in 'structured_outputs': {other[0]!r}; trtspec takes one of "
                           f"{', '.join(STRUCTURED_OUTPUTS)}.", f"structured_outputs.{other[0]}",
                           code="invalid_value")
        if len(kinds) != 1:
            raise ApiError(f"'structured_outputs' needs exactly one of {', '.join(STRUCTURED_OUTPUTS)}.",
                           "structured_outputs", code="invalid_value")
        name, value = f"structured_outputs.{kinds[0]}", value[kinds[0]]
    return _vllm_guide(name, value)


def _vllm_guide(param: str, value) -> tuple[str, str]:
    """One of vLLM's structured outputs (`param` ends in its kind) as a guide."""
    kind = param.rsplit(".", 1)[-1].removeprefix("guided_")
    if kind == "json_object":
        if value is not True:
            raise ApiError(f"'{param}' must be true.", param, code="invalid_value")
        return "json", ""
    if kind == "json":
        if isinstance(value, dict):
            return "json_schema", json.dumps(value)
        if isinstance(value, str) and value:
            return "json_schema", value
        raise ApiError(f"'{param}' must be a JSON schema (an object or its text).", param,
                       code="invalid_value")
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise ApiError(f"'{param}' must be a non-empty list of non-empty strings.", param,
                           code="invalid_value")
        # a grammar whose one rule is the choices, each a quoted literal (JSON's escapes are GBNF's)
        return "ebnf_grammar", "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in value)
    if not isinstance(value, str) or not value:
        raise ApiError(f"'{param}' must be a non-empty string.", param, code="invalid_value")
    return ("regex" if kind == "regex" else "ebnf_grammar"), value


def _response_format_guide(response_format: dict) -> tuple[str, str] | None:
    """response_format as a guide: OpenAI's json_object and json_schema, TensorRT-LLM's json (a bare
    "schema"), regex and ebnf."""
    kind = response_format.get("type")
    if kind == "text":
        extra = sorted(set(response_format) - {"type"})
        if extra:
            raise ApiError(f"Unrecognized field in 'response_format' of type 'text': {extra[0]!r}.",
                           f"response_format.{extra[0]}", code="invalid_value")
        return None
    if not isinstance(kind, str) or kind not in RESPONSE_FORMATS:
        raise ApiError(f"Invalid 'response_format.type': {kind!r}; expected text, "
                       f"{', '.join(RESPONSE_FORMATS)}.", "response_format.type", code="invalid_value")
    guide_type, field = RESPONSE_FORMATS[kind]
    extra = sorted(set(response_format) - {"type", field})
    if extra:
        raise ApiError(f"Unrecognized field in 'response_format' of type {kind!r}: {extra[0]!r}.",
                       f"response_format.{extra[0]}", code="invalid_value")
    if field is None:
        return guide_type, ""
    value = response_format.get(field)
    param = f"response_format.{field}"
    if kind == "json_schema":  # OpenAI's {"name", "schema", "strict", "description"}
        if not isinstance(value, dict) or not isinstance(value.get("schema"), dict):
            raise ApiError("'response_format.json_schema.schema' must be a JSON schema object.",
                           "response_format.json_schema.schema", code="invalid_value")
        value = value["schema"]
    if kind == "json" and not isinstance(value, dict):
        raise ApiError("'response_format.schema' must be a JSON schema object.", param, code="invalid_value")
    if isinstance(value, dict):
        return guide_type, json.dumps(value)
    if not isinstance(value, str) or not value:
        raise ApiError(f"'{param}' must be a non-empty string.", param, code="invalid_value")
    return guide_type, value


def logit_bias_pairs(bias: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias ({"token id": bias}) as (id, bias) pairs; an ApiError naming the key or
    value that is not a token id of the vocabulary or a bias in [-100, 100]."""
    pairs = []
    for key, value in (bias or {}).items():
        if not (key.isascii() and key.isdigit() and int(key) < vocab_size):
            raise ApiError(f"Invalid key in 'logit_bias': {key!r}; expected a token id in [0, {vocab_size}) "
                           "as a string.", "logit_bias", code="invalid_value")
        if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise ApiError(f"Invalid value for 'logit_bias' of token {key}: {value}; expected a number in "
                           f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}].", "logit_bias", code="invalid_value")
        pairs.append((int(key), float(value)))
    return tuple(pairs)


def logprobs_wanted(req: _Common) -> int | None:
    """None: no log-probabilities; k: each token's and the k most likely tokens' at each position
    (completions: `logprobs: k`; chat: `logprobs: true` with `top_logprobs: k`)."""
    if isinstance(req, ChatRequest):
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs


class TokenizeRequest(_Forbid):
    """vLLM's /tokenize: a text prompt, or a conversation through the chat template."""

    model: str | None = Field(None, description="served model name (optional)")
    prompt: str | None = Field(None, description="text to tokenize")
    messages: list[ChatMessage] | None = Field(None, description="a conversation, rendered as chat does")
    add_special_tokens: bool | None = Field(None, description="default true for a prompt, false for messages")
    add_generation_prompt: bool | None = Field(True, description="only true: the assistant's turn is opened")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="variables for the chat template")
    tools: list | None = Field(None, description="with messages: tools the chat template shows, as chat's")
    return_token_strs: bool | None = Field(False, description="also each token's text")


class DetokenizeRequest(_Forbid):
    """vLLM's /detokenize."""

    model: str | None = Field(None, description="served model name (optional)")
    tokens: list[int] = Field(description="token ids to decode")


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)
