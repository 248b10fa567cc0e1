"""Installing the dynamo-gc layer beside ai-dynamo changes nothing of upstream's: every file of
the installed ai-dynamo and ai-dynamo-runtime distributions is byte-identical to the hash its
RECORD lists, and upstream's ``dynamo/`` tree holds no file that those RECORDs do not list (no
shim, no ``dynamo/__init__.py`` turning upstream's namespace package into a regular one).
"""

from __future__ import annotations

import base64
import hashlib
from importlib.metadata import distribution
from pathlib import Path

import pytest

pytestmark = pytest.mark.upstream

UPSTREAM_DISTRIBUTIONS = ("ai-dynamo", "ai-dynamo-runtime")


def record_hash(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def upstream_files():
    for name in UPSTREAM_DISTRIBUTIONS:
        dist = distribution(name)
        for file in dist.files or []:
            yield name, file, Path(dist.locate_file(file)).resolve()


def test_the_layer_is_installed_beside_upstream_not_over_it():
    layer = distribution("dynamo-gc")
    import dynamo.frontend.main
    import dynamo.mocker.main
    import dynamo_gc.upstream

    # none of the layer's installed files lies under `dynamo/`
    assert not [str(f) for f in layer.files or [] if f.parts and f.parts[0] == "dynamo"]
    # and `dynamo` still imports upstream's modules, not this repository's launchers
    listed = {path for _name, _file, path in upstream_files()}
    for module in (dynamo.frontend.main, dynamo.mocker.main):
        assert Path(module.__file__).resolve() in listed, module.__file__
    assert Path(dynamo_gc.upstream.__file__).resolve() not in listed


def test_every_upstream_file_matches_its_record():
    checked = 0
    changed = []
    for name, file, path in upstream_files():
        if file.hash is None:  # RECORD itself, and files pip lists without a hash
            continue
        assert file.hash.mode == "sha256", f"{name}: {file} hashed with {file.hash.mode}"
        if not path.is_file() or record_hash(path) != file.hash.value:
            changed.append(f"{name}: {file}")
        checked += 1
    assert not changed, f"upstream files changed or missing: {changed}"
    assert checked > 500  # the two wheels hold hundreds of files: the RECORDs were read


def test_upstreams_dynamo_tree_holds_only_upstreams_files():
    listed = {path for _name, _file, path in upstream_files()}
    import dynamo.frontend

    # `dynamo` is upstream's namespace package: no __init__.py of anyone's
    roots = {Path(p).resolve().parent for p in dynamo.frontend.__path__}
    assert len(roots) == 1, roots
    (root,) = roots
    assert not (root / "__init__.py").exists()
    strangers = [
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.resolve() not in listed
    ]
    assert not strangers, (
        f"files under upstream's dynamo/ that no upstream RECORD lists: {strangers}"
    )
