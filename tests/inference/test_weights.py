"""Weight formats on a tiny model written as Q4_1 (the default model's own type): each against the plain float64
re-computation from the file's weights, cached against uncached, and the file's own blocks kept as they are.

Tolerances, as a fraction of the largest logit: fp32 1e-5 (float round-off); bf16 2 % (activations rounded to 8
bits into every projection; measured 0.3 %); int8 4 % (the Q4_1 weights re-rounded per row; measured 0.9 %); int4
4 % (the file's blocks exactly, scales rounded to bf16 and bf16 activations; measured 0.9 %).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from forward import last_logits
from gguf import GGMLQuantizationType as Q
from load_settings import cpu
from naive_transformer import file_weights, kv_rounding, naive_logits
from tiny_gguf import TinySpec, write_tiny_gguf

from inference.batch import Chunk
from inference.gguf_file import GGUFFile
from inference.loader import LoadedModel, load_model
from inference.weights import Head, Int4, Int4Q8, Int8Rows, Q4Blocks, WeightFormat

TOLERANCE = {"fp32": 1e-5, "bf16": 0.02, "int8": 0.04, "int4": 0.04}
IDS = [1, 120, 45, 200, 7, 99, 250, 3]


@pytest.fixture(scope="module")
def q4_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(
        tmp_path_factory.mktemp("q4") / "tiny-q4_1.gguf", TinySpec(linear_type=Q.Q4_1, tied_embeddings=True)
    )


def _load(path: Path, weights: str) -> LoadedModel:
    return load_model(str(path), cpu(weights=weights))


def _every_logit(loaded: LoadedModel, ids: list[int]) -> np.ndarray:
    model = loaded.model
    with torch.inference_mode():
        return model(
            torch.tensor(ids),
            model.plan([Chunk(0, 0, len(ids))]),
            model.new_cache(1, len(ids)),
            logits_for=torch.arange(len(ids)),
        ).numpy()


@pytest.mark.parametrize("weights", list(TOLERANCE))
def test_each_format_matches_the_plain_recomputation_within_its_tolerance(q4_path: Path, weights: str) -> None:
    loaded = _load(q4_path, weights)
    expected = naive_logits(loaded.config, file_weights(loaded), IDS, kv_rounding(loaded))
    got = _every_logit(loaded, IDS)
    assert np.abs(got - expected).max() <= TOLERANCE[weights] * np.abs(expected).max()
    assert (got.argmax(-1) == expected.argmax(-1)).all()


@pytest.mark.parametrize("weights", list(TOLERANCE))
def test_each_format_decodes_through_the_cache_as_it_computes_without_it(q4_path: Path, weights: str) -> None:
    loaded = _load(q4_path, weights)
    model = loaded.model
    full = torch.from_numpy(_every_logit(loaded, IDS))
    cache = model.new_cache(1, len(IDS))
    rows = []
    with torch.inference_mode():
        model(torch.tensor(IDS[:3]), model.plan([Chunk(0, 0, 3)]), cache)
        for position in range(3, len(IDS)):
            rows.append(model(torch.tensor([IDS[position]]), model.plan([Chunk(0, position, 1)]), cache)[0])
    # bf16 projections round a 1-row and an 8-row batch differently; the cache itself adds nothing.
    assert torch.allclose(torch.stack(rows), full[3:], atol=TOLERANCE[weights] * float(full.abs().max()))


def test_int4_runs_the_files_own_q4_1_blocks(q4_path: Path) -> None:
    loaded = _load(q4_path, "int4")
    down = loaded.model.blk[0].ffn_down
    assert isinstance(down, (Int4, Int4Q8))  # torch's layout, or our int4 x int8 kernel's where it measured faster
    exact = torch.from_numpy(GGUFFile(q4_path).dequantize("blk.0.ffn_down.weight"))  # [dim, ffn]
    identity = torch.eye(down.in_features)
    recovered = down(identity).float().t()  # each row of the identity picks one input column
    assert torch.allclose(recovered, exact, atol=0.01 * float(exact.abs().max()))


def test_q4_blocks_from_the_file_equal_its_dequantization(q4_path: Path) -> None:
    gguf = GGUFFile(q4_path)
    raw = gguf.q4_blocks("blk.1.attn_q.weight")
    assert raw is not None
    blocks = Q4Blocks(*(torch.from_numpy(a) for a in raw))
    assert torch.equal(blocks.dequantize(), torch.from_numpy(gguf.dequantize("blk.1.attn_q.weight")))


def test_a_quantized_head_keeps_the_files_q8_0_rows_exactly(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "q8.gguf", TinySpec(linear_type=Q.Q8_0, dim=64, ffn_dim=96))
    head = _load(path, "int4").model.output
    assert isinstance(head, Head)
    ids = torch.tensor([0, 5, 268])
    assert torch.equal(head.rows(ids), torch.from_numpy(GGUFFile(path).dequantize("token_embd.weight"))[ids])


def test_a_bf16_head_gets_exact_logits_for_its_likeliest_tokens(q4_path: Path) -> None:
    """The head multiplies in bf16 (logits rounded to 8 bits); the best candidates are recomputed in float32."""
    loaded = _load(q4_path, "int4")
    model = loaded.model
    h = torch.randn(2, loaded.config.dim, generator=torch.Generator().manual_seed(1))
    logits = model.logits(h)
    normed = torch.nn.functional.rms_norm(h, (loaded.config.dim,), model.output_norm, loaded.config.norm_eps)
    best = logits.argmax(-1)
    exact = (model.output.rows(best) * normed).sum(-1)
    assert torch.allclose(logits.gather(1, best[:, None])[:, 0], exact, atol=1e-5)


def test_int8_rows_round_trip_within_half_a_step() -> None:
    weight = torch.randn(48, 64)
    table = Int8Rows.quantize(weight)
    step = table.scales.repeat_interleave(32, dim=1)
    assert ((table.rows(torch.arange(48)) - weight).abs() <= step / 2 + 1e-6).all()


def test_the_weights_setting_names_the_allowed_values(q4_path: Path) -> None:
    from inference.errors import ModelFileError

    with pytest.raises(ModelFileError, match="use auto, one of fp32, bf16, int8, int4"):
        _load(q4_path, "int3")


@pytest.mark.parametrize("weights", ["int4", "bf16"])
def test_the_real_model_in_a_compact_format_picks_the_fp32_models_tokens(smollm2: LoadedModel, weights: str) -> None:
    """Against the float32 model (itself checked against a float64 re-computation in test_model.py), on the tokens
    that matter: the 20 likeliest. (An int4 head only ranks the vocabulary; far-off tokens' logits may be off by
    a few units, which changes no probability that anyone would see.)"""
    compact = load_model(settings=cpu(weights=weights, use_cache=True))
    assert compact.weights.decode is WeightFormat(weights)
    ids = smollm2.tokenizer.encode("What's the capital of India? The capital of India is").ids
    ours, reference = last_logits(compact.model, ids), last_logits(smollm2.model, ids)
    likely = reference.topk(20).indices
    best, ours_best = int(reference.argmax()), int(ours.argmax())
    # the same token, or a near-tie (bf16 on AMD)
    assert ours_best == best or float(reference[best] - reference[ours_best]) < 0.5
    assert float((ours[likely] - reference[likely]).abs().max()) < 0.05 * float(reference.abs().max())
