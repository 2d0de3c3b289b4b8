"""Our CPU kernels: built here, checked against torch's arithmetic and for batch invariance."""

from __future__ import annotations

import pytest
import torch

from inference import cpu_kernels
from inference.load_config import CPU_KERNELS, default_cache_dir
from inference.weights import Int4Q8, Q4Blocks, WeightFormat, build, restore

pytestmark = pytest.mark.skipif(
    not cpu_kernels.cpu_supports(),
    reason="this CPU has neither AVX512-VNNI nor AVX2: the model runs on torch's kernels",
)


@pytest.fixture(scope="module", autouse=True)
def _kernel() -> None:
    assert cpu_kernels.load(default_cache_dir()), "the kernels did not build or load"


def _blocks(n: int, k: int, seed: int = 0) -> Q4Blocks:
    return Q4Blocks.quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05)


@pytest.mark.parametrize("rows", [1, 3, 8, 13, 70])
@pytest.mark.parametrize("n, k", [(16, 32), (96, 64), (576, 1536)])
@pytest.mark.parametrize("parts, tolerance", [(1, 0.02), (2, 0.002)])
def test_it_multiplies_like_the_dequantized_weights_up_to_rounding(
    rows: int, n: int, k: int, parts: int, tolerance: float
) -> None:
    """One int8 per activation (a step of 1/127 of its group's largest value): within 2% of the largest output; two
    parts (about 15 bits): within 0.2%, even beside an outlier channel 100 times the rest, as SmolLM2's residual
    stream has (the rest of the error is the fp16 scales and minimums)."""
    blocks = _blocks(n, k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(1))
    if parts == 2:
        x[:, 5] *= 100
    expected = x @ blocks.dequantize().T
    got = cpu_kernels.q4_mm(x, cpu_kernels.q4_pack(blocks.codes, blocks.scales, blocks.minimums), n, parts)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    assert (got - expected).abs().max() <= tolerance * expected.abs().max()


def test_the_activation_setting_is_checked_by_name() -> None:
    try:
        cpu_kernels.use_activations("int8x2")
        assert cpu_kernels.activation_parts() == 2
        with pytest.raises(ValueError, match="ROUNDTRIP_Q4_ACTIVATIONS='int16'"):
            cpu_kernels.use_activations("int16")
    finally:
        cpu_kernels.use_activations("int8")


@pytest.mark.parametrize("parts", [1, 2])
def test_a_row_gives_the_same_result_alone_and_in_any_batch(parts: int) -> None:
    """What makes a request decoded beside others give exactly the tokens it gives alone."""
    blocks = _blocks(192, 576)
    packed = cpu_kernels.q4_pack(blocks.codes, blocks.scales, blocks.minimums)
    x = torch.randn(11, 576, generator=torch.Generator().manual_seed(2))
    batch = cpu_kernels.q4_mm(x, packed, 192, parts)
    for row in range(11):
        assert torch.equal(cpu_kernels.q4_mm(x[row : row + 1], packed, 192, parts)[0], batch[row])
    assert torch.equal(cpu_kernels.q4_mm(x[3:9], packed, 192, parts), batch[3:9])


@pytest.mark.parametrize("rows", [1, 3, 8, 13])
def test_the_fused_swiglu_is_the_down_projection_of_silu_gate_times_up(rows: int) -> None:
    """The feed-forward's one call: torch's silu(gate) * up, then q4_mm; gates from -100 to 100 take both of silu's
    branches and the exponential's clamp."""
    blocks = _blocks(96, 64)
    packed = cpu_kernels.q4_pack(blocks.codes, blocks.scales, blocks.minimums)
    gate_up = torch.randn(rows, 128, generator=torch.Generator().manual_seed(3)) * 4
    gate_up[0, :3] = torch.tensor([-100.0, 100.0, 0.0])
    gate, up = gate_up.chunk(2, dim=-1)
    expected = cpu_kernels.q4_mm(torch.nn.functional.silu(gate) * up, packed, 96)
    got = cpu_kernels.matmul("q4", gate_up, packed, 96, swiglu=True)
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
    for row in range(rows):
        assert torch.equal(cpu_kernels.matmul("q4", gate_up[row : row + 1], packed, 96, swiglu=True)[0], got[row])


def test_an_int4_projection_fuses_swiglu_and_others_take_torchs_product() -> None:
    blocks = _blocks(96, 64)
    gate_up = torch.randn(5, 128, generator=torch.Generator().manual_seed(4))
    gate, up = gate_up.chunk(2, dim=-1)
    int4 = build(WeightFormat.INT4, blocks=blocks, q8=True)
    assert torch.allclose(int4.swiglu(gate_up), int4(torch.nn.functional.silu(gate) * up), rtol=0, atol=1e-5)
    dense = build(WeightFormat.FP32, dense=blocks.dequantize())
    assert torch.equal(dense.swiglu(gate_up), dense(torch.nn.functional.silu(gate) * up))


