"""OpenAI's `/v1/conversations`: conversations and their items (`trtspec/openai/conversations.py`),
which a Responses request continues with `conversation`."""

from __future__ import annotations

from fastapi import FastAPI, Request

from trtspec.openai.conversations import (
    ConversationRequest,
    ConversationStore,
    ItemsRequest,
    checked_metadata,
    new_items,
)
from trtspec.openai.frontend import Frontend
from trtspec.openai.protocol import ApiError, parse
from trtspec.openai.responses import item_page, page_of


def add_routes(app: FastAPI, front: Frontend, conversations: ConversationStore) -> None:
    @app.post("/v1/conversations")
    async def create_conversation(request: Request):
        req = parse(ConversationRequest, await front.body(request))
        return conversations.create(new_items(req.items), checked_metadata(req.metadata)).body()

    @app.get("/v1/conversations/{cid}")
    async def retrieve_conversation(cid: str):
        return conversations.get(cid).body()

    @app.post("/v1/conversations/{cid}")
    async def update_conversation(cid: str, request: Request):
        req = parse(ConversationRequest, await front.body(request))
        thread = conversations.get(cid)
        if req.items is not None:
            raise ApiError("Invalid 'items': a conversation's items are added with POST "
                           f"/v1/conversations/{cid}/items.", "items", code="invalid_value")
        thread.metadata = checked_metadata(req.metadata)
        return thread.body()

    @app.delete("/v1/conversations/{cid}")
    async def delete_conversation(cid: str):
        conversations.delete(cid)
        return {"id": cid, "object": "conversation.deleted", "deleted": True}

    @app.post("/v1/conversations/{cid}/items")
    async def add_conversation_items(cid: str, request: Request):
        req = parse(ItemsRequest, await front.body(request))
        thread = conversations.get(cid)
        added = new_items(req.items, thread.calls())
        thread.items += added
        return item_page(added, "asc", None, max(len(added), 1))

    @app.get("/v1/conversations/{cid}/items")
    async def list_conversation_items(cid: str, request: Request):
        return page_of(conversations.get(cid).items, request.query_params)

    @app.get("/v1/conversations/{cid}/items/{item_id}")
    async def retrieve_conversation_item(cid: str, item_id: str):
        return conversations.get(cid).item(item_id)

    @app.delete("/v1/conversations/{cid}/items/{item_id}")
    async def delete_conversation_item(cid: str, item_id: str):
        thread = conversations.get(cid)
        thread.items.remove(thread.item(item_id))
        return thread.body()
