"""Write tests/data/vllm_openai_fields.json: the field names of the installed vLLM's OpenAI
request models, with its version, for the default suite's check that every one of them is
classified in dynamo.frontend.openai.fields (the vllm-marked suite reads the installed vLLM
itself and fails when this snapshot is stale).

    $(scripts/setup_vllm_env.sh) scripts/snapshot_vllm_openai_fields.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SNAPSHOT = Path(__file__).resolve().parents[1] / "tests" / "data" / "vllm_openai_fields.json"


def installed_fields() -> dict:
    """{"vllm_version", "chat": [names], "completion": [names]} of the installed vLLM."""
    import vllm
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    return {
        "vllm_version": vllm.__version__,
        "chat": sorted(ChatCompletionRequest.model_fields),
        "completion": sorted(CompletionRequest.model_fields),
    }


def main() -> int:
    SNAPSHOT.write_text(json.dumps(installed_fields(), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {SNAPSHOT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