def test_it_takes_bfloat16_rows_as_well() -> None:
    blocks = _blocks(32, 64)
    packed = cpu_kernels.q4_pack(blocks.codes, blocks.scales, blocks.minimums)
    x = torch.randn(4, 64).to(torch.bfloat16)
    assert torch.equal(cpu_kernels.q4_mm(x, packed, 32), cpu_kernels.q4_mm(x.float(), packed, 32))


def test_it_refuses_weights_of_another_shape() -> None:
    blocks = _blocks(32, 64)
    packed = cpu_kernels.q4_pack(blocks.codes, blocks.scales, blocks.minimums)
    with pytest.raises(RuntimeError, match="do not match"):
        cpu_kernels.q4_mm(torch.randn(2, 128), packed, 32)


def test_a_projection_keeps_its_layout_through_the_weights_cache() -> None:
    dense = torch.randn(48, 96) * 0.05
    projection = build(WeightFormat.INT4, dense, q8=True)
    assert isinstance(projection, Int4Q8)
    copy = restore(projection.state())
    x = torch.randn(5, 96)
    assert torch.equal(copy(x), projection(x))
    # half a byte per weight, fp16 scale and minimum per 32
    assert projection.nbytes == 48 * 96 // 2 + 48 * 96 // 32 * 4


