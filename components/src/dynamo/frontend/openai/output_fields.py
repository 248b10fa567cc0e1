"""vLLM's request fields that shape what the frontend returns, not what the engine samples.

``return_token_ids`` (both endpoints) and ``return_prompt_text`` (chat) put the prompt's ids and
text, and each choice's generated ids, in the response: the prompt's through
:meth:`~dynamo.frontend.openai.responses.Responder.return_prompt`, each choice's in
:mod:`dynamo.frontend.serving.choices` (the ids
:class:`~dynamo.frontend.serving.generation.Generation` keeps). ``spaces_between_special_tokens``
is the detokenizer's (:class:`~dynamo.frontend.processors.hf_processor.StreamDetokenizer`).
"""

from __future__ import annotations

from pydantic import BaseModel, StrictBool


class OutputFields(BaseModel):
    """Mixed into each endpoint's request model (``return_prompt_text``: the chat's own)."""

    # False (with skip_special_tokens false): no space between two added tokens, as vLLM.
    spaces_between_special_tokens: StrictBool | None = None

    # vLLM's: the prompt's ids and each choice's generated ids in the response.
    return_token_ids: StrictBool | None = None

    def returns_token_ids(self, parsed: bool) -> bool:
        """Whether each choice's ``token_ids`` are returned: asked for, and not hidden with the
        reasoning (``include_reasoning`` false on a parsed chat: vLLM hides them)."""
        hidden = parsed and getattr(self, "include_reasoning", None) is False
        return self.return_token_ids is True and not hidden

    def returned_prompt(
        self, prompt_ids: list[int], prompt_text: str
    ) -> tuple[list[int] | None, str | None]:
        """The prompt's ids and text for the response (None: not asked for)."""
        text = prompt_text if getattr(self, "return_prompt_text", None) is True else None
        return (list(prompt_ids) if self.return_token_ids is True else None), text
