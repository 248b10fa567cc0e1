"""Through the real frontend process (issue 19, item 1): hostile record files this test writes
name files outside the model's directory, a non-template file as the chat template, a FIFO, a
directory outside ``--dyn-model-dirs``; each such model is refused with one escaped WARNING and
never listed, while a model inside the operator's directories is served."""

from __future__ import annotations

import asyncio
import os
import re

import aiohttp
import pytest

from dynamo.runtime.discovery import ModelRecord
from dynamo.runtime.discovery.file_store import DiscoveryStore
from tests.support import wait_until
from tests.support.processes import listening_url, start_frontend
from tests.support.tiny_model import build_tiny_tokenizer, tiny_card

pytestmark = pytest.mark.integration


def _models(url: str) -> list[str]:
    async def get() -> list[str]:
        async with aiohttp.ClientSession() as session, session.get(url + "/v1/models") as r:
            return [m["id"] for m in (await r.json())["data"]]

    return asyncio.run(get())


@pytest.mark.parametrize("model_dirs", [True, False], ids=["with --dyn-model-dirs", "default"])
def test_hostile_cards_are_refused_and_the_good_one_served(tmp_path, model_dirs):
    allowed = tmp_path / "models"
    good = build_tiny_tokenizer(allowed / "good")
    outside = build_tiny_tokenizer(tmp_path / "elsewhere")
    (tmp_path / "secret.txt").write_text("root:x:0:0\n", encoding="utf-8")
    linked = build_tiny_tokenizer(allowed / "linked")
    linked_card = tiny_card(linked, "linked")
    (linked / "tokenizer.json").unlink()
    (linked / "tokenizer.json").symlink_to(outside / "tokenizer.json")
    fifo = build_tiny_tokenizer(allowed / "fifo")
    fifo_card = tiny_card(fifo, "fifo")
    (fifo / "tokenizer_config.json").unlink()
    os.mkfifo(fifo / "tokenizer_config.json")
    cards = {
        "good": tiny_card(good, "good"),
        "linked": linked_card,
        "fifo": fifo_card,
        "template": tiny_card(good, "template", chat_template_path=str(tmp_path / "secret.txt")),
        "forger\nWARNING forged": tiny_card(good, "x", chat_template_path="/etc/passwd\n\x00"),
        "outside": tiny_card(outside, "outside"),
    }
    discovery = tmp_path / "discovery"
    store = DiscoveryStore(discovery)
    for name, card in cards.items():
        card = card.model_copy(update={"served_model_name": name})
        store.register(ModelRecord(model=name, endpoint="http://127.0.0.1:9", card=card))
    args = ("--dyn-model-dirs", str(allowed)) if model_dirs else ()
    frontend = start_frontend("frontend", tmp_path, discovery, *args)
    try:
        url = listening_url(frontend)
        refusals = 5 if model_dirs else 4  # "outside" is served without the option
        wait_until(
            lambda: frontend.count("its chat processor failed to build") >= refusals,
            deadline_s=60,
            what="refusals logged",
        )
        served = {"good"} if model_dirs else {"good", "outside"}
        # Each model's processor is built on its own: wait for every one that is served.
        wait_until(lambda: served <= set(_models(url)), deadline_s=60, what="models listed")
        listed = set(_models(url))
    finally:
        frontend.stop()
    assert listed == served
    log = frontend.log()
    assert "\x00" not in log and "root:x" not in log
    assert not any(line.startswith("WARNING forged") for line in log.splitlines())
    refused = re.findall(r"Model refused: model=(\S+) .*", log)
    assert sorted(refused) == sorted(
        ["linked", "fifo", "template", "forger\\nWARNING", *(["outside"] if model_dirs else [])]
    )
    assert "leads outside the model's directory" in log and "not a regular file" in log
    if model_dirs:
        assert "--dyn-model-dirs / DYN_MODEL_DIRS" in log
    else:
        assert "is not a Jinja file" in log
