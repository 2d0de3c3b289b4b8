"""The compiled int4 GEMM: the tiled layout is inductor's, and a library built here agrees with torch's eager kernel."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference import int4_gemm


def test_the_tiled_layout_is_the_one_inductors_template_reads() -> None:
    import torch._inductor.lowering  # noqa: F401  (import order inductor needs)
    from torch._inductor.codegen.cpp_gemm_template import CppWoqInt4GemmTemplate

    codes = torch.randint(0, 16, (96, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
    assert torch.equal(int4_gemm.tile(codes.to(torch.uint8)), CppWoqInt4GemmTemplate[32].block_weight(packed, None, None))


@pytest.mark.hardware("amx")
def test_a_built_kernel_agrees_with_the_eager_kernel_for_any_row_count(tmp_path: Path) -> None:
    kernels = int4_gemm.load([(64, 96)], tmp_path)
    assert kernels is not None
    generator = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (64, 96), dtype=torch.int32, generator=generator)
    scales_and_zeros = (torch.rand(3, 64, 2, generator=generator) * 0.05).to(torch.bfloat16)
    packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
    tiled = int4_gemm.tile(codes.to(torch.uint8))
    assert int4_gemm.agrees(kernels[(64, 96)], packed, tiled, scales_and_zeros)
    for rows in (2, 7, 130):
        x = torch.randn(rows, 96, generator=generator).to(torch.bfloat16)
        expected = torch._weight_int4pack_mm_for_cpu(x, packed, 32, scales_and_zeros).float()
        assert torch.allclose(kernels[(64, 96)](x, tiled, scales_and_zeros).float(), expected, atol=0.02 * float(expected.abs().max()))
