"""Builds the compiled int4 GEMM libraries (see `inference.int4_gemm`); runs in a child process of its own.

    python -m inference.int4_gemm_build OUT_DIR N K [N K ...]

For each weight shape [N, K] it exports `_weight_int4pack_mm_for_cpu(x, w, 32, scales_and_zeros)`
with the row count of x dynamic, compiles it ahead of time with inductor's C++ GEMM template
(max-autotune, C++ backend only) and writes the shared library to OUT_DIR/int4-NxK.so. Inductor
offers that template only for weights that are constants of a frozen graph, which it then
repacks into a layout of its own; here the one check that says so is relaxed, and the template's
AMX micro-kernel is taught to read the eager kernel's packed layout instead, so the engine passes
the very weights the eager kernel multiplies and keeps one copy of each matrix. Both changes are
made by exact text replacements that fail loudly on a torch whose template differs (the engine
then uses the eager kernel alone), and the engine checks every library against the eager kernel
before using it. Importing inductor costs this process ~120 MB, which is why the server does not.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from pathlib import Path

import torch


def allow_weights_as_inputs() -> None:
    import torch._inductor.lowering  # noqa: F401  (registers the lowerings the next module patches)
    import torch._inductor.quantized_lowerings as lowerings

    template_check = lowerings.use_cpp_gemm_template

    def relaxed(*args, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("is_woq_int4"):
            kwargs["require_constant_mat2"] = False
        return template_check(*args, **kwargs)

    lowerings.use_cpp_gemm_template = relaxed


def read_the_eager_layout() -> None:
    """Point the AMX micro-kernel at the eager kernel's own packed weights, so one copy serves both."""
    import torch._inductor.lowering  # noqa: F401  (inductor's modules import in this order only)
    from torch._inductor.codegen import cpp_micro_gemm as micro

    amx = micro.CppMicroGemmWoQInt4Amx
    replacements = [
        (
            "        constexpr int64_t ldb_int4 = BLOCK_N / 2; // 16\n",
            "        constexpr int64_t ldb_int4 = BLOCK_N / 2; // 16\n" + _EAGER_ROWS,
        ),
        (
            "_mm_prefetch(B + (k + PREFETCH_SIZE_K) * ldb_int4, _MM_HINT_T0);",
            "_mm_prefetch(B64 + (k + PREFETCH_SIZE_K) * 2 * ldb_int4, _MM_HINT_T0);",
        ),
        (
            "            __m128i b4 = _mm_loadu_si128((__m128i*)(B + n / 2 * K + k * ldb_int4));\n"
            "            b32[0] = _mm512_cvtepu8_epi32(b4);\n"
            "            b32[1] = _mm512_srli_epi32(b32[0], 4);\n",
            "            b32[0] = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((__m128i*)(B64 + k * 2 * "
            "ldb_int4))), nibble);\n"
            "            b32[1] = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((__m128i*)(B64 + k * 2 * "
            "ldb_int4 + 16))), nibble);\n",
        ),
        (
            "            __m128i b4_2 = _mm_loadu_si128((__m128i*)(B + n / 2 * K + (k + 1) * ldb_int4));\n"
            "            b32[0 + COLS] = _mm512_cvtepu8_epi32(b4_2);\n"
            "            b32[1 + COLS] = _mm512_srli_epi32(b32[0 + COLS], 4);\n",
            "            b32[0 + COLS] = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((__m128i*)(B64 + (k + "
            "1) * 2 * ldb_int4))), nibble);\n"
            "            b32[1 + COLS] = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((__m128i*)(B64 + (k + "
            "1) * 2 * ldb_int4 + 16))), nibble);\n",
        ),
    ]
    source = amx.TEMPLATE_ENTRY
    for old, new in replacements:
        if source.count(old) != 1:
            raise RuntimeError(
                f"this torch's int4 AMX micro-kernel is not the one this build patches: {old.strip()[:60]!r}"
            )
        source = source.replace(old, new)
    amx.TEMPLATE_ENTRY = source
    declare, extra_args = amx.get_kernel_extra_args_declare, amx.get_kernel_extra_args
    amx.get_kernel_extra_args_declare = lambda self: declare(self) + "\n    const int64_t n_block,"  # type: ignore[method-assign]
    amx.get_kernel_extra_args = lambda self, **kwargs: [*extra_args(self, **kwargs), "nci,"]  # type: ignore[method-assign]


# The template hands the micro-kernel B = &W[n_block * 32, k_start * 16] of its own layout ([N / 32, K, 16] bytes);
# the eager layout is [N / 64, K, 32] bytes where outputs j and j + 32 of a block of 64 share a byte, so the
# n_block'th 32 outputs are the low (even n_block) or high (odd) nibbles of rows of 32 bytes.
_EAGER_ROWS = """\
        {{kernel.assert_function}}(N == BLOCK_N, "one block of 32 outputs per call");
        const uint8_t* W0 = B - n_block * BLOCK_N * ldb - k_start * ldb_int4;
        const uint8_t* B64 = W0 + (n_block / 2) * 2 * BLOCK_N * ldb + k_start * 2 * ldb_int4;
        const __m512i nibble = _mm512_set1_epi32((n_block % 2) * 4);
"""


class _Int4MatMul(torch.nn.Module):
    def forward(self, x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x, packed, 32, scales_and_zeros)


def build(out_dir: Path, n: int, k: int) -> Path:
    x = torch.randn(64, k, dtype=torch.bfloat16)
    packed = torch.randint(0, 255, (n, k // 2), dtype=torch.uint8)
    scales_and_zeros = torch.rand(k // 32, n, 2, dtype=torch.bfloat16)
    rows = torch.export.Dim("rows", min=2, max=1 << 16)
    program = torch.export.export(_Int4MatMul(), (x, packed, scales_and_zeros), dynamic_shapes=({0: rows}, None, None))
    target = out_dir / f"int4-{n}x{k}.so"
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        package = torch._inductor.aoti_compile_and_package(
            program,
            package_path=os.path.join(tmp, "gemm.pt2"),
            inductor_configs={"max_autotune": True, "max_autotune_gemm_backends": "CPP", "compile_threads": 1},
        )
        with zipfile.ZipFile(package) as archive:
            library = next(name for name in archive.namelist() if name.endswith(".so"))
            staged = Path(tmp) / "gemm.so"
            staged.write_bytes(archive.read(library))
        os.replace(staged, target)  # atomic: a crash never leaves a half-written library
    return target


def main(argv: list[str]) -> None:
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    allow_weights_as_inputs()
    read_the_eager_layout()
    shapes = [(int(argv[i]), int(argv[i + 1])) for i in range(1, len(argv), 2)]
    for n, k in shapes:
        print(f"built {build(out_dir, n, k)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
