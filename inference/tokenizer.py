"""Tokenizers built from the vocabulary inside the GGUF file: what every kind shares (`Tokenizer`), and byte-level BPE.

`BPETokenizer` (the file's `tokenizer.ggml.model` is `gpt2`: SmolLM2, Llama 3, Qwen) is built with Hugging Face
`tokenizers` and the same pre-tokenization as llama.cpp, so that ids match llama.cpp's; SentencePiece-style
vocabularies (`llama`: Gemma, Llama 2) are `inference.spm_tokenizer`. Neither recognises control tokens in the text it
is given: user text is always plain text, and a user who types `<|im_end|>` gets the characters, not the control
token. Template markup is split on special tokens by `chat_template`, which knows which parts of the prompt are
markup.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Tokenizer_

from inference.errors import ModelFileError
from inference.gguf_file import TokenizerData

CONTROL_TOKEN_TYPE = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
# Control tokens that end an assistant turn in the chat formats we know, besides the file's EOS.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<|end_of_text|>", "<end_of_turn>")

# llama.cpp's pre-tokenizer regexes (`llama-vocab.cpp`): Llama 3 groups digits by three, Qwen 2 splits every digit
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")


def pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """llama.cpp's pre-tokenization for the file's `tokenizer.ggml.pre`; ValueError if we do not know it."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("gpt2", "gpt-2", "default"):
        return byte_level
    if pre in ("smollm", "starcoder", "refact"):  # every digit on its own, then GPT-2's regex
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    split = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}
    if pre in split:
        isolated = pre_tokenizers.Split(Regex(split[pre]), behavior="isolated")
        return pre_tokenizers.Sequence([isolated, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raise ValueError(pre)


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-printable-character table used by byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


@dataclass(frozen=True)
class Encoding:
    """Token ids with a readable string per token and its (start, end) character span in the input."""

    ids: list[int]
    tokens: list[str]
    spans: list[tuple[int, int]]


class Tokenizer(ABC):
    """Encodes plain text and maps every id back to the exact bytes it stands for; subclasses set `pieces`,
    `token_bytes`, `special_ids` and `control_ids` and encode."""

    kind = ""  # for people: "byte-level BPE", "SentencePiece"
    pieces: list[str]  # the vocabulary as the file writes it
    piece_ids: dict[str, int]  # and back
    token_bytes: list[bytes]  # what each id stands for (b"" for control tokens)
    special_ids: dict[str, int]  # control tokens by name
    control_ids: frozenset[int]

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    @abstractmethod
    def encode(self, text: str) -> Encoding:
        """Plain-text encoding: special-token text stays ordinary characters."""

    @abstractmethod
    def pre_tokenize(self, text: str) -> list[str]:
        """The pieces the tokenizer's merging works on, readable."""

    @abstractmethod
    def hugging_face(self) -> Tokenizer_:
        """This tokenizer as a Hugging Face `tokenizers` object (for `inference.hf_export`)."""

    def token_id(self, piece: str) -> int:
        """The id of a vocabulary entry, as the file writes it."""
        return self.piece_ids[piece]

    def token_text(self, token_id: int) -> str:
        """A readable form of one token: control tokens by name, partial UTF-8 as \\x escapes."""
        if token_id in self.control_ids:
            return self.pieces[token_id]
        return self.token_bytes[token_id].decode("utf-8", errors="backslashreplace")

    def decode(self, ids: list[int], control_text: bool = False) -> str:
        """The whole sequence at once; control tokens produce no text, or (`control_text`) their own name."""
        if control_text:
            return b"".join(
                self.pieces[i].encode() if i in self.control_ids else self.token_bytes[i] for i in ids
            ).decode("utf-8", errors="replace")
        return b"".join(self.token_bytes[i] for i in ids).decode("utf-8", errors="replace")

    def end_of_turn_ids(self, eos_id: int | None) -> frozenset[int]:
        """Ids that end generation: the file's EOS plus the end-of-turn control tokens it has."""
        ids = {self.special_ids[t] for t in END_OF_TURN_TOKENS if t in self.special_ids}
        if eos_id is not None and 0 <= eos_id < self.vocab_size:
            ids.add(eos_id)
        return frozenset(ids)


class BPETokenizer(Tokenizer):
    """Byte-level BPE: the file's merges over GPT-2's byte alphabet."""

    kind = "byte-level BPE"

    def __init__(self, data: TokenizerData, path: str = "<gguf>") -> None:
        try:
            pre = pre_tokenizer(data.pre)
        except ValueError:
            raise ModelFileError(path, f"pre-tokenizer {data.pre!r} is not supported") from None
        vocab = {token: i for i, token in enumerate(data.tokens)}
        merges = [tuple(m.split(" ", 1)) for m in data.merges]
        self._tk = Tokenizer_(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))  # type: ignore[arg-type]
        self._tk.pre_tokenizer = pre
        self._tk.decoder = decoders.ByteLevel()
        self.pieces = data.tokens
        self.merges = data.merges  # "left right" per line, best first (`bpe_merges` replays them)
        self.piece_ids = vocab
        self.special_ids = {
            tok: i for i, (tok, kind) in enumerate(zip(data.tokens, data.token_types)) if kind == CONTROL_TOKEN_TYPE
        }
        self.control_ids = frozenset(self.special_ids.values())
        to_byte = unicode_to_byte()
        self.token_bytes = [
            b"" if i in self.control_ids else bytes(to_byte.get(ch, 0) for ch in tok)
            for i, tok in enumerate(data.tokens)
        ]

    def hugging_face(self) -> Tokenizer_:
        """This tokenizer as a Hugging Face `tokenizers` object, its control tokens added as special tokens (a
        Hugging Face tokenizer recognises them in text, as benchmark tools expect); for `inference.hf_export`."""
        copy = Tokenizer_.from_str(self._tk.to_str())
        by_id = sorted(self.special_ids.items(), key=lambda item: item[1])
        copy.add_special_tokens([AddedToken(token, special=True, normalized=False) for token, _ in by_id])
        return copy

    def encode(self, text: str) -> Encoding:
        """Plain-text encoding: special-token text stays ordinary characters."""
        enc = self._tk.encode(text, add_special_tokens=False)
        return Encoding(ids=list(enc.ids), tokens=[self.token_text(i) for i in enc.ids], spans=list(enc.offsets))

    def pre_tokenize(self, text: str) -> list[str]:
        """The pieces BPE works on, each in the byte-level alphabet (a leading space is "Ġ")."""
        return [piece for piece, _ in self._tk.pre_tokenizer.pre_tokenize_str(text)]
