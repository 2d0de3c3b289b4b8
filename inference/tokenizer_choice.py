"""Which tokenizer a GGUF file's vocabulary needs: its `tokenizer.ggml.model` decides, never a guess."""

from __future__ import annotations

from inference.gguf_file import TokenizerData
from inference.spm_tokenizer import SentencePieceTokenizer
from inference.tokenizer import BPETokenizer, Tokenizer


def make_tokenizer(data: TokenizerData, path: str) -> Tokenizer:
    """SentencePiece-style for `llama` vocabularies, byte-level BPE for `gpt2` ones (`gguf_file.TOKENIZER_MODELS`
    lists them; `GGUFFile.tokenizer_data` refuses any other, naming it)."""
    return SentencePieceTokenizer(data, path) if data.model == "llama" else BPETokenizer(data, path)
