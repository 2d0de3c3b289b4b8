"""Reading a GGUF file: its metadata, its tokenizer arrays and its tensors, dequantized to float32.

The `gguf` package does the parsing and the dequantization; this module turns its
low-level failures (a truncated file, a missing key, an unknown quantization) into
errors that name the file and the problem.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, ReaderTensor
from gguf.quants import dequantize

from inference.errors import ModelFileError

# Metadata arrays too large to be worth copying into the plain metadata dict.
_TOKENIZER_ARRAYS = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.scores",
)


TOKENIZER_MODELS = {"gpt2": "byte-level BPE", "llama": "SentencePiece-style (scores, byte fallback)"}


@dataclass(frozen=True)
class TokenizerData:
    """The vocabulary as the GGUF stores it; `token_types` uses llama.cpp's codes (3 = control, 4 = user-defined,
    6 = byte). `merges` belong to byte-level BPE (`gpt2`), `scores` to SentencePiece-style vocabularies (`llama`)."""

    model: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    scores: list[float] = field(default_factory=list)
    add_space_prefix: bool = True


class GGUFFile:
    """An opened GGUF file. Tensors are dequantized one at a time, on demand."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        if not os.path.isfile(self.path):
            raise ModelFileError(self.path, "no such file")
        try:
            self._reader = GGUFReader(self.path, "r")
        except Exception as exc:  # the gguf package raises bare ValueError/struct/index errors
            raise ModelFileError(self.path, f"not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
        self.metadata: dict[str, Any] = {}
        for key, field in self._reader.fields.items():
            if key in _TOKENIZER_ARRAYS or key.startswith("GGUF."):
                continue
            try:
                self.metadata[key] = field.contents()
            except Exception as exc:
                raise ModelFileError(self.path, f"metadata key {key!r} is corrupt ({exc})") from exc
        self._tensors: dict[str, ReaderTensor] = {t.name: t for t in self._reader.tensors}

    def tokenizer_data(self) -> TokenizerData:
        """The vocabulary; a file without one we know cannot be served."""
        model = self.metadata.get("tokenizer.ggml.model")
        if model not in TOKENIZER_MODELS:
            known = ", ".join(f"{k!r} ({v})" for k, v in TOKENIZER_MODELS.items())
            raise ModelFileError(self.path, f"tokenizer model {model!r} is not supported; supported: {known}")
        tokens = self._array("tokenizer.ggml.tokens")
        merges = self._array("tokenizer.ggml.merges", required=model == "gpt2")
        scores = self._array("tokenizer.ggml.scores", required=model == "llama")
        types = self._array("tokenizer.ggml.token_type", required=False) or [1] * len(tokens)
        if len(types) != len(tokens):
            raise ModelFileError(self.path, "tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length")
        return TokenizerData(
            model=model,
            pre=str(self.metadata.get("tokenizer.ggml.pre", "default")),
            tokens=[str(t) for t in tokens],
            token_types=[int(t) for t in types],
            merges=[str(m) for m in merges],
            scores=[float(x) for x in scores],
            add_space_prefix=bool(self.metadata.get("tokenizer.ggml.add_space_prefix", model == "llama")),
        )

    def _array(self, key: str, required: bool = True) -> list[Any]:
        field = self._reader.fields.get(key)
        if field is None:
            if required:
                raise ModelFileError(self.path, f"metadata key {key!r} is missing")
            return []
        if not field.types or field.types[0] != GGUFValueType.ARRAY:
            raise ModelFileError(self.path, f"metadata key {key!r} is not an array")
        values = field.contents()
        assert isinstance(values, list)
        return values

    def tensor_type(self, name: str) -> GGMLQuantizationType:
        return self._tensor(name).tensor_type

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def _tensor(self, name: str) -> ReaderTensor:
        if name not in self._tensors:
            raise ModelFileError(self.path, f"tensor {name!r} is missing")
        return self._tensors[name]

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as float32 in PyTorch's layout (rows = output features)."""
        tensor = self._tensor(name)
        shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dimensions innermost first
        try:
            values = dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as exc:
            raise ModelFileError(
                self.path, f"tensor {name!r} uses {tensor.tensor_type.name}, which cannot be dequantized"
            ) from exc
        except Exception as exc:
            raise ModelFileError(self.path, f"tensor {name!r} is corrupt or truncated ({exc})") from exc
        if values.size != int(np.prod(shape)):
            raise ModelFileError(self.path, f"tensor {name!r} holds {values.size} values, expected shape {shape}")
        return np.array(values.reshape(shape), dtype=np.float32, copy=not values.flags.writeable)

    def q4_blocks(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A Q4_0 or Q4_1 tensor's own blocks — codes uint8 [N, K] (0..15), scales and minimums float32 [N, K/32],
        w = code * scale + minimum — so a 4-bit kernel can run the file's weights without re-rounding them; None for
        other types."""
        tensor = self._tensor(name)
        kind = tensor.tensor_type
        if kind not in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1):
            return None
        n, k = (int(d) for d in reversed(tensor.shape))
        header = 2 if kind == GGMLQuantizationType.Q4_0 else 4  # fp16 d (Q4_0); fp16 d and m (Q4_1)
        try:
            blocks = np.asarray(tensor.data, dtype=np.uint8).reshape(n, k // 32, header + 16)
        except ValueError as exc:
            raise ModelFileError(self.path, f"tensor {name!r} is corrupt or truncated ({exc})") from exc
        scales = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [N, K/32]
        if kind == GGMLQuantizationType.Q4_1:
            minimums = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        else:  # Q4_0: w = (code - 8) * d
            minimums = -8 * scales
        packed = blocks[
            ..., header:
        ]  # [N, K/32, 16]: element j in the low nibble of byte j, element j + 16 in the high one
        codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(n, k)
        return codes, scales, minimums

    def q8_blocks(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """A Q8_0 tensor's own blocks — codes int8 [N, K] and scales float32 [N, K/32], w = code * scale — or None."""
        tensor = self._tensor(name)
        if tensor.tensor_type != GGMLQuantizationType.Q8_0:
            return None
        n, k = (int(d) for d in reversed(tensor.shape))
        try:
            blocks = np.asarray(tensor.data, dtype=np.uint8).reshape(n, k // 32, 34)  # fp16 scale, then 32 int8 codes
        except ValueError as exc:
            raise ModelFileError(self.path, f"tensor {name!r} is corrupt or truncated ({exc})") from exc
        scales = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        codes = blocks[..., 2:].copy().view(np.int8).reshape(n, k)
        return codes, scales
