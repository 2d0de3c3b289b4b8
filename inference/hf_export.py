"""A model's tokenizer in Hugging Face's format, written from its GGUF file: `tokenizer.json` (vocabulary, merges,
pre-tokenizer, byte-level decoder, control tokens as special tokens), `tokenizer_config.json` (the chat template,
BOS/EOS, the context length) and `special_tokens_map.json`. Peer benchmark tools (aiperf, GuideLLM) count tokens with
`AutoTokenizer.from_pretrained(<that folder>)`; the model exists here only as a GGUF file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inference.gguf_file import GGUFFile
from inference.tokenizer_choice import make_tokenizer

FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def export_tokenizer(gguf_path: str, folder: Path) -> list[Path]:
    """Write the three files into `folder` (created if needed); their paths."""
    gguf = GGUFFile(gguf_path)
    tokenizer = make_tokenizer(gguf.tokenizer_data(), gguf_path)
    meta = gguf.metadata
    names = {i: token for token, i in tokenizer.special_ids.items()}

    def special(key: str) -> str | None:
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        return names.get(token_id) if token_id is not None else None

    architecture = meta.get("general.architecture", "")
    specials = {f"{key}_token": token for key in ("bos", "eos", "unk", "pad") if (token := special(key)) is not None}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": int(meta.get(f"{architecture}.context_length", 0)) or None,
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "clean_up_tokenization_spaces": False,
        **specials,
    }
    if template := meta.get("tokenizer.chat_template"):
        config["chat_template"] = template
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / name for name in FILES]
    tokenizer.hugging_face().save(str(written[0]))
    written[1].write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    written[2].write_text(json.dumps(specials, indent=2, ensure_ascii=False) + "\n")
    return written
