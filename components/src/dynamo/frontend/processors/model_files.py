"""What a model card can make the frontend read (docs/design.md, trust model).

A card comes from a discovery record, a peer's words: it names a tokenizer directory and,
perhaps, a chat template file, and the frontend builds the model's processor from them. So the
frontend reads only what it needs, through :class:`ModelFiles`:

* **Known files only.** From the tokenizer directory, the few files a tokenizer and its
  template are made of (:data:`LIBRARY_FILES`), each resolved (``..`` and symlinks followed) and
  required to stay inside the model's own directory: the tokenizer directory itself, or the
  repository directory of a Hugging Face cache snapshot (whose files are links to
  ``../../blobs``). The chat template file a card names (vLLM's ``--chat-template``) must be
  a Jinja file once resolved (:mod:`dynamo.runtime.template_files`, whose rules the worker
  checks its own ``--chat-template`` by).
* **Regular files, bounded.** Each is opened without following a last link and without
  blocking (a FIFO or a device is refused, never read), and read up to its bound
  (:data:`MAX_TOKENIZER_BYTES`, :data:`MAX_CONFIG_BYTES`, the template's
  ``MAX_TEMPLATE_BYTES``).
* **The operator's directories.** With ``--dyn-model-dirs`` / ``DYN_MODEL_DIRS`` (directories
  separated by ``:``), the tokenizer directory, every file read from it and the chat template
  must resolve inside one of them; a card naming anything else is refused (its model is not
  served, one WARNING). The option only adds rules: the template must still be a Jinja file.
  Unset (the default, so existing deployments keep working) any directory may hold a model;
  docs/operator-guide.md says what that allows. A value that would confine nothing (empty,
  only separators) or names a path that is not a directory is refused at parse time
  (:class:`ModelDirectories`), never read as "no confinement".

A card that breaks any of this is a :class:`ModelFilesError`, which refuses its model.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from dynamo.runtime import peer_text
from dynamo.runtime.template_files import is_jinja_file, not_jinja

MAX_TOKENIZER_BYTES = 256 * 1024 * 1024  # the largest real tokenizer.json are ~35 MB
MAX_CONFIG_BYTES = 16 * 1024 * 1024  # tokenizer_config.json, with its added tokens
# What a processor's library (tokenizers, transformers through vLLM or SGLang) reads from a
# tokenizer directory; each is checked before the library opens it.
LIBRARY_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "config.json",
    "generation_config.json",
)
MODEL_DIRS_OPTION = "--dyn-model-dirs / DYN_MODEL_DIRS"


class ModelFilesError(ValueError):
    """The model directory lacks a file the processor needs, or one cannot be read (or may not
    be: see the module docstring)."""


class ModelDirectories:
    """The value kind of ``--dyn-model-dirs``: ``:``-separated directories, each of which must
    exist and be a directory when the option is parsed, resolved (links followed) once there.

    A value that lists no directory is refused rather than read as "any directory": the option
    exists to confine, so a typo must not silently lift the confinement."""

    def parse(self, text: str) -> tuple[str, ...]:
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
            raise ValueError("directory list must not hold control characters")
        parts = [part for part in text.split(os.pathsep) if part.strip()]
        if not parts:
            raise ValueError(
                "names no directory (an empty list would confine nothing; unset the option to "
                "allow any directory)"
            )
        resolved = []
        for part in parts:
            path = Path(part)
            if not path.exists():
                raise ValueError(f"{part!r} does not exist")
            if not path.is_dir():
                raise ValueError(f"{part!r} is not a directory")
            resolved.append(str(path.resolve()))
        return tuple(resolved)

    def describe(self) -> str:
        return "existing directories, separated by ':'"


class ModelFiles:
    """One card's tokenizer directory, as the frontend may read it (see the module docstring).
    ``model_dirs``: the operator's ``--dyn-model-dirs`` (empty: any directory)."""

    def __init__(self, tokenizer_dir: str | os.PathLike, model_dirs: Sequence[str] = ()) -> None:
        self._roots = [Path(d).resolve() for d in model_dirs]
        directory = _resolve(tokenizer_dir, "tokenizer directory")
        if not directory.is_dir():
            raise ModelFilesError(f"tokenizer directory {_say(tokenizer_dir)} is not a directory")
        self.directory = directory
        self._root = (
            self._allowed(directory, "tokenizer directory") if self._roots else _own(directory)
        )

    def _allowed(self, path: Path, what: str) -> Path:
        """The operator's directory that holds ``path`` (resolved), or ModelFilesError."""
        for root in self._roots:
            if path.is_relative_to(root):
                return root
        raise ModelFilesError(
            f"{what} {_say(path)} is outside the directories the frontend may load models from "
            f"({MODEL_DIRS_OPTION}: {_say(os.pathsep.join(map(str, self._roots)))})"
        )

    def file(self, name: str) -> Path | None:
        """The file ``name`` of the tokenizer directory, resolved and confined; None if absent."""
        path = self.directory / name
        if not os.path.lexists(path):
            return None
        resolved = path.resolve()
        if not resolved.is_relative_to(self._root):
            raise ModelFilesError(
                f"{_say(path)} leads outside the model's directory {_say(self._root)} "
                f"(to {_say(resolved)})"
            )
        return resolved

    def template(self, named: str) -> Path:
        """The chat template file a card names, resolved: a Jinja file, inside the operator's
        directories when they are set."""
        resolved = _resolve(named, "chat template")
        if self._roots:
            self._allowed(resolved, "chat template")
        if not is_jinja_file(resolved):
            raise ModelFilesError(
                not_jinja(f"chat template {_say(named)}")
                + ("" if str(resolved) == named else f": it resolves to {_say(resolved)}")
            )
        if not resolved.exists():
            raise ModelFilesError(f"chat template {_say(named)} does not exist")
        return resolved

    def check_library_files(self) -> None:
        """Each of :data:`LIBRARY_FILES` present is confined, regular and bounded (before a
        library that opens files by itself is pointed at the directory)."""
        for name in LIBRARY_FILES:
            path = self.file(name)
            if path is not None:
                self.read(path, MAX_TOKENIZER_BYTES, content=False)

    def read(self, path: Path, limit: int, *, content: bool = True) -> bytes:
        """A regular file's bytes, at most ``limit`` (``content=False``: only checked)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ModelFilesError(f"cannot open {_say(path)}: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ModelFilesError(f"{_say(path)} is not a regular file")
            if info.st_size > limit:
                raise ModelFilesError(
                    f"{_say(path)} is {info.st_size} bytes, over the frontend's bound of {limit}"
                )
            if not content:
                return b""
            with os.fdopen(os.dup(fd), "rb") as handle:
                data = handle.read(limit + 1)
        except OSError as exc:
            raise ModelFilesError(f"cannot read {_say(path)}: {exc.strerror}") from None
        finally:
            os.close(fd)
        if len(data) > limit:
            raise ModelFilesError(f"{_say(path)} grew over the frontend's bound of {limit} bytes")
        return data

    def read_text(self, path: Path, limit: int) -> str:
        try:
            return self.read(path, limit).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ModelFilesError(f"{_say(path)} is not UTF-8 text: {exc.reason}") from None


def as_files(directory: str | os.PathLike | ModelFiles) -> ModelFiles:
    return directory if isinstance(directory, ModelFiles) else ModelFiles(directory)


def _resolve(path: str | os.PathLike, what: str) -> Path:
    """``path`` with every link and ``..`` resolved (a NUL byte, a loop: ModelFilesError)."""
    try:
        return Path(path).resolve()
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelFilesError(f"{what} {_say(path)} cannot be resolved: {exc}") from None


def _own(directory: Path) -> Path:
    """The model's own directory: the tokenizer directory, or the repository directory of a
    Hugging Face cache snapshot (``models--org--name/snapshots/<revision>``)."""
    if directory.parent.name == "snapshots" and directory.parent.parent.name.startswith("models--"):
        return directory.parent.parent
    return directory


def _say(value: object) -> str:
    return peer_text.escape(value, 300)
