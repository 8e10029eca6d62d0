"""Which adapter version a request names: `model` and `lora` fields -> a version or None.

    model "demo"             the base model alone (demo being model.id)
    model "support-bot"      the adapter support-bot's latest version
    model "demo:support-bot" the same, OpenAI-style fine-tune naming
    lora  "support-bot", "support-bot@<digest>" or "demo:support-bot"

A name is looked up as the caller sees it (adapters.registry.visibility): the caller's tenant's own
adapter of that name first, then the public one. The answer is the qualified version
`tenant/name@digest` the engine and the replicas' routing go by (Version.qualified), with
what its metadata says of it (its LoRA variants, for the metrics). Names resolve through the
registry on every request, so an upload is served by the next request and a deleted name
answers 404 at once. An adapter the caller may not see answers exactly as a missing one.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from adapters.errors import AdapterError, quoted
from adapters.registry.names import parse_ref, split_model
from adapters.registry.records import Version
from adapters.registry.visibility import resolve_for
from serving.api.core.adapter_errors import adapter_http_error
from serving.api.core.caller import Principal
from serving.api.core.errors import ApiError
from serving.api.core.settings import AppSettings


def adapter_from_model(settings: AppSettings, model: str) -> str | None:
    """The adapter reference an OpenAI `model` names, None for the base model; 404 if unknown."""
    if model == settings.model_id:
        return None
    base, name = split_model(model)
    if base is not None and base != settings.model_id:
        raise _model_not_found(model)
    try:
        parse_ref(name)
    except AdapterError:
        raise _model_not_found(model) from None
    return name


def adapter_from_lora(settings: AppSettings, lora: str) -> str:
    """The adapter reference a `lora` field names; 400 if malformed, 404 for another base."""
    base, name = split_model(lora)
    if base is not None and base != settings.model_id:
        raise ApiError(
            404,
            f"lora {quoted(lora)} names base model {quoted(base)}; this server serves "
            f"{settings.model_id!r}",
            code="model_not_found",
        )
    try:
        parse_ref(name)
    except AdapterError as exc:
        raise ApiError(400, f"lora: {exc}") from None
    return name


def pick_adapter(from_model: str | None, from_lora: str | None) -> str | None:
    """The one adapter named by `model` and/or `lora`; 400 when they disagree."""
    if from_model and from_lora and from_model != from_lora:
        raise ApiError(400, f"model names adapter {from_model!r} but lora names {from_lora!r}")
    return from_lora or from_model


async def resolve_version(
    settings: AppSettings, caller: Principal, ref: str | None
) -> Version | None:
    """'name' or 'name@digest' as caller sees it -> its version (None for no ref); 404 when
    the caller has no such adapter, 503 when the registry cannot be read."""
    if ref is None:
        return None
    try:
        return await run_in_threadpool(resolve_for, settings.registry, caller.tenant, ref)
    except AdapterError as exc:  # a malformed reference is named by the registry's check
        raise adapter_http_error(exc) from None


def _model_not_found(model: str) -> ApiError:
    # quoted: a client's model string may be megabytes long
    return ApiError(404, f"the model {quoted(model)} does not exist", code="model_not_found")
