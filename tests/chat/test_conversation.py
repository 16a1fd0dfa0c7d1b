"""A chat's history saved as a batch row and read back (`chat/conversation.py`): a reasoning
model's thinking stays apart from the answer, and a provider's signed thinking blocks whole."""

from __future__ import annotations

import json

from lmpress.chat.conversation import Conversation, append_row, read_row
from lmpress.vocabulary.types import Message

SIGNED = {"type": "thinking", "thinking": "add them", "signature": "sig-1"}


def test_saved_thinking_comes_back_as_it_was(tmp_path):
    reply = Message("assistant", "4", reasoning="add them", reasoning_details=[SIGNED])
    conversation = Conversation("Be brief.", [Message("user", "2+2?"), reply])
    path = tmp_path / "chat.jsonl"
    append_row(conversation, str(path))
    saved = json.loads(path.read_text())["messages"][-1]
    assert saved == {
        "role": "assistant", "content": "4", "reasoning_content": "add them",
        "reasoning_details": [SIGNED],
    }  # fmt: skip
    loaded = Conversation.from_messages(read_row(str(path)).messages)
    assert loaded.messages[-1] == reply