def test_rms_norm_matches_torchs() -> None:
    x, weight = torch.randn(7, 3, 40), torch.randn(40)
    expected = torch.nn.functional.rms_norm(x, (40,), weight, 1e-5)
    assert torch.allclose(cpu_kernels.rms_norm(x, weight, 1e-5), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads, kv_heads, hd", [(9, 3, 64), (4, 4, 32), (8, 2, 128)])
def test_decode_attention_reads_each_rows_own_length_like_sdpa(heads: int, kv_heads: int, hd: int) -> None:
    generator = torch.Generator().manual_seed(3)
    slots, capacity = 5, 70
    keys = torch.randn(slots, kv_heads, capacity, hd, generator=generator)
    values = torch.randn(slots, kv_heads, capacity, hd, generator=generator)
    rows = [(3, 1), (0, 17), (4, 70), (1, 33)]  # (slot, length): a row of one position, one of the whole capacity
    q = torch.randn(len(rows), heads, hd, generator=generator)
    got = cpu_kernels.decode_attention(
        q, keys, values, torch.tensor([s for s, _ in rows]), torch.tensor([n for _, n in rows]), hd**-0.5
    )
    for i, (slot, length) in enumerate(rows):
        # [KV, group, hd] -> [H, hd]
        expected = torch.nn.functional.scaled_dot_product_attention(
            q[i].view(kv_heads, heads // kv_heads, hd), keys[slot, :, :length], values[slot, :, :length]
        ).reshape(heads, hd)
        assert torch.allclose(got[i], expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("rope_pairs", [32, 16])
def test_roped_decode_attention_is_rope_then_cache_write_then_decode_attention(rope_pairs: int) -> None:
    from inference.model import apply_rope

    generator = torch.Generator().manual_seed(5)
    heads, kv_heads, hd, capacity = 9, 3, 64, 40
    keys = torch.randn(3, kv_heads, capacity, hd, generator=generator)
    values = torch.randn(3, kv_heads, capacity, hd, generator=generator)
    rows = [(2, 10), (0, 0), (1, 5), (1, 6)]  # (slot, position): the last two are one slot's two-token chunk
    slots, positions = torch.tensor([s for s, _ in rows]), torch.tensor([p for _, p in rows])
    qkv = torch.randn(len(rows), (heads + 2 * kv_heads) * hd, generator=generator)
    angles = torch.rand(len(rows), rope_pairs, generator=generator, dtype=torch.float64) * 100
    freqs = torch.polar(torch.ones_like(angles), angles).to(torch.complex64)  # [n, R]
    expected_keys, expected_values = keys.clone(), values.clone()
    split = qkv.view(len(rows), heads + 2 * kv_heads, hd)
    qk = apply_rope(split[:, : heads + kv_heads], freqs)
    expected_keys[slots, :, positions] = qk[:, heads:]
    expected_values[slots, :, positions] = split[:, heads + kv_heads :]
    expected = cpu_kernels.decode_attention(
        qk[:, :heads], expected_keys, expected_values, slots, positions + 1, hd**-0.5
    )
    got = cpu_kernels.roped_decode_attention(
        qkv, torch.view_as_real(freqs), keys, values, slots, positions + 1, heads, hd**-0.5
    )
    # the same bits as torch's rotation
    assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)
    assert torch.equal(got, expected.view(len(rows), heads * hd))


def test_roped_decode_attention_refuses_a_position_outside_the_cache() -> None:
    keys = torch.zeros(2, 1, 8, 32)
    with pytest.raises(RuntimeError, match="outside the cache"):
        cpu_kernels.roped_decode_attention(
            torch.zeros(1, 3 * 32),
            torch.zeros(1, 16, 2),
            keys,
            keys.clone(),
            torch.tensor([0]),
            torch.tensor([9]),
            1,
            0.25,
        )


def test_decode_attention_refuses_rows_outside_the_cache() -> None:
    keys = torch.zeros(2, 1, 8, 32)
    with pytest.raises(RuntimeError, match="outside the cache"):
        cpu_kernels.decode_attention(torch.zeros(1, 1, 32), keys, keys, torch.tensor([2]), torch.tensor([4]), 0.25)
    with pytest.raises(RuntimeError, match="head_dim must be"):
        cpu_kernels.decode_attention(
            torch.zeros(1, 1, 48),
            torch.zeros(2, 1, 8, 48),
            torch.zeros(2, 1, 8, 48),
            torch.tensor([0]),
            torch.tensor([4]),
            0.25,
        )


@pytest.mark.parametrize("vocab", [49152, 1000, 7])
def test_row_summary_gives_torchs_logsumexp_and_the_first_best_token(vocab: int) -> None:
    logits = torch.randn(9, vocab, generator=torch.Generator().manual_seed(3)) * 8
    logits[2, : vocab // 2] = float("-inf")  # a grammar's masked tokens
    logits[4, vocab - 1] = logits[4, 0] = 1000.0  # a tie: the first one wins, as torch's max gives it
    log_z, best = cpu_kernels.row_summary(logits)
    assert torch.allclose(log_z, torch.logsumexp(logits, dim=-1), rtol=1e-6, atol=1e-5)
    assert best.tolist() == logits.max(dim=-1).indices.tolist() and int(best[4]) == 0


def test_near_best_finds_what_nonzero_finds_in_the_same_order() -> None:
    logits = torch.randn(8, 49152, generator=torch.Generator().manual_seed(4)) * 3
    logits[5] = 0.0  # a whole row within the margin
    rows, tokens = cpu_kernels.near_best(logits, 4.0)
    expected_rows, expected_tokens = (logits >= logits.amax(dim=-1, keepdim=True) - 4.0).nonzero(as_tuple=True)
    assert torch.equal(rows, expected_rows) and torch.equal(tokens, expected_tokens)


def test_the_kernel_setting_is_checked_by_name() -> None:
    assert cpu_kernels.isa("off") is None
    with pytest.raises(ValueError, match="ROUNDTRIP_CPU_KERNELS='sse4'"):
        cpu_kernels.isa("sse4")


def test_the_settings_choices_are_the_instruction_sets_built_for() -> None:
    assert set(CPU_KERNELS) == {"auto", "off"} | {isa.name for isa in cpu_kernels.ISAS}


def test_it_is_built_for_an_instruction_set_this_cpu_has() -> None:
    named = cpu_kernels.isa(cpu_kernels.loaded_isa())
    assert named is not None and named.name == cpu_kernels.loaded_isa()


def _amx_build() -> bool:
    return cpu_kernels.loaded_isa() == "avx512-amx"


@pytest.mark.hardware("amx")
@pytest.mark.parametrize("n, k", [(16, 32), (48, 96), (576, 1536), (1536, 576)])
@pytest.mark.parametrize("parts", [1, 2])
def test_the_amx_path_gives_the_vector_paths_bits_for_any_batch(n: int, k: int, parts: int) -> None:
    """Whichever path a batch size takes (it is chosen by timing), a request's tokens are the same."""
    if not _amx_build():
        pytest.skip("ROUNDTRIP_CPU_KERNELS chose a build without the AMX path")
    blocks = _blocks(n, k)
    packed = cpu_kernels.q4_pack(blocks.codes, blocks.scales, blocks.minimums)
    chosen = cpu_kernels.amx_from_rows()
    try:
        for rows in (1, 2, 5, 8, 9, 13, 16, 17, 33, 70):
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
            assert torch.ops.roundtrip.q4_mm_amx_from(0) == 0
            vector = cpu_kernels.q4_mm(x, packed, n, parts)
            assert torch.ops.roundtrip.q4_mm_amx_from(1) == 1
            assert torch.equal(cpu_kernels.q4_mm(x, packed, n, parts), vector), f"{rows} rows"
    finally:
        torch.ops.roundtrip.q4_mm_amx_from(chosen)


def test_the_amx_batch_size_is_chosen_by_timing_both_paths_on_the_weights() -> None:
    blocks = _blocks(1536, 576)
    weights = [(cpu_kernels.q4_pack(blocks.codes, blocks.scales, blocks.minimums), 1536, 576)] * 4
    chosen = cpu_kernels.choose_amx_rows(weights, rows=(1, 8, 16), rounds=1)
    if not _amx_build():
        assert chosen == 0 and cpu_kernels.amx_from_rows() == 0
        return
    assert chosen in (0, 1, 8, 16) and cpu_kernels.amx_from_rows() == chosen
    assert ("AMX tiles from" in cpu_kernels.describe()) == (chosen > 0)
