"""The stand-in's "model": a word-level tokenizer with the model directory's chat template, and
a log of what each engine did. Nothing here exists in vLLM."""

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

BOS_ID = 1
EOS_ID = 2


class StandinTokenizer:
    """Splits on whitespace; one word is one token. Renders chat templates with Jinja the way
    Hugging Face tokenizers do (apply_chat_template(messages, tokenize=..., ...))."""

    def __init__(self, model_dir: str):
        config_file = Path(model_dir) / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        self.chat_template: str | None = config.get("chat_template")
        self.bos_token = config.get("bos_token", "<s>")
        self.eos_token = config.get("eos_token", "</s>")
        self.bos_token_id = BOS_ID
        self.eos_token_id = EOS_ID
        self._ids = {self.bos_token: BOS_ID, self.eos_token: EOS_ID}
        self._words = {BOS_ID: self.bos_token, EOS_ID: self.eos_token}
        self._lock = threading.Lock()

    def token_id(self, word: str) -> int:
        with self._lock:
            if word not in self._ids:
                self._ids[word] = len(self._ids) + 100
                self._words[self._ids[word]] = word
            return self._ids[word]

    def word(self, token_id: int) -> str:
        return self._words[token_id]

    def encode(self, text, truncation=None, max_length=None, add_special_tokens=True):
        ids = [self.token_id(word) for word in text.split()]
        return [BOS_ID, *ids] if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens=False):
        special = {BOS_ID, EOS_ID} if skip_special_tokens else set()
        return " ".join(self._words[i] for i in ids if i not in special)

    def apply_chat_template(self, messages, tools=None, **kwargs: Any):
        template = kwargs.get("chat_template") or self.chat_template
        if not template:
            raise ValueError(
                "Cannot use chat template functions because tokenizer.chat_template is not set "
                "and no template argument was passed!"
            )
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        try:
            compiled = env.from_string(template)
        except jinja2.TemplateError as exc:
            raise ValueError(f"invalid chat template: {exc}") from exc
        text = compiled.render(
            messages=messages,
            add_generation_prompt=kwargs.get("add_generation_prompt", False),
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        if kwargs.get("tokenize", True):
            return self.encode(text, add_special_tokens=False)
        return text


def max_model_len(model_dir: str, configured: int | None) -> int:
    if configured:
        return configured
    config_file = Path(model_dir) / "config.json"
    if config_file.is_file():
        return int(json.loads(config_file.read_text()).get("max_position_embeddings", 2048))
    return 2048


def image_placeholder(model_dir: str) -> tuple[str, int] | None:
    """A vision-language model's image placeholder word and the tokens each image becomes
    (config.json's "image_token" and "image_seq_length"); None for a text model."""
    config_file = Path(model_dir) / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if "vision_config" not in config:
        return None
    return config.get("image_token", "<image>"), int(config.get("image_seq_length", 4))


def log(event: str, **fields: Any) -> None:
    """Append one JSON line to $VLLM_STANDIN_LOG, if set."""
    path = os.environ.get("VLLM_STANDIN_LOG")
    if not path:
        return
    record = {
        "event": event,
        "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "time": time.time(),
        **fields,
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=str) + "\n")
