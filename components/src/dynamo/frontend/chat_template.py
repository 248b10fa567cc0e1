"""A ChatML-style chat template: OpenAI messages -> one prompt string.

Real models ship a Jinja template; this one is fixed strings, which is enough to exercise the
path (render, tokenise, route) and to give each model's processor its template objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class ChatTemplate:
    message_template: str = "<|im_start|>{role}\n{content}<|im_end|>\n"
    generation_prompt: str = "<|im_start|>assistant\n"
    default_system_prompt: str | None = None
    stop_strings: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>")
    roles: tuple[str, ...] = field(default=ROLES)

    def render(
        self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True
    ) -> str:
        parts = []
        if self.default_system_prompt and not any(m.role == "system" for m in messages):
            parts.append(
                self.message_template.format(role="system", content=self.default_system_prompt)
            )
        for message in messages:
            if message.role not in self.roles:
                raise ValueError(f"role {message.role!r} is not one of {', '.join(self.roles)}")
            parts.append(self.message_template.format(role=message.role, content=message.content))
        if add_generation_prompt:
            parts.append(self.generation_prompt)
        return "".join(parts)
