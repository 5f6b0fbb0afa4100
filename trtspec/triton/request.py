"""One Triton request's inputs, checked, and the text stream sent back for it.

Kept free of `triton_python_backend_utils` so every rule here is tested without a server. Triton
itself refuses a missing required input or a wrong datatype (naming the input) before the model
sees the request; what is left to check is values, shapes and request parameters.

Parameters: Triton's HTTP `/generate` turns every JSON field that is not a declared input into a
request parameter (Triton 2.51 `GenerateRequestClass::ExactMappingInput`), so a misspelt field
(`"max_token": 32`) would otherwise be dropped without a word; any parameter but `id` (which
`/generate` also sets as the request id) is refused, naming it. Over gRPC an undeclared tensor is
refused by Triton itself. What the model never sees: JSON that does not parse, or a field of the
wrong JSON type (`"max_tokens": "32"`): Triton's front end answers those itself.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from trtspec.errors import TrtspecError
from trtspec.spec.grammar import GUIDE_TYPES, Guide, GuideError
from trtspec.spec.logprobs import MAX_TOP_LOGPROBS
from trtspec.spec.sampling import MAX_LOGIT_BIAS, MAX_PENALTY, SamplingParams
from trtspec.spec.thinking_budget import ThinkingBudget
from trtspec.triton.repo import INPUTS
from trtspec.triton.trtllm_inputs import TRTLLM_INPUTS, UnsupportedInput, check_refused


class RequestError(TrtspecError):
    """A request parameter is missing, malformed or out of range; the message names it."""


InputGetter = Callable[[str], "np.ndarray | None"]


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    prompt: str  # text_input ("" when the prompt came as input_ids)
    max_tokens: int
    sampling: SamplingParams
    stream: bool = False
    stop_words: tuple[str, ...] = ()
    min_tokens: int = 0  # TensorRT-LLM's min_length / min_tokens: no end before this many tokens
    end_id: int | None = None  # the id that ends generation; None = the tokenizer's eos
    include_input: bool = False  # exclude_input_in_output sent as false: outputs start with the prompt
    add_special_tokens: bool = True  # encode the prompt as tokenizer(text) does (Llama's BOS)
    stop_token_ids: tuple[int, ...] = ()  # ids that end the request besides the model's end ids
    ignore_eos: bool = False  # the end ids do not end the request (stop_token_ids still do)
    logprobs: int | None = None  # None: none returned; k: each token's log p and the top k's
    prompt_ids: tuple[int, ...] | None = None  # input_ids: the prompt already tokenized
    prompt_logprobs: int | None = None  # None: none returned; k: the prompt's tokens' (after its first)
    guide: Guide | None = None  # guided_decoding_guide_type / _guide: what the text must match
    bad_words: tuple[str, ...] = ()  # TensorRT-LLM's bad_words: words the text may not hold (`bad_word_ids`)
    thinking: tuple[int, str, str] | None = None  # a reasoning budget: (tokens, block start, block end) text
    prediction: str = ""  # predicted outputs: text the answer is expected to repeat ("": none)
    cache_salt: str = ""  # shares cached prompts and the lookup pool with requests of the same salt only

    @property
    def prompt_input(self) -> str:
        """The input the prompt came in, to name it in an error."""
        return "text_input" if self.prompt_ids is None else "input_ids"


def _scalar(get: InputGetter, name: str):
    value = get(name)
    if value is None:
        return None
    if value.size != 1:
        raise RequestError(f"{name} must hold exactly one value, got shape {list(value.shape)}")
    return value.reshape(-1)[0]


MAX_SALT_CHARS = 1024  # a cache_salt is kept per slot and hashed for the pool: a bound on absurd ones


def salt_length_problem(salt: str) -> str | None:
    """What is wrong with the length of a cache_salt a client names (the OpenAI API's field, `generate
    --cache-salt`: 1 to MAX_SALT_CHARS characters), or None. Triton's input takes "" as none."""
    if 1 <= len(salt) <= MAX_SALT_CHARS:
        return None
    return f"expected 1 to {MAX_SALT_CHARS:,} characters, got {len(salt):,}"


def _utf8(raw, name: str) -> str:
    if isinstance(raw, str):
        return raw
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"{name} is not valid UTF-8 (byte {exc.start})") from None


# A stop word is looked for in the text after every id a request emits, in the serving loop that
# steps every request: 4,000 words of 1,000 characters in one request took a step of 8 requests from
# 58 to 104 ms for all of them (tiny-dflash, 2-core CPU), and Triton takes 64 MB of them. The most
# of each that a request may send (the OpenAI frontend's 32 `stop` and a chat template's fit):
# at the limits a step's search costs about 0.02 ms per id.
MAX_STOP_WORDS = 64
MAX_STOP_WORD_CHARS = 1024
OWN_INPUTS = tuple(name for name, *_ in INPUTS if name not in {i.name for i in TRTLLM_INPUTS})
ALLOWED_PARAMETERS = ("id",)


def check_parameters(parameters: dict) -> None:
    """Refuse request parameters this model does not read (a typo'd field over HTTP)."""
    unknown = sorted(name for name in parameters if name not in ALLOWED_PARAMETERS)
    if unknown:
        names = ", ".join(repr(n) for n in unknown)
        raise RequestError(f"unknown request field{'s' if len(unknown) > 1 else ''} {names}; this model "
                           f"takes {', '.join(OWN_INPUTS)} and TensorRT-LLM's optional inputs")


def parameters_not_utf8(raw: bytes) -> str:
    """The error for request parameters whose text is not UTF-8 (`raw`: their JSON, as Triton hands it
    over), naming the fields that hold it: Python's own message named none."""
    def bad(text: str) -> bool:
        return any("\udc80" <= c <= "\udcff" for c in text)

    try:
        names = [k for k, v in json.loads(bytes(raw).decode("utf-8", "surrogateescape")).items()
                 if bad(k) or bad(json.dumps(v, ensure_ascii=False))]
    except (ValueError, AttributeError):  # not a JSON object: name none
        names = []
    shown = ", ".join(repr(n.encode("utf-8", "surrogateescape").decode("utf-8", "replace")) for n in names)
    if not names:
        return "a request field (a parameter) is not valid UTF-8"
    several = len(names) > 1
    return f"request field{'s' if several else ''} {shown} {'are' if several else 'is'} not valid UTF-8"


def parse_request(get: InputGetter, max_tokens_limit: int, parameters: dict | None = None,
                  vocab_size: int | None = None, coupling: str = "rejection") -> GenerateRequest:
    """Read and check every input and parameter; raises RequestError naming the first bad one.
    `vocab_size`: the target's, which token ids (input_ids, end_id, stop_token_ids) must lie under;
    `coupling`: the deployment's `sampling.coupling`."""
    check_parameters(parameters or {})
    span = f"in [0, {vocab_size})" if vocab_size else ">= 0"  # a token id of the target
    raw, given_ids = _scalar(get, "text_input"), get("input_ids")
    if (raw is None) == (given_ids is None):
        raise RequestError("give one of text_input (text) or input_ids (token ids)" if raw is not None else
                           "text_input is required (or input_ids: the prompt as token ids)")
    prompt, prompt_ids = "", None
    if raw is not None:
        prompt = _utf8(raw, "text_input")
        if not prompt:
            raise RequestError("text_input must not be empty")
    else:
        prompt_ids = tuple(int(i) for i in given_ids.reshape(-1))
        if not prompt_ids:
            raise RequestError("input_ids must not be empty")
        bad = [i for i in prompt_ids if not 0 <= i < (vocab_size or 2**31)]
        if bad:
            raise RequestError(f"input_ids must be token ids {span}, got {bad[0]} at position "
                               f"{prompt_ids.index(bad[0])}")

    max_tokens = _scalar(get, "max_tokens")
    if max_tokens is None:
        raise RequestError("max_tokens is required")
    max_tokens = int(max_tokens)
    if not 1 <= max_tokens <= max_tokens_limit:
        raise RequestError(f"max_tokens must be in [1, {max_tokens_limit}], got {max_tokens}")

    temperature = _scalar(get, "temperature")
    temperature = 0.0 if temperature is None else float(temperature)
    if not (math.isfinite(temperature) and temperature >= 0.0):
        raise RequestError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    top_p = _scalar(get, "top_p")
    top_p = 1.0 if top_p is None else float(top_p)
    if not 0.0 < top_p <= 1.0:
        raise RequestError(f"top_p must be in (0, 1], got {top_p}")
    top_k = _scalar(get, "top_k")
    top_k = 0 if top_k is None else int(top_k)
    if top_k < 0:
        raise RequestError(f"top_k must be >= 0 (0 = all tokens), got {top_k}")
    min_p = _scalar(get, "min_p")
    min_p = 0.0 if min_p is None else float(min_p)
    if not 0.0 <= min_p <= 1.0:  # NaN fails too
        raise RequestError(f"min_p must be in [0, 1] (0 = off), got {min_p}")
    _, seed = _one_of(get, "random_seed", "seed")
    seed = None if seed is None else int(seed)
    stream = _scalar(get, "stream")

    stop_words, bad_words = _words(get, "stop_words"), _words(get, "bad_words")

    min_name, min_tokens = _one_of(get, "min_length", "min_tokens")
    min_tokens = 0 if min_tokens is None else int(min_tokens)
    if not 0 <= min_tokens <= max_tokens:
        raise RequestError(f"{min_name} must be in [0, max_tokens={max_tokens}], got {min_tokens}")
    end_id = _scalar(get, "end_id")
    if end_id is not None and not 0 <= int(end_id) < (vocab_size or 2**31):
        raise RequestError(f"end_id must be a token id {span}, got {int(end_id)}")
    stops = get("stop_token_ids")
    stop_token_ids = () if stops is None else tuple(int(i) for i in stops.reshape(-1))
    if any(not 0 <= i < (vocab_size or 2**31) for i in stop_token_ids):
        raise RequestError(f"stop_token_ids must be token ids {span}, got {list(stop_token_ids)}")
    exclude_input = _scalar(get, "exclude_input_in_output")
    ignore_eos = _scalar(get, "ignore_eos")
    top = _scalar(get, "num_top_log_probs")
    if top is not None and not 0 <= int(top) <= MAX_TOP_LOGPROBS:
        raise RequestError(f"num_top_log_probs must be in [0, {MAX_TOP_LOGPROBS}], got {int(top)}")
    top = 0 if top is None else int(top)
    wants = _scalar(get, "return_log_probs")
    if wants is not None and not bool(wants) and top:
        raise RequestError(f"num_top_log_probs={top} asks for log-probabilities that return_log_probs=false "
                           "turns off; drop one")
    logprobs = top if top or (wants is not None and bool(wants)) else None
    of_prompt = _scalar(get, "return_prompt_log_probs")
    prompt_logprobs = top if of_prompt is not None and bool(of_prompt) else None
    add_special_tokens = _scalar(get, "add_special_tokens")
    _scalar(get, "pad_id")  # one value; outputs are never padded, so it needs nothing more
    try:
        check_refused(get)
    except UnsupportedInput as exc:
        raise RequestError(str(exc)) from None

    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed,
                              coupling=coupling,
                              **_penalties(get), logit_bias=_logit_bias(get, vocab_size))
    guide = _guide(get)
    thinking = _thinking(get)
    prediction = _scalar(get, "prediction")
    prediction = "" if prediction is None else _utf8(prediction, "prediction")
    cache_salt = _scalar(get, "cache_salt")
    cache_salt = "" if cache_salt is None else _utf8(cache_salt, "cache_salt")
    if len(cache_salt) > MAX_SALT_CHARS:
        raise RequestError(f"cache_salt has {len(cache_salt)} characters; at most {MAX_SALT_CHARS}")
    if guide is not None and min_tokens:
        raise RequestError(f"{min_name}={min_tokens} cannot be combined with guided_decoding_guide_type: "
                           "the guide decides where the text may end")
    return GenerateRequest(prompt, max_tokens, sampling, bool(stream), tuple(stop_words), min_tokens,
                           None if end_id is None else int(end_id),
                           exclude_input is not None and not bool(exclude_input),
                           add_special_tokens is None or bool(add_special_tokens), stop_token_ids,
                           ignore_eos is not None and bool(ignore_eos), logprobs, prompt_ids, prompt_logprobs,
                           guide, tuple(bad_words), thinking, prediction, cache_salt)


def _words(get: InputGetter, name: str) -> list[str]:
    """A list input of words (stop_words, bad_words): UTF-8, none empty, bounded."""
    words = get(name)
    words = [] if words is None else words.reshape(-1)
    if len(words) > MAX_STOP_WORDS:
        raise RequestError(f"{name} holds {len(words)} words; at most {MAX_STOP_WORDS}")
    out = []
    for i, raw_word in enumerate(words):
        word = _utf8(raw_word, name)
        if not word:
            raise RequestError(f"{name} must not contain an empty string")
        if len(word) > MAX_STOP_WORD_CHARS:
            raise RequestError(f"{name}[{i}] has {len(word)} characters; at most {MAX_STOP_WORD_CHARS}")
        out.append(word)
    return out


def bad_word_ids(encode: Callable[[str], list[int]], words: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """Bad words as the token sequences the text may not hold, as vLLM tokenizes them: each word
    as it stands and, after a space (where a BPE writes a word inside the text), with one; a
    sequence given twice counts once. `encode`: text -> ids, no special tokens."""
    out: dict[tuple[int, ...], None] = {}
    for word in words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tuple(encode(text))
            if ids:
                out[ids] = None
    return tuple(out)


def tokenized(sampling: SamplingParams, encode: Callable[[str], list[int]], bad_words: Sequence[str] = (),
              thinking: tuple[int, str, str] | None = None) -> SamplingParams:
    """`sampling` with a request's bad words (`bad_word_ids`) and reasoning budget ((budget, start,
    end) as the thinking_* inputs give them; the tags as the model writes them) in token ids.
    `encode`: text -> ids, no special tokens."""
    update: dict = {}
    if bad_words:
        update["bad_words"] = bad_word_ids(encode, bad_words)
    if thinking is not None:
        budget, start, end = thinking
        update["thinking"] = ThinkingBudget(budget=budget, start=tuple(encode(start)), end=tuple(encode(end)))
    return sampling.model_copy(update=update) if update else sampling


THINK_END = "</think>"  # thinking_end's default: the end of Qwen3's and DeepSeek-R1's blocks


def _thinking(get: InputGetter) -> tuple[int, str, str] | None:
    """thinking_token_budget with its block's start ("" by default: the prompt opened the block) and
    end ("</think>" by default); None: no budget."""
    budget = _scalar(get, "thinking_token_budget")
    start, end = _scalar(get, "thinking_start"), _scalar(get, "thinking_end")
    if budget is None:
        if start is not None or end is not None:
            raise RequestError(f"{'thinking_start' if start is not None else 'thinking_end'} needs "
                               "thinking_token_budget, the budget it delimits")
        return None
    if int(budget) < 0:
        raise RequestError(f"thinking_token_budget must be >= 0, got {int(budget)}")
    start = "" if start is None else _utf8(start, "thinking_start")
    end = THINK_END if end is None else _utf8(end, "thinking_end")
    if not end:
        raise RequestError("thinking_end must not be empty: it is the text that ends the block")
    return int(budget), start, end


def _guide(get: InputGetter) -> Guide | None:
    """TensorRT-LLM's guided_decoding_guide_type and guided_decoding_guide (none: "" or absent)."""
    kind, text = _scalar(get, "guided_decoding_guide_type"), _scalar(get, "guided_decoding_guide")
    kind = "" if kind is None else _utf8(kind, "guided_decoding_guide_type")
    text = "" if text is None else _utf8(text, "guided_decoding_guide")
    if not kind:
        if text:
            raise RequestError("guided_decoding_guide needs guided_decoding_guide_type: one of "
                               f"{', '.join(GUIDE_TYPES)}")
        return None
    if kind not in GUIDE_TYPES:
        raise RequestError(f"guided_decoding_guide_type must be one of {', '.join(GUIDE_TYPES)}, "
                           f"got {kind!r}")
    if kind == "json" and text:
        raise RequestError("guided_decoding_guide must be empty for guided_decoding_guide_type 'json' "
                           "(any JSON); give a schema with 'json_schema'")
    try:
        return Guide(kind, text)
    except GuideError as exc:
        raise RequestError(f"guided_decoding_guide: {exc}") from None


def _penalties(get: InputGetter) -> dict[str, float]:
    """repetition_penalty, presence_penalty and frequency_penalty, where given."""
    out = {}
    for name in ("presence_penalty", "frequency_penalty"):
        value = _scalar(get, name)
        if value is not None:
            value = float(value)
            if not -MAX_PENALTY <= value <= MAX_PENALTY:  # NaN fails too
                raise RequestError(f"{name} must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value}")
            out[name] = value
    value = _scalar(get, "repetition_penalty")
    if value is not None:
        value = float(value)
        if not (math.isfinite(value) and value > 0):
            raise RequestError(f"repetition_penalty must be a finite number > 0 (1 = none), got {value}")
        out["repetition_penalty"] = value
    return out


def _logit_bias(get: InputGetter, vocab_size: int | None) -> tuple[tuple[int, float], ...]:
    """logit_bias_ids and logit_bias_values as (id, bias) pairs; each needs the other."""
    ids, values = get("logit_bias_ids"), get("logit_bias_values")
    if ids is None and values is None:
        return ()
    if ids is None or values is None:
        given, missing = ("logit_bias_ids", "logit_bias_values") if values is None else \
            ("logit_bias_values", "logit_bias_ids")
        raise RequestError(f"{given} needs {missing}: the bias of each token id, in the same order")
    ids, values = ids.reshape(-1).tolist(), values.reshape(-1).tolist()
    if len(ids) != len(values):
        raise RequestError(f"logit_bias_ids holds {len(ids)} ids but logit_bias_values {len(values)} values; "
                           "give one value per id")
    if vocab_size and len(ids) > vocab_size:  # more than the vocabulary holds: some id twice, or outside it
        raise RequestError(f"logit_bias_ids holds {len(ids)} ids; the vocabulary has {vocab_size}")
    for i, (token, bias) in enumerate(zip(ids, values, strict=True)):
        if not 0 <= token < (vocab_size or 2**31):
            span = f"in [0, {vocab_size})" if vocab_size else ">= 0"
            raise RequestError(f"logit_bias_ids must be token ids {span}, got {token} at position {i}")
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise RequestError(f"logit_bias_values[{i}] must be in [-{MAX_LOGIT_BIAS:g}, "
                               f"{MAX_LOGIT_BIAS:g}], got {bias}")
    seen: set[int] = set()
    for token in ids:
        if token in seen:
            raise RequestError(f"logit_bias_ids names token {token} twice; give each id once")
        seen.add(token)
    return tuple(zip((int(t) for t in ids), (float(b) for b in values), strict=True))


def _one_of(get: InputGetter, name: str, alias: str) -> tuple[str, object]:
    """An input TensorRT-LLM's configs have named two ways; both given must agree."""
    value, other = _scalar(get, name), _scalar(get, alias)
    if value is not None and other is not None and value != other:
        raise RequestError(f"{name}={value} and {alias}={other} name the same setting and disagree")
    return (name, value) if value is not None else (alias, other)


@dataclass(slots=True)
class TextStream:
    """Turns ids arriving a few at a time into text deltas that never split a character.

    Detokenized incrementally, as vLLM does: the ids not yet turned into text are decoded after a
    few ids of context (`seen[prefix:read]`, text already produced, or the prompt's last ids for the
    first: it gives byte pieces, a SentencePiece space or a cleanup across the seam what they need),
    and the window's text beyond the context's is theirs. Decoding the whole output again for every
    id would cost O(n²) per request, 0.6 s of the serving loop for a 2,048-token answer with stop
    words on a BPE tokenizer. Text that ends in U+FFFD (an incomplete character) is held until the
    next ids complete it. What is produced depends on the ids alone, not on how they arrive, and the
    output's `text` is what was produced: the streamed deltas joined. That is `decode(ids)` (after
    the prompt's last ids) but where a byte-fallback decoder (SentencePiece's) turns a whole run of
    byte ids into U+FFFD once it holds an invalid sequence, text already produced for the run's
    first bytes (vLLM's stream keeps it too).

    With stop words, generation ends at the first id after which the produced text holds one of
    them ending past the text the first `min_tokens` ids produced (`protected`): as vLLM, a stop
    word that those ids write does not end the request, as their end ids are held back. Held text
    is searched once it is produced (vLLM's output text leaves it out until then). An id of
    `end_ids` (the request's end and stop ids) ends the output: its id is kept, its own text left
    out, as vLLM and TensorRT-LLM leave a stop token's text out by default; text held before it
    comes out as it is.
    """

    decode: Callable[[list[int]], str]
    stop_words: tuple[str, ...] = ()
    end_ids: frozenset[int] = frozenset()
    min_tokens: int = 0  # ids before which no stop word ends the output
    context: tuple[int, ...] = ()  # the prompt's last ids (`context_of`), the first ids are decoded after
    ids: list[int] = field(default_factory=list)  # the output's
    seen: list[int] = field(default_factory=list)  # context + ids: what prefix and read count in
    stopped: bool = False
    silent: int = 0  # the last ids without text of their own: 1 after an end id
    prefix: int = 0  # ids[prefix:read]: the context the next ids are decoded after
    read: int = 0  # ids whose text has been produced
    produced: list[str] = field(default_factory=list)  # the text produced, piece by piece
    sent: int = 0  # characters produced
    tail: str = ""  # the produced text's last characters, where a stop word could begin
    protected: int | None = None  # characters the first min_tokens ids produced; None: not all came

    def __post_init__(self) -> None:
        if self.min_tokens == 0:
            self.protected = 0
        self.seen = list(self.context)
        self.read = len(self.seen)

    def push(self, new_ids: list[int]) -> tuple[str, list[int]]:
        """Take ids a decode step emitted; return (new text, ids accepted into the output)."""
        kept: list[int] = []
        out = ""
        for token in new_ids:
            if self.stopped:
                break
            self.ids.append(token)
            self.seen.append(token)
            kept.append(token)
            if token in self.end_ids:
                self.silent, self.stopped = 1, True
            new = self._unread()
            if self.stopped:
                out += self._produce(new)
            elif new and not new.endswith("\ufffd"):
                self.stopped = self._holds_stop_word(new)
                out += self._produce(new)
            if len(self.ids) == self.min_tokens:
                self.protected = self.sent
        return out, kept

    def finish(self) -> str:
        """Text held back so far (an incomplete character at the very end)."""
        return self._produce(self._unread())

    @property
    def held(self) -> str:
        """Text of the ids not produced yet (ending in an incomplete character), as it decodes now."""
        return self._unread()

    @property
    def text(self) -> str:
        """The output's text: what was produced, and what is held."""
        return "".join(self.produced) + self._unread()

    def _holds_stop_word(self, new: str) -> bool:
        """Whether a stop word ends in `new` (text about to be produced) past `protected`."""
        if not self.stop_words or self.protected is None:
            return False
        window = self.tail + new  # a stop word can only end in the new text
        start = self.sent - len(self.tail)  # where `window` begins in the output's text
        return any(window.find(w, max(0, self.protected - start - len(w) + 1)) >= 0 for w in self.stop_words)

    def _unread(self) -> str:
        """The text of seen[read:] (but the silent ones), decoded after their context."""
        end = len(self.seen) - self.silent
        if self.read >= end:
            return ""
        context = self.decode(self.seen[self.prefix : self.read]) if self.read > self.prefix else ""
        return self.decode(self.seen[self.prefix : end])[len(context) :]

    def _produce(self, new: str) -> str:
        """Mark seen[read:] produced as `new`; the next ids are decoded after them."""
        self.prefix, self.read = self.read, len(self.seen)
        self.produced.append(new)
        self.sent += len(new)
        longest = max(map(len, self.stop_words), default=0)
        self.tail = (self.tail + new)[-(longest - 1):] if longest > 1 else ""
        return new


CONTEXT_IDS = 6  # the prompt ids an output is decoded after (vLLM's incremental detokenizer: 5-6)
CONTEXT_REACH = 96  # the most ids `context_of` reaches back for text that begins a character


def context_of(decode: Callable[[list[int]], str], prompt_ids: Sequence[int]) -> tuple[int, ...]:
    """The last ids of a prompt its output's text is decoded after (`TextStream.context`), so that
    the output's first piece reads as it does after the prompt: a SentencePiece decoder strips the
    space of a text's first word (`▁Sure` alone is "Sure"), which `decode(prompt + output)` and vLLM's
    text keep (" Sure"). Reaching further back (twice as far each time, CONTEXT_REACH ids at most)
    while they have no text (special tokens) or begin inside a character (U+FFFD: a byte-fallback
    decoder turns the whole run of byte ids that holds the cut into it); none where their text ends
    in an incomplete character (a prompt of ids cut inside one): the output's bytes are then read
    on their own."""
    reach = min(len(prompt_ids), CONTEXT_REACH)
    size = CONTEXT_IDS
    while size < reach:
        # a window and the 3 past it: one of them begins on a character (UTF-8's are 4 bytes at most)
        for start in range(size, min(size + 4, reach + 1)):
            text = decode(list(prompt_ids[-start:]))
            if text and not text.startswith("\ufffd"):
                context = list(prompt_ids[-start:])
                return () if text.endswith("\ufffd") else tuple(context)
        size *= 2
    context = list(prompt_ids[-reach:])
    return () if not context or decode(context).endswith("\ufffd") else tuple(context)


def produced_chars(decode: Callable[[list[int]], str], ids: list[int], context: tuple[int, ...] = ()) -> int:
    """How many characters of text `ids` produce in a `TextStream` (an incomplete character held at
    their end not counted): where a stop word may end once these ids were the first min_tokens."""
    stream = TextStream(decode, context=context)
    stream.push(ids)
    return stream.sent
