"""The import check of tests/unit/test_import_environment.py in the vLLM environment, where the
modules that import vLLM (the engine adapter, its argument and sampling code) import too."""

from __future__ import annotations

import pytest

from tests.unit.test_import_environment import assert_environment_untouched, import_every_module

pytestmark = pytest.mark.vllm


def test_importing_every_module_with_vllm_leaves_the_environment_unchanged():
    report = import_every_module()
    assert_environment_untouched(report)
    assert {"dynamo.vllm.vllm_engine", "dynamo.vllm.vllm_args"} <= set(report["imported"])
