"""The int4 x int8 VNNI kernel: built here, checked against the dequantized weights and for batch invariance."""

from __future__ import annotations

import pytest
import torch

from inference import q4_vnni, weights_cache
from inference.weights import Int4Vnni, Q4Blocks, WeightFormat, build, restore

pytestmark = pytest.mark.skipif(not q4_vnni.cpu_supports(), reason="this CPU lacks AVX512-VNNI: int4 runs on torch's kernels")


@pytest.fixture(scope="module", autouse=True)
def _kernel() -> None:
    assert q4_vnni.load(weights_cache.cache_dir()), "the kernel did not build or load"


def _blocks(n: int, k: int, seed: int = 0) -> Q4Blocks:
    return Q4Blocks.quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05)


@pytest.mark.parametrize("rows", [1, 3, 8, 13, 70])
@pytest.mark.parametrize("n, k", [(16, 32), (96, 64), (576, 1536)])
def test_it_multiplies_like_the_dequantized_weights_up_to_int8_activations(rows: int, n: int, k: int) -> None:
    blocks = _blocks(n, k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(1))
    expected = x @ blocks.dequantize().T
    got = q4_vnni.multiply(x, q4_vnni.pack(blocks.codes, blocks.scales, blocks.minimums), n)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    # int8 activations (a step of 1/127 of each group's largest value) and fp16 scales: well under 2% of the largest output
    assert (got - expected).abs().max() <= 0.02 * expected.abs().max()


def test_a_row_gives_the_same_result_alone_and_in_any_batch() -> None:
    """What makes a request decoded beside others give exactly the tokens it gives alone."""
    blocks = _blocks(192, 576)
    packed = q4_vnni.pack(blocks.codes, blocks.scales, blocks.minimums)
    x = torch.randn(11, 576, generator=torch.Generator().manual_seed(2))
    batch = q4_vnni.multiply(x, packed, 192)
    for row in range(11):
        assert torch.equal(q4_vnni.multiply(x[row : row + 1], packed, 192)[0], batch[row])
    assert torch.equal(q4_vnni.multiply(x[3:9], packed, 192), batch[3:9])


def test_it_takes_bfloat16_rows_as_well() -> None:
    blocks = _blocks(32, 64)
    packed = q4_vnni.pack(blocks.codes, blocks.scales, blocks.minimums)
    x = torch.randn(4, 64).to(torch.bfloat16)
    assert torch.equal(q4_vnni.multiply(x, packed, 32), q4_vnni.multiply(x.float(), packed, 32))


def test_it_refuses_weights_of_another_shape() -> None:
    blocks = _blocks(32, 64)
    packed = q4_vnni.pack(blocks.codes, blocks.scales, blocks.minimums)
    with pytest.raises(RuntimeError, match="do not match"):
        q4_vnni.multiply(torch.randn(2, 128), packed, 32)


def test_a_projection_keeps_its_layout_through_the_weights_cache() -> None:
    dense = torch.randn(48, 96) * 0.05
    projection = build(WeightFormat.INT4, dense, vnni=True)
    assert isinstance(projection, Int4Vnni)
    copy = restore(projection.state())
    x = torch.randn(5, 96)
    assert torch.equal(copy(x), projection(x))
    assert projection.nbytes == 48 * 96 // 2 + 48 * 96 // 32 * 4  # half a byte per weight, fp16 scale and minimum per 32
