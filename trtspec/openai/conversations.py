"""OpenAI's Conversations API (`/v1/conversations`): a conversation's items kept by the server, so
that a client sends only its new turn (OpenAI's Agents SDK's `OpenAIConversationsSession`, a
Responses request's `conversation`).

A conversation holds items as the Responses API writes them (responses.py): messages, function
calls and their outputs, reasoning; each with an id and a status, a message's text as content
parts (`input_text` for the user's, system's and developer's, `output_text` for the assistant's).
`POST /v1/conversations` creates one (with up to MAX_ADDED items and `metadata`), `GET`, `POST`
(its metadata replaced) and `DELETE /v1/conversations/{id}` read, update and drop it;
`/items` lists its items (newest first, pages as the Responses input items'), adds up to
MAX_ADDED, and `/items/{item_id}` reads or drops one. A response created with `conversation`
continues it: its items come before the request's input, and once the response has completed
(or ran out of tokens: incomplete) its input and output items are added. The last
STORE_CAPACITY conversations are kept in the server's memory.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from trtspec.openai.protocol import ApiError, _Forbid
from trtspec.openai.responses import input_items, input_messages

STORE_CAPACITY = 1000  # conversations kept, the oldest dropped first
MAX_ADDED = 20  # items a request may add at once (OpenAI's limit)
MAX_METADATA = 16  # metadata pairs (OpenAI's limits), keys of 64 characters, values of 512
TEXT_PART = {"assistant": "output_text"}  # the part a message's text becomes, by role (else input_text)


class ConversationRequest(_Forbid):
    """`POST /v1/conversations` (and `POST /v1/conversations/{id}`: metadata only)."""

    items: list | None = Field(None, description=f"up to {MAX_ADDED} items to start it with, as a Responses "
                               "request's input items")
    metadata: dict | None = Field(None, description=f"up to {MAX_METADATA} string pairs")


class ItemsRequest(_Forbid):
    """`POST /v1/conversations/{id}/items`."""

    items: list = Field(description=f"up to {MAX_ADDED} items to add, as a Responses request's input items")


@dataclass
class Conversation:
    id: str
    created_at: int
    metadata: dict
    items: list[dict] = field(default_factory=list)

    def body(self) -> dict:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at,
                "metadata": self.metadata}

    def item(self, item_id: str) -> dict:
        found = next((item for item in self.items if item["id"] == item_id), None)
        if found is None:
            raise ApiError(f"Item with id '{item_id}' not found in conversation '{self.id}'.", status=404,
                           code="not_found")
        return found

    def calls(self) -> set[str]:
        """The call ids of its function_call items (not those cut short), which added items' outputs may
        answer (read from the items: an output whose call was deleted does not refuse new items)."""
        return {item["call_id"] for item in self.items
                if item.get("type") == "function_call" and item.get("status") != "incomplete"}

    def messages(self) -> list[dict]:
        """Its items as the chat messages a response continues (each function call output answering
        a call among them: one whose call was deleted is refused, naming the conversation)."""
        return input_messages(self.items, "conversation", calls=set()) if self.items else []


def checked_metadata(metadata: dict | None) -> dict:
    """`metadata` as OpenAI takes it: at most MAX_METADATA pairs of strings (keys up to 64
    characters, values up to 512)."""
    metadata = metadata or {}
    if len(metadata) > MAX_METADATA:
        raise ApiError(f"Invalid 'metadata': {len(metadata)} pairs; at most {MAX_METADATA}.", "metadata",
                       code="invalid_value")
    for key, value in metadata.items():
        if len(key) > 64 or not isinstance(value, str) or len(value) > 512:
            raise ApiError(f"Invalid 'metadata.{key[:64]}': keys are strings of at most 64 characters, "
                           "values strings of at most 512.", f"metadata.{key[:64]}", code="invalid_value")
    return metadata


def new_items(given: list | None, calls: set[str] | None = None) -> list[dict]:
    """A request's `items` (at most MAX_ADDED) as a conversation keeps them (`kept_items`), checked
    as a response's input is (an ApiError names the item), each function call output answering a
    call among them or `calls` (the conversation's, `calls_made`)."""
    if not given:
        return []
    if len(given) > MAX_ADDED:
        raise ApiError(f"Invalid 'items': {len(given)} items; at most {MAX_ADDED} at a time.", "items",
                       code="invalid_value")
    input_messages(given, "items", calls=set(calls or ()))  # refuses what a response would not take
    return kept_items(given)


def kept_items(given: str | list) -> list[dict]:
    """Checked input items (a response's input: `given`, a text or items) as a conversation keeps
    them: each with an id and a status, a message's text as content parts."""
    kept = []
    for item in input_items(given):
        item = {**item, "status": item.get("status") or "completed"}
        if item["type"] == "message" and isinstance(item["content"], str):
            item["content"] = [{"type": TEXT_PART.get(item["role"], "input_text"), "text": item["content"]}]
        kept.append(item)
    return kept


def conversation_id(given: Any) -> str:
    """A Responses request's `conversation`: an id, or {"id": ...}."""
    if isinstance(given, dict) and set(given) == {"id"}:
        given = given["id"]
    if not isinstance(given, str):
        raise ApiError("Invalid 'conversation': expected a conversation's id or {\"id\": ...}.",
                       "conversation", code="invalid_type")
    return given


class ConversationStore:
    """The last `capacity` conversations."""

    def __init__(self, capacity: int = STORE_CAPACITY):
        self.capacity = capacity
        self._kept: OrderedDict[str, Conversation] = OrderedDict()

    def create(self, items: list[dict], metadata: dict) -> Conversation:
        conversation = Conversation(f"conv_{uuid.uuid4().hex}", int(time.time()), metadata, items)
        self._kept[conversation.id] = conversation
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)
        return conversation

    def get(self, cid: str, param: str | None = None) -> Conversation:
        if cid not in self._kept:
            raise ApiError(f"Conversation with id '{cid}' not found (conversations are kept in this server's "
                           f"memory, the last {self.capacity}).", param, status=404, code="not_found")
        return self._kept[cid]

    def delete(self, cid: str) -> None:
        self.get(cid)
        del self._kept[cid]
