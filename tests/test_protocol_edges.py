"""The edges of the OpenAI request checks (`trtspec.openai.protocol`) without a server: what a request
that leaves a parameter out gets, each range's own ends taken and the first value past them refused
naming the parameter, the prompts a completion's `prompt` holds, the guide each structured-output field
asks for. Each case was a change to the module that every other fast test passed (scripts/mutants.py);
the served requests are in test_openai."""

from __future__ import annotations

import pytest

from trtspec.openai.protocol import (
    FLOAT32_TINY,
    MAX_CHOICES,
    MAX_TEMPLATE_DEPTH,
    ApiError,
    ChatRequest,
    CompletionRequest,
    TokenizeRequest,
    check_chat,
    check_completion,
    compact_json_wanted,
    guide_of,
    parse,
    renamed,
)

VOCAB = 264
GOOD_CHAT = {"model": "trtspec", "messages": [{"role": "user", "content": "1 + 2"}], "max_tokens": 4}
GOOD_COMPLETION = {"model": "trtspec", "prompt": "Q: 1 + 2\nA:", "max_tokens": 4}


def _request(endpoint: str, change: dict):
    chat = endpoint == "chat"
    return parse(ChatRequest if chat else CompletionRequest, {**(GOOD_CHAT if chat else GOOD_COMPLETION),
                                                              **change})


def _refused(endpoint: str, change: dict) -> str | None:
    """The parameter check_chat or check_completion refuses (None: taken)."""
    request = _request(endpoint, change)
    try:
        (check_chat if endpoint == "chat" else check_completion)(request, VOCAB)
    except ApiError as exc:
        return exc.param
    return None


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_parameter_left_out_has_openais_default(endpoint):
    """Left out, the sampling parameters are OpenAI's and vLLM's defaults: one choice, no stream,
    no penalty, the end of sequence ends the text, a stop sequence is cut from it."""
    request = _request(endpoint, {})
    assert (request.n, request.stream, request.stream_options) == (1, False, None)
    assert (request.temperature, request.top_p, request.top_k, request.min_p, request.seed) == (None,) * 5
    assert (request.presence_penalty, request.frequency_penalty, request.repetition_penalty) == (0, 0, None)
    assert request.ignore_eos is False and request.include_stop_str_in_output is False
    assert request.logprobs is None and request.logit_bias is None and request.stop is None
    if endpoint == "completions":
        assert request.echo is False  # the completion alone, not the prompt before it
    usage = _request(endpoint, {"stream": True, "stream_options": {"include_usage": True}}).stream_options
    assert usage.continuous_usage_stats is False  # the usage in the last chunk only
    no_usage = _request(endpoint, {"stream": True, "stream_options": {}}).stream_options
    assert no_usage.include_usage is False  # stream_options without include_usage: no usage chunk


def test_a_tokenize_request_left_alone_opens_the_assistants_turn_and_sends_ids_only():
    """/tokenize's defaults as vLLM's: the chat template opens the assistant's turn (the one value
    served) and the answer holds the token ids without their texts."""
    request = parse(TokenizeRequest, {"messages": GOOD_CHAT["messages"]})
    assert request.add_generation_prompt is True and request.return_token_strs is False


def _nested(depth: int) -> dict:
    value: object = 0
    for _ in range(depth):
        value = {"a": value}
    return value


