"""How a model is loaded and run: one typed configuration, built once and passed down.

The inference worker builds it from Django settings (`webapp.settings`, from the environment), `python -m inference`
from its arguments, tests and benchmarks by hand. Nothing in `inference/` reads the environment: every choice below
arrives here, and a value that makes no sense fails `validate` naming the setting and its choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEVICES = ("cpu", "cuda")
KV_CACHE = ("auto", "float32", "float16")
CPU_KERNELS = ("auto", "off", "avx512-amx", "avx512-vnni", "avx2")
Q4_ACTIVATIONS = ("int8", "int8x2")
INT4_GEMM = ("auto", "off")


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "roundtrip" / "models"


@dataclass(frozen=True)
class LoadConfig:
    """Each field is the setting of the same name in the README's table (`ROUNDTRIP_<NAME>` upper-cased).

    device: None for CUDA when present, else the CPU. weights: `auto`, a format, or two joined by `+` (see
    `inference.weight_choice`). kv_cache: the cache's precision (see `Transformer.cache_dtype`). cpu_kernels: which
    build of our CPU kernels (`inference.cpu_kernels`). q4_activations: how the int4 x int8 kernel rounds activations.
    int4_gemm: `off` keeps prompts off the compiled AMX int4 GEMM (`inference.int4_gemm`). cache_dir: converted
    weights, measured choices and built kernels; use_cache: keep and reuse converted weights there (kernels are kept
    regardless)."""

    device: str | None = None
    weights: str = "auto"
    kv_cache: str = "auto"
    cpu_kernels: str = "auto"
    q4_activations: str = "int8"
    int4_gemm: str = "auto"
    cache_dir: Path = field(default_factory=default_cache_dir)
    use_cache: bool = True

    def validate(self) -> None:
        """ValueError naming the first setting outside its choices (the weight format is checked where it is parsed)."""
        for name, choices in (
            ("kv_cache", KV_CACHE),
            ("cpu_kernels", CPU_KERNELS),
            ("q4_activations", Q4_ACTIVATIONS),
            ("int4_gemm", INT4_GEMM),
        ):
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"ROUNDTRIP_{name.upper()}={value!r}: use {', '.join(choices)}")
        if self.device is not None and self.device.split(":")[0] not in DEVICES:
            raise ValueError(f"ROUNDTRIP_DEVICE={self.device!r}: use {', '.join(DEVICES)} (or cuda:N)")
