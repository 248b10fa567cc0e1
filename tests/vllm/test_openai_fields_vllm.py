"""The request-field table against the installed vLLM: a field vLLM adds fails here until it is
classified in dynamo/frontend/openai/fields.py, and the checked-in snapshot of the names (the
default suite's reference) must be this vLLM's (regenerate it with
scripts/snapshot_vllm_openai_fields.py)."""

from __future__ import annotations

import json

import pytest
from pydantic_core import PydanticUndefined
from snapshot_vllm_openai_fields import SNAPSHOT, installed_fields

from dynamo.frontend.openai.fields import (
    CHAT,
    COMPLETION,
    ENDPOINTS,
    FIELDS,
    VLLM_REMOVED,
    Treatment,
)

pytestmark = pytest.mark.vllm


def vllm_models() -> dict:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    return {CHAT: ChatCompletionRequest, COMPLETION: CompletionRequest}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_every_field_of_the_installed_vllm_is_classified(endpoint):
    names = set(vllm_models()[endpoint].model_fields)
    unclassified = names - set(FIELDS[endpoint])
    assert not unclassified, f"classify in dynamo/frontend/openai/fields.py: {unclassified}"
    assert set(FIELDS[endpoint]) - names == VLLM_REMOVED, "a field vLLM no longer has"


def test_the_snapshot_is_the_installed_vllms():
    snapshot = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    assert snapshot == installed_fields(), "run scripts/snapshot_vllm_openai_fields.py"


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_vllms_default_of_each_refused_field_asks_for_nothing(endpoint):
    """A client that sends vLLM's default of a refused field (some send every field) is served:
    the default is among the rule's neutral values."""
    for name, field in vllm_models()[endpoint].model_fields.items():
        rule = FIELDS[endpoint][name]
        if rule.treatment is not Treatment.REFUSED:
            continue
        if field.default_factory is not None:
            default, again = field.default_factory(), field.default_factory()  # type: ignore[call-arg]  # no-argument factories
            if default != again:  # a fresh id each time (request_id): no default to compare
                continue
        elif field.default is PydanticUndefined:
            continue
        else:
            default = field.default
        assert not rule.asks_for_something(default), (name, default)