EDGES = [  # (endpoint, change taken, change refused, the parameter named)
    ("completions", {"top_p": 1}, {"top_p": 1.0000001}, "top_p"),
    # FLOAT32_TINY itself rounds to the float32 0 (half the smallest, to even)
    ("chat", {"top_p": 7.1e-46}, {"top_p": FLOAT32_TINY}, "top_p"),
    # max_tokens beside its newer name: the same value taken, another refused
    ("chat", {"max_tokens": 4, "max_completion_tokens": 4}, {"max_tokens": 4, "max_completion_tokens": 5},
     "max_completion_tokens"),
    # prompts × n choices, at most MAX_CHOICES
    ("completions", {"prompt": ["a", "b"], "n": MAX_CHOICES // 2},
     {"prompt": ["a", "b"], "n": MAX_CHOICES // 2 + 1}, "prompt"),
    ("completions", {"prompt": ["a"] * MAX_CHOICES}, {"prompt": ["a"] * (MAX_CHOICES + 1)}, "prompt"),
    # an empty prompt, or a token id outside the vocabulary, named by its place among several
    ("completions", {"prompt": "a"}, {"prompt": ""}, "prompt"),
    ("completions", {"prompt": ["a", "b"]}, {"prompt": ["a", ""]}, "prompt[1]"),
    ("completions", {"prompt": [[1, 2], [3, 263]]}, {"prompt": [[1, 2], [3, 264]]}, "prompt[1]"),
    ("completions", {"prompt": [0, 263]}, {"prompt": [0, 264]}, "prompt"),
    ("completions", {"prompt": [[0]]}, {"prompt": []}, "prompt"),
    # the chat template's variables nest at most MAX_TEMPLATE_DEPTH deep (the object itself is 1)
    ("chat", {"chat_template_kwargs": _nested(MAX_TEMPLATE_DEPTH)},
     {"chat_template_kwargs": _nested(MAX_TEMPLATE_DEPTH + 1)}, "chat_template_kwargs"),
    # min_tokens alone taken, beside a structured output refused (the format decides where it ends)
    ("chat", {"min_tokens": 2}, {"min_tokens": 2, "response_format": {"type": "regex", "regex": "[0-9]+"}},
     "min_tokens"),
    # one candidate per request: best_of 1 taken (OpenAI's default), 2 refused
    ("completions", {"best_of": 1}, {"best_of": 2}, "best_of"),
    # n null is one choice a prompt, as n left out
    ("completions", {"prompt": ["a"] * MAX_CHOICES, "n": None},
     {"prompt": ["a"] * (MAX_CHOICES + 1), "n": None}, "prompt"),
]


@pytest.mark.parametrize("endpoint, taken, refused, param", EDGES, ids=[str(i) for i in range(len(EDGES))])
def test_each_bound_is_taken_and_a_step_past_it_refused_by_name(endpoint, taken, refused, param):
    assert _refused(endpoint, taken) is None
    assert _refused(endpoint, refused) == param


@pytest.mark.parametrize("prompt", ["Q: 1 + 2\nA:", ["Q: 1", "Q: 2"], [7, 8, 9], [[7, 8], [9]]])
def test_a_completions_prompt_is_one_prompt_or_a_list_of_them(prompt):
    """A text or one list of token ids is one prompt (a text is not a list of its characters)."""
    prompts = check_completion(_request("completions", {"prompt": prompt}), VOCAB)
    assert prompts == ([prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else prompt)


GUIDES = [  # the structured-output field, what it asks, and the guide (None: refused, naming the param)
    ({"response_format": {"type": "regex", "regex": "[0-9]+"}}, ("regex", "[0-9]+"), None),
    ({"response_format": {"type": "ebnf", "ebnf": 'root ::= "a"'}}, ("ebnf_grammar", 'root ::= "a"'), None),
    ({"response_format": {"type": "json", "schema": {"type": "integer"}}},
     ("json_schema", '{"type": "integer"}'), None),
    ({"response_format": {"type": "regex", "regex": ""}}, None, "response_format.regex"),
    ({"response_format": {"type": "json", "schema": "{}"}}, None, "response_format.schema"),
    ({"guided_choice": ["yes", "no"]}, ("ebnf_grammar", 'root ::= "yes" | "no"'), None),
    # a choice's character as itself, not JSON's \u escapes (an emoji's would be a surrogate pair)
    ({"guided_choice": ["oui", "\U0001f600"]}, ("ebnf_grammar", 'root ::= "oui" | "\U0001f600"'), None),
    ({"guided_choice": []}, None, "guided_choice"),
    ({"guided_choice": ["yes", ""]}, None, "guided_choice"),
    ({"guided_json": '{"type": "integer"}'}, ("json_schema", '{"type": "integer"}'), None),
    ({"guided_json": ""}, None, "guided_json"),
    ({"structured_outputs": {"json": 5}}, None, "structured_outputs.json"),
    ({"structured_outputs": {"json_object": 1}}, None, "structured_outputs.json_object"),
    # structured_outputs of options alone is no second guide: they shape response_format's
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"disable_any_whitespace": True}},
     ("json", ""), None),
    # two fields that each ask for one: refused, naming the second
    ({"guided_regex": "[0-9]+", "guided_choice": ["yes", "no"]}, None, "guided_choice"),
    # a response_format type of none of ours, or text with a field of another type's, named
    ({"response_format": {"type": "xml"}}, None, "response_format.type"),
    ({"response_format": {"type": "text", "schema": {}}}, None, "response_format.schema"),
    # OpenAI's json_schema: its schema an object, one left out named
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "n", "schema": {"type": "integer"}}}},
     ("json_schema", '{"type": "integer"}'), None),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}, None,
     "response_format.json_schema.schema"),
]


@pytest.mark.parametrize("change, guide, param", GUIDES, ids=[str(i) for i in range(len(GUIDES))])
def test_a_structured_output_is_its_guide_or_refused_by_name(change, guide, param):
    request = _request("chat", change)
    if param is None:
        assert guide_of(request) == guide
        compact = change.get("structured_outputs", {}).get("disable_any_whitespace")
        assert compact_json_wanted(request) == compact
        return
    with pytest.raises(ApiError) as refused:
        guide_of(request)
    assert refused.value.param == param, refused.value.message


def test_a_refusal_naming_no_parameter_is_renamed_naming_none():
    """A chat refusal without a parameter (a body that is no object) stays without one when another
    API's names replace chat's."""
    got = renamed(ApiError("the request body must be a JSON object"), ())
    assert (got.param, got.message, got.status) == (None, "the request body must be a JSON object", 400)


def test_a_content_part_whose_text_is_no_string_is_named_by_its_place():
    """A text part whose `text` is no string (a number) is named by its own place in the content, as
    a part that is no object or has no type is (not as the first part)."""
    with pytest.raises(ApiError) as refused:
        parse(ChatRequest, {**GOOD_CHAT, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": 5}]}]})
    assert refused.value.param == "messages[0].content[1]"
