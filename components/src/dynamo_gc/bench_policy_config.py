"""The self-benchmark GC policy's configuration, and what this interpreter lets it do.

Its two options (``--fpm-gc-policy`` / ``DYN_FPM_GC_POLICY`` and
``--fpm-gc-freeze-interval-s`` / ``DYN_FPM_GC_FREEZE_INTERVAL_S``) are declared here, with the
policy; a worker adds them to its own surface and reads the policy from its options; a rank (a
process vLLM starts, which never sees the command line) reads it from the environment the worker
exports (:func:`policy_env`), where a bad value is warned about and the default used rather than
killing the rank. What the interpreter build lets the policy do (free-threaded, CPython
3.14.0-3.14.4's incremental collector) is :mod:`dynamo_gc.gc_builds`'s to say.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dynamo_gc.configuration.options import Option, choice_option, seconds_option
from dynamo_gc.configuration.values import Choice

logger = logging.getLogger("dynamo_gc.bench_policy")  # the policy's lines, wherever they start


POLICY_OFF = "off"
POLICY_FREEZE = "freeze"


@dataclass(frozen=True)
class PolicyWord(Choice):
    """``off`` or ``freeze``, in any case and with blanks around it, as upstream Dynamo reads
    ``DYN_FPM_GC_POLICY`` (it strips and lowercases). Any other word is refused, where upstream
    would take it for off."""

    words: tuple[str, ...] = (POLICY_OFF, POLICY_FREEZE)

    def parse(self, text: str) -> str:
        return super().parse(text.strip().lower())

    def describe(self) -> str:
        return super().describe() + " (any case)"


FPM_GC_POLICY = choice_option(
    "fpm-gc-policy",
    "DYN_FPM_GC_POLICY",
    POLICY_OFF,
    (
        "GC policy during the self-benchmark: 'freeze' disables automatic gen2 collections and "
        "freezes the heap so no full-collection pause lands in a measured window; everything is "
        "restored before serving"
    ),
    kind=PolicyWord(),
)

FPM_GC_FREEZE_INTERVAL_S = seconds_option(
    "fpm-gc-freeze-interval-s",
    "DYN_FPM_GC_FREEZE_INTERVAL_S",
    60.0,
    (
        "With the 'freeze' policy: how often a background thread moves survivors into the "
        "permanent generation (a bare gc.freeze(), no heap walk)"
    ),
    minimum=1.0,
)


@dataclass(frozen=True)
class PolicyConfig:
    """The policy as an operator configured it (``--fpm-gc-policy`` and its interval)."""

    policy: str = FPM_GC_POLICY.default
    interval_s: float = FPM_GC_FREEZE_INTERVAL_S.default

    @property
    def enabled(self) -> bool:
        return self.policy == POLICY_FREEZE


def _read_env_option(environ: Mapping[str, str], option: Option) -> Any:
    text = environ.get(option.env_var)
    if text is None:
        return option.default
    kind = option.kind
    assert kind is not None, "the policy's options have value kinds"
    try:
        return kind.parse(text)
    except ValueError as exc:
        # A rank never sees the command line and must not die over a value the main process
        # would have rejected at start-up: say so and carry on with the default.
        logger.warning(
            "Ignoring %s=%r (%s); using the default %s",
            option.env_var,
            text,
            exc,
            option.render_default(),
        )
        return option.default


def policy_config_from_env(environ: Mapping[str, str] | None = None) -> PolicyConfig:
    """The policy config of a process that never sees the command line (a rank).

    A bad value logs a WARNING naming the env var and the value, and the default is used.
    """
    env = os.environ if environ is None else environ
    return PolicyConfig(
        policy=_read_env_option(env, FPM_GC_POLICY),
        interval_s=_read_env_option(env, FPM_GC_FREEZE_INTERVAL_S),
    )


def policy_env(config: PolicyConfig) -> dict[str, str]:
    """The env vars that give a child process (a rank) this config."""
    return {
        FPM_GC_POLICY.env_var: config.policy,
        FPM_GC_FREEZE_INTERVAL_S.env_var: repr(float(config.interval_s)),
    }
