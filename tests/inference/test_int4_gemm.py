"""The compiled int4 GEMM: built against this torch's template, it reads the eager kernel's own packed weights and
agrees with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference import int4_gemm
from inference.weights import Int4, Q4Blocks

pytestmark = pytest.mark.live  # builds the AMX int4 GEMM with inductor (minutes)

ROOT = Path(__file__).resolve().parents[2]


def test_the_build_can_teach_this_torchs_amx_micro_kernel_the_eager_layout() -> None:
    """The build edits inductor's template by exact text replacements; a torch whose template differs must fail here,
    not silently on a user's first start (where the engine would fall back to the slow eager kernel for prompts)."""
    check = (
        "from inference.int4_gemm_build import read_the_eager_layout as teach; teach(); "
        "from torch._inductor.codegen.cpp_micro_gemm import CppMicroGemmWoQInt4Amx as amx; assert 'B64' in "
        "amx.TEMPLATE_ENTRY"
    )
    done = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_int4_keeps_one_copy_of_each_matrix() -> None:
    projection = Int4.from_blocks(Q4Blocks.quantize(torch.randn(128, 64)))
    assert projection.nbytes == 128 * 64 // 2 + (64 // 32) * 128 * 2 * 2  # 4-bit codes, a bf16 scale and zero per 32


@pytest.mark.hardware("amx")
def test_a_built_kernel_agrees_with_the_eager_kernel_on_its_own_weights_for_any_row_count(tmp_path: Path) -> None:
    kernels = int4_gemm.load([(128, 96)], tmp_path)
    assert kernels is not None
    generator = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (128, 96), dtype=torch.int32, generator=generator)
    scales_and_zeros = (torch.rand(3, 128, 2, generator=generator) * 0.05).to(torch.bfloat16)
    packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
    assert int4_gemm.agrees(kernels[(128, 96)], packed, scales_and_zeros)
    for rows in (2, 7, 130):
        x = torch.randn(rows, 96, generator=generator).to(torch.bfloat16)
        expected = torch._weight_int4pack_mm_for_cpu(x, packed, 32, scales_and_zeros).float()
        got = kernels[(128, 96)](x, packed, scales_and_zeros).float()
        assert torch.allclose(got, expected, atol=0.02 * float(expected.abs().max()))
