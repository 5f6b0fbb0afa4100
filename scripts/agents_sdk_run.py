"""OpenAI's Agents SDK (openai-agents) against a running `trtspec serve`: run by scripts/agents_sdk.sh
in the SDK's own venv. An agent with one function tool, run to its end each way the SDK offers —
`Runner.run`, `Runner.run_streamed`, a client-side `SQLiteSession`, `previous_response_id`, the
server's Conversations API (`OpenAIConversationsSession`, `conversation_id`), a structured
`output_type`, and the chat completions API — printing what each run ended with and what the SDK
sent.

The embedded model cannot do an agent's work, so the run is held to the protocol: turn 1 is under
tool_choice "required" (the SDK resets it after a call), so the model calls `add` and the SDK runs
it; turn 2 answers free text, which a stop list ends at once (the tiny model's free text runs to
its token limit, which the SDK takes as an error).

    python agents_sdk_run.py BASE_URL API_KEY
"""

import asyncio
import json
import sys

import httpx2
from agents import (
    Agent,
    ModelSettings,
    OpenAIConversationsSession,
    Runner,
    SQLiteSession,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from pydantic import BaseModel

base, key = sys.argv[1], sys.argv[2]
sent: list[tuple[str, dict]] = []  # (path, body) of every POST the SDK made


async def record(request) -> None:
    if request.method == "POST":
        sent.append((request.url.path, json.loads(request.content)))


client = AsyncOpenAI(base_url=f"{base}/v1", api_key=key,
                     http_client=httpx2.AsyncClient(event_hooks={"request": [record]}))
set_default_openai_client(client, use_for_tracing=False)
set_tracing_disabled(True)  # traces go to OpenAI's servers
calls: list[tuple[int, int]] = []


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    calls.append((a, b))
    return a + b


SETTINGS = ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=256, temperature=0,
                         extra_body={"stop": ["<<", "\n", "("]})
agent = Agent(name="calc", instructions="Arithmetic.", model="trtspec", tools=[add], model_settings=SETTINGS)


class Verdict(BaseModel):
    ok: bool


def items(result) -> list[str]:
    return [item.type for item in result.new_items]


async def main() -> dict:
    set_default_openai_api("responses")
    out = {}
    first = await Runner.run(agent, "What is 482 + 356?", max_turns=4)
    out["run"] = {"final": first.final_output, "items": items(first), "calls": list(calls)}
    streamed = Runner.run_streamed(agent, "What is 7 + 5?", max_turns=4)
    events = [event.type async for event in streamed.stream_events()]
    out["run_streamed"] = {"final": streamed.final_output, "items": items(streamed), "events": len(events)}
    session = SQLiteSession("local")
    await Runner.run(agent, "What is 1 + 2?", session=session, max_turns=4)
    again = await Runner.run(agent, "And 3 + 4?", session=session, max_turns=4)
    out["SQLiteSession"] = {"final": again.final_output, "kept": len(await session.get_items())}
    chained = await Runner.run(agent, "And 10 + 1?", previous_response_id=first.last_response_id, max_turns=4)
    out["previous_response_id"] = {"final": chained.final_output, "items": items(chained)}
    session = OpenAIConversationsSession()
    await Runner.run(agent, "What is 5 + 5?", session=session, max_turns=4)
    again = await Runner.run(agent, "And 6 + 6?", session=session, max_turns=4)
    out["OpenAIConversationsSession"] = {"final": again.final_output, "kept": len(await session.get_items())}
    conversation = await client.conversations.create()
    managed = await Runner.run(agent, "What is 9 + 9?", conversation_id=conversation.id, max_turns=4)
    kept = [item.type async for item in client.conversations.items.list(conversation.id, order="asc")]
    out["conversation_id"] = {"final": managed.final_output, "kept": kept}
    judge = Agent(name="judge", instructions="Answer in JSON.", model="trtspec", output_type=Verdict,
                  model_settings=ModelSettings(max_tokens=64, temperature=0))
    verdict = await Runner.run(judge, "Is 2 + 2 = 4?")
    out["output_type"] = {"final": repr(verdict.final_output)}
    set_default_openai_api("chat_completions")
    chat = await Runner.run(agent.clone(), "What is 6 + 1?", max_turns=4)
    out["chat_completions"] = {"final": chat.final_output, "items": items(chat)}
    out["sent"] = {"requests": len(sent), "paths": sorted({path.split("/conv_")[0] for path, _ in sent}),
                   "fields": sorted({k for path, body in sent if path.endswith("/responses") for k in body})}
    return out


print(json.dumps(asyncio.run(main()), indent=1))
