"""The Hugging Face tokenizer written from a GGUF file (`inference.hf_export`) counts and spells tokens as the model
does: llama.cpp's ids on the shared reference corpus, control tokens as single special tokens, the chat template and
end-of-sequence token in its config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from inference.hf_export import export_tokenizer
from inference.loader import default_model_path


def test_the_exported_tokenizer_gives_llama_cpps_ids_on_the_reference_corpus(
    tmp_path: Path, llamacpp_reference: dict[str, Any]
) -> None:
    files = export_tokenizer(default_model_path(), tmp_path)
    assert [f.name for f in files] == ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    hf = Tokenizer.from_file(str(files[0]))
    cases = [c for c in llamacpp_reference["tokenization"] if "<|" not in c["text"]]
    assert len(cases) >= 35  # those without control-token text, which a Hugging Face tokenizer reads as special
    assert [c["text"] for c in cases if hf.encode(c["text"], add_special_tokens=False).ids != c["ids"]] == []
    assert all(hf.decode(c["ids"]) == c["text"] for c in cases)


def test_control_tokens_are_special_and_the_config_carries_the_template(tmp_path: Path) -> None:
    files = export_tokenizer(default_model_path(), tmp_path)
    hf = Tokenizer.from_file(str(files[0]))
    ids = hf.encode("<|im_start|>user\nHi<|im_end|>", add_special_tokens=False).ids
    assert ids[0] == hf.token_to_id("<|im_start|>") and ids[-1] == hf.token_to_id("<|im_end|>")
    config = json.loads(files[1].read_text())
    assert config["eos_token"] == "<|im_end|>" and config["model_max_length"] == 8192
    assert "<|im_start|>" in config["chat_template"] and config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert json.loads(files[2].read_text())["eos_token"] == "<|im_end|>"
