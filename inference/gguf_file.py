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


Q = GGMLQuantizationType
WIDE_BLOCKS = frozenset((Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q5_K, Q.Q6_K))


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
        for key, entry in self._reader.fields.items():
            if key in _TOKENIZER_ARRAYS or key.startswith("GGUF."):
                continue
            try:
                self.metadata[key] = entry.contents()
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
        """A 4-bit tensor's own blocks — codes uint8 [N, K] (0..15), scales and minimums float32 [N, K/32],
        w = code * scale + minimum — so a 4-bit kernel can run the file's weights without re-rounding them (Q4_0,
        Q4_1, and Q4_K's sub-blocks of 32: scale = d * sc, minimum = -dmin * m); None for other types."""
        tensor = self._tensor(name)
        kind = tensor.tensor_type
        if kind == GGMLQuantizationType.Q4_K:
            return self._codes(name, *self._k_scales(name, 144))
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

    def has_wide_blocks(self) -> bool:
        """Whether any tensor is in a 5- to 8-bit block type (`byte_blocks` reads them)."""
        return any(t.tensor_type in WIDE_BLOCKS for t in self._tensors.values())

    def byte_blocks(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool] | None:
        """A 5- to 8-bit tensor as codes of up to 8 bits with a scale and a minimum per 32 weights (codes uint8
        [N, K], scales and minimums float32 [N, K/32], w = code * scale + minimum) and whether that is the file's
        own arithmetic: Q5_0 (code q, minimum -16 d), Q5_1, Q8_0 (code q + 128), Q5_K's sub-blocks of 32 exactly;
        Q6_K's two scales per 32 weights re-rounded to one 8-bit grid (within a quarter of its step). None for other
        types."""
        kind = self._tensor(name).tensor_type
        if kind == Q.Q8_0:
            q8 = self.q8_blocks(name)
            assert q8 is not None
            codes, scales = q8
            return (codes.astype(np.int16) + 128).astype(np.uint8), scales, -128 * scales, True
        if kind == Q.Q5_0:
            d = self._block_halves(name, 22, 0)
            return (*self._codes(name, d, -16 * d, bits=5), True)
        if kind == Q.Q5_1:
            return (*self._codes(name, self._block_halves(name, 24, 0), self._block_halves(name, 24, 1), bits=5), True)
        if kind == Q.Q5_K:
            return (*self._codes(name, *self._k_scales(name, 176), bits=5), True)
        if kind == Q.Q6_K:
            dense = self.dequantize(name)
            n, k = dense.shape
            groups = dense.reshape(n, k // 32, 32)
            low, high = groups.min(-1), groups.max(-1)
            scales = np.maximum((high - low) / 255, 1e-12).astype(np.float32)
            return (*self._codes(name, scales, low.astype(np.float32), bits=8, dense=dense, exact=False), False)
        return None

    def q6_blocks(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """A Q6_K tensor exactly: signed codes int8 [N, K] (q - 32) and a scale per 16 weights float32 [N, K/16]
        (its super-block's float16 d times the sub-block's int8 scale, exact in float32), w = code * scale; None for
        other types."""
        if self._tensor(name).tensor_type != Q.Q6_K:
            return None
        raw = self._raw_blocks(name, 210)  # [N, K/256, 210]: ql[128], qh[64], 16 int8 scales, float16 d
        d = raw[..., 208:210].copy().view(np.float16).astype(np.float32)  # [N, K/256, 1]
        sc = raw[..., 192:208].copy().view(np.int8).astype(np.float32)  # [N, K/256, 16]
        scales = (d * sc).reshape(raw.shape[0], -1)  # [N, K/16]
        dense = self.dequantize(name)
        n, k = dense.shape
        groups = dense.reshape(n, k // 16, 16)
        safe = np.where(scales == 0, 1, scales)[..., None]
        codes = np.clip(np.rint(groups / safe), -32, 31)
        if float(np.abs(codes * scales[..., None] - groups).max(initial=0)) > 1e-3 * float(np.abs(scales).max()) + 1e-6:
            raise ModelFileError(self.path, f"tensor {name!r}: its blocks do not decode to its values")
        return codes.astype(np.int8).reshape(n, k), scales

    def _raw_blocks(self, name: str, block_bytes: int) -> np.ndarray:
        """uint8 [N, K / block weights, block_bytes]."""
        tensor = self._tensor(name)
        n = int(tensor.shape[-1]) if len(tensor.shape) > 1 else 1
        try:
            return np.asarray(tensor.data, dtype=np.uint8).reshape(n, -1, block_bytes)
        except ValueError as exc:
            raise ModelFileError(self.path, f"tensor {name!r} is corrupt or truncated ({exc})") from exc

    def _block_halves(self, name: str, block_bytes: int, index: int) -> np.ndarray:
        """The `index`-th float16 field of every 32-weight block, as float32 [N, K/32]."""
        raw = self._raw_blocks(name, block_bytes)
        return raw[..., 2 * index : 2 * index + 2].copy().view(np.float16)[..., 0].astype(np.float32)

    def _k_scales(self, name: str, block_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        """Q4_K's and Q5_K's per-32 scales (d * sc) and minimums (-dmin * m) [N, K/32], from each 256-weight
        super-block's float16 d and dmin and its twelve bytes of 6-bit sc and m (ggml's `get_scale_min_k4`)."""
        raw = self._raw_blocks(name, block_bytes)  # [N, K/256, bytes]
        d = raw[..., 0:2].copy().view(np.float16).astype(np.float32)  # [N, K/256, 1]
        dmin = raw[..., 2:4].copy().view(np.float16).astype(np.float32)
        q = raw[..., 4:16].astype(np.uint8)
        sc = np.concatenate([q[..., 0:4] & 63, (q[..., 8:12] & 0xF) | ((q[..., 0:4] >> 6) << 4)], axis=-1)
        m = np.concatenate([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)], axis=-1)
        n = raw.shape[0]
        scales = (d * sc.astype(np.float32)).reshape(n, -1)  # [N, K/32]
        return scales, (-(dmin * m.astype(np.float32))).reshape(n, -1)

    def _codes(
        self,
        name: str,
        scales: np.ndarray,
        minimums: np.ndarray,
        bits: int = 4,
        dense: np.ndarray | None = None,
        exact: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each weight's code on its group's grid, w = code * scale + minimum, from the dequantized values; for the
        file's own grid (`exact`) a value off it means we read the blocks wrongly, and is an error."""
        dense = self.dequantize(name) if dense is None else dense
        n, k = dense.shape
        groups = dense.reshape(n, k // 32, 32)
        safe = np.where(scales == 0, 1, scales)[..., None]
        codes = np.clip(np.rint((groups - minimums[..., None]) / safe), 0, 2**bits - 1)
        if exact:
            off = np.abs(codes * scales[..., None] + minimums[..., None] - groups)
            if float(off.max(initial=0)) > 1e-3 * float(np.abs(scales).max(initial=0)) + 1e-6:
                raise ModelFileError(self.path, f"tensor {name!r}: its blocks do not decode to its values")
        return codes.astype(np.uint8).reshape(n, k), scales.astype(np.float32), minimums.astype(np.float32)

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
