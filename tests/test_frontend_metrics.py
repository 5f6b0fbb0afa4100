"""The OpenAI frontend's own counters (`trtspec.openai.metrics`) without a server: refusals keyed by
parameter with list positions collapsed, labels escaped, only 4xx refusals counted by parameter.
Served, they are in test_openai."""

from __future__ import annotations

from trtspec.openai.metrics import MAX_PARAM_CHARS, FrontendMetrics


def test_refusals_are_counted_by_parameter_with_positions_collapsed():
    metrics = FrontendMetrics()
    metrics.observe("/v1/chat/completions", 200)
    metrics.observe("/v1/chat/completions", 400, "messages[3].content[0].type")
    metrics.observe("/v1/chat/completions", 400, "messages[12].content[7].type")
    metrics.observe("/v1/responses", 400, "tools[1].tools[0].parameters")
    metrics.observe("/v1/messages", 503, "model")  # not a refusal of the request: counted, no parameter
    metrics.observe("other", 404)
    assert metrics.refusals == {("/v1/chat/completions", "messages[].content[].type"): 2,
                                ("/v1/responses", "tools[].tools[].parameters"): 1}
    assert metrics.requests[("/v1/chat/completions", "400")] == 2 and metrics.requests[("other", "404")] == 1
    text = metrics.exposition()
    line = 'trtspec_frontend_refusals_total{route="/v1/chat/completions",param="messages[].content[].type"} 2'
    assert line in text.splitlines()
    assert text.index("# TYPE trtspec_frontend_requests_total counter") < \
        text.index("trtspec_frontend_requests_total{")


def test_a_clients_field_name_is_escaped_and_bounded_in_its_label():
    metrics = FrontendMetrics()
    metrics.observe("/v1/chat/completions", 400, 'we"ird\\field\n' + "x" * 500)
    lines = metrics.exposition().splitlines()
    (line,) = [line for line in lines if line.startswith("trtspec_frontend_refusals")]
    label = line.split('param="', 1)[1].rsplit('"}', 1)[0]
    assert label.startswith('we\\"ird\\\\field\\n') and len(label) <= MAX_PARAM_CHARS + 3
