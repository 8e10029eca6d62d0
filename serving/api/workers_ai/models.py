"""Workers AI's model catalogue, as far as its clients need it: the one served model.

GET /ai/models/search   ?search=&task=&page=&per_page= (Cloudflare's paged list)
GET /ai/models/schema   ?model=  its input (the body /ai/run takes) and output schemas
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from adapters.errors import quoted
from serving.api.core.caller import Principal, authenticate
from serving.api.core.context import ApiContext, api_context
from serving.api.core.errors import ApiError
from serving.api.workers_ai.envelope import envelope, paged
from serving.api.workers_ai.schemas import WorkersAIRequest

router = APIRouter(tags=["Workers AI models"])
Ctx = Annotated[ApiContext, Depends(api_context)]
Caller = Annotated[Principal, Depends(authenticate)]
TASK = {"id": "text-generation", "name": "Text Generation",
        "description": "Text generation, with a LoRA adapter per request"}  # fmt: skip
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens")
CALL = {"type": "object", "properties": {"name": {"type": "string"}, "arguments": {}}}
OUTPUT = {
    "type": "object",
    "additionalProperties": False,
    "description": "The `result` of POST /ai/run/{model}",
    "properties": {
        "response": {"type": "string", "description": "The generated text."},
        "tool_calls": {"type": "array", "items": CALL},
        "usage": {"type": "object", "properties": {k: {"type": "integer"} for k in USAGE_KEYS}},
    },
    "required": ["response", "usage"],
}


@router.get("/ai/models/search", summary="Search the model catalogue (Workers AI)")
async def search(
    ctx: Ctx,
    caller: Caller,
    search: Annotated[str | None, Query(max_length=256)] = None,
    task: Annotated[str | None, Query(max_length=256)] = None,
    page: Annotated[int, Query(ge=1)] = 1,
    per_page: Annotated[int, Query(ge=1, le=1000)] = 50,
):
    model_id = ctx.settings.model_id
    entry = {"id": model_id, "name": model_id, "source": 1, "description":
             "The served base model; each finetune of this account runs on it as `lora`.",
             "task": TASK, "tags": [], "properties": [{"property_id": "lora", "value": "true"}]}  # fmt: skip
    found = [entry]
    if search is not None and search.lower() not in model_id.lower():
        found = []
    if task is not None and task.lower() not in (TASK["id"], TASK["name"].lower()):
        found = []
    return paged(found, page, per_page)


@router.get("/ai/models/schema", summary="A model's input and output schemas (Workers AI)")
async def schema(ctx: Ctx, caller: Caller, model: Annotated[str, Query(max_length=256)]):
    if model != ctx.settings.model_id:
        raise ApiError(404, f"unknown model {quoted(model)}; this server serves "
                            f"{ctx.settings.model_id!r}")  # fmt: skip
    body = WorkersAIRequest.model_json_schema()
    body.setdefault("description", "The body of POST /ai/run/{model}")
    body["additionalProperties"] = False
    return envelope({"input": body, "output": OUTPUT})
