"""What a chat template file must be for a frontend to render it, declared once for both sides:
the frontend reads a card's template under these rules
(:mod:`dynamo.frontend.processors.model_files`), and the worker checks its own
``--chat-template`` against them at start-up, so a template every frontend would refuse exits 2
there instead of the worker saying it serves a model no frontend serves."""

from __future__ import annotations

from pathlib import Path

MAX_TEMPLATE_BYTES = 1024 * 1024  # real chat templates are a few KB
# A record cannot have an arbitrary file (a key, /proc/self/environ) rendered into prompts: the
# template must be a Jinja file once every link is resolved.
TEMPLATE_SUFFIXES = (".jinja", ".jinja2", ".j2")


def is_jinja_file(resolved: Path) -> bool:
    """Whether ``resolved`` (links already followed) has a Jinja file's suffix."""
    return resolved.suffix.lower() in TEMPLATE_SUFFIXES


def not_jinja(shown: str) -> str:
    """Why a template named ``shown`` (already escaped as the caller shows it) is refused."""
    return f"{shown} is not a Jinja file ({', '.join(TEMPLATE_SUFFIXES)})"


def too_large(shown: str, size: int) -> str:
    """Why a template file of ``size`` bytes is refused."""
    return f"{shown} is {size} bytes, over the frontend's bound of {MAX_TEMPLATE_BYTES}"
