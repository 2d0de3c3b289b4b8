"""Every architecture we run, on a tiny GGUF written with its real tensor names and metadata keys: the model against
an independent float64 re-implementation of that architecture, batched against alone, cached against uncached, with
and without our CPU kernels (the decode kernel takes a sliding window itself; torch's attention gets it as a mask)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from forward import all_logits, forward
from gguf import GGMLQuantizationType
from load_settings import cpu
from naive_transformer import file_weights, kv_rounding, naive_logits
from tiny_gguf import TinySpec, write_tiny_gguf

from inference import cpu_kernels, what_if
from inference.batch import Chunk
from inference.errors import ModelFileError
from inference.gguf_file import GGUFFile
from inference.loader import LoadedModel, load_model

# Each family with what makes it differ: Llama 3's frequency divisors, Qwen 2's biases, Qwen 3's QK-norm and a head
# size that is not width / heads, Gemma 3's everything (a 4-position window on 5 of its 6 layers, so the 12-token
# prompts below outgrow it).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama3": {"architecture": "llama", "rope_freqs": True, "tokenizer_pre": "llama-bpe"},
    "qwen2": {"architecture": "qwen2", "tokenizer_pre": "qwen2"},
    "qwen3": {"architecture": "qwen3", "head_dim": 32, "tokenizer_pre": "qwen2"},
    "gemma3": {
        "architecture": "gemma3",
        "head_dim": 32,
        "n_heads": 2,
        "n_kv_heads": 1,
        "n_layers": 6,
        "sliding_window": 4,
    },
}
IDS = [1, 120, 45, 200, 7, 99, 250, 3, 61, 62, 63, 64]
# float32 against float64 through 2 to 6 layers of random weights, keys and values through a float16 cache when the
# decode kernel reads one: the reference rounds its keys as the cache does, the rest is float32's own error
TOLERANCE = 2e-4


# float32 matrix products of different row counts (and torch's attention over a prompt against a decode row) can
# differ in the last bit, which Gemma's float16 GELU (as ggml rounds it) can turn into a float16 step; the int4 x int8
# kernels compute a row alike in any batch (`test_quantized_rows_give_the_same_bits_in_any_batch`)
ATOL = 1e-3


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def model_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinySpec(**ARCHITECTURES[request.param])
    return write_tiny_gguf(tmp_path_factory.mktemp(request.param) / f"{request.param}.gguf", spec)


@pytest.fixture(scope="module", params=["kernels", "torch"])
def loaded(request: pytest.FixtureRequest, model_file: Path) -> LoadedModel:
    return load_model(str(model_file), cpu(cpu_kernels="auto" if request.param == "kernels" else "off"))


def test_logits_match_an_independent_float64_implementation(loaded: LoadedModel) -> None:
    expected = naive_logits(loaded.config, file_weights(loaded), IDS, kv_rounding(loaded))
    got = all_logits(loaded.model, IDS).numpy()
    assert np.abs(got - expected).max() < TOLERANCE * max(1.0, float(np.abs(expected).max()))


def test_cached_decoding_equals_uncached(loaded: LoadedModel) -> None:
    model = loaded.model
    cache = model.new_cache(1, len(IDS))
    rows = [forward(model, cache, [(Chunk(0, 0, 3), IDS[:3])])]
    rows += [forward(model, cache, [(Chunk(0, p, 1), [IDS[p]])]) for p in range(3, len(IDS))]
    assert torch.allclose(torch.cat(rows), all_logits(model, IDS)[2:], atol=ATOL)


def test_a_batched_step_gives_each_sequence_what_it_gets_alone(loaded: LoadedModel) -> None:
    model = loaded.model
    a, b, c = IDS[:9], IDS[3:], IDS[:5]
    cache = model.new_cache(3, 16)
    forward(model, cache, [(Chunk(0, 0, 8), a[:8]), (Chunk(1, 0, 8), b[:8])])
    forward(model, cache, [(Chunk(2, 0, 2), c[:2])])
    step = forward(model, cache, [(Chunk(0, 8, 1), a[8:]), (Chunk(1, 8, 1), b[8:]), (Chunk(2, 2, 3), c[2:])])
    for row, alone in zip(step, (a, b, c)):
        assert torch.allclose(row, all_logits(model, alone)[-1], atol=ATOL)


@pytest.mark.parametrize("kernels", ["auto", "off"])
def test_a_sliding_window_layer_does_not_see_past_its_window(tmp_path: Path, kernels: str) -> None:
    """Gemma's local layers: changing a token the window has left behind changes nothing in a model of local layers
    only (its global layer would see it), and does change the output of the whole model."""
    model_file = write_tiny_gguf(tmp_path / "gemma.gguf", TinySpec(**ARCHITECTURES["gemma3"]))
    loaded = load_model(str(model_file), cpu(cpu_kernels=kernels))
    model = loaded.model
    window = loaded.config.sliding_window
    changed = [IDS[0] + 1] + IDS[1:]
    assert not torch.allclose(all_logits(model, IDS)[-1], all_logits(model, changed)[-1])
    model.blk = model.blk[:3]  # three local layers: the last position reaches back 3 x 3 positions, not to the first
    try:
        assert all(block.window == window for block in model.blk)
        last = [all_logits(model, ids)[-1] for ids in (IDS, changed)]
        assert torch.equal(last[0], last[1])
    finally:
        model.blk = load_model(str(model_file), cpu(cpu_kernels=kernels)).model.blk


@pytest.mark.parametrize("block", [GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q5_0])
def test_quantized_rows_give_the_same_bits_in_any_batch(tmp_path: Path, block: GGMLQuantizationType) -> None:
    """A Gemma file of 8- and 5-bit blocks runs them as they are (`Int8Q8`, whatever torch's int4 kernels measure),
    and a sequence decoded beside others or after a chunked prompt gets exactly the logits it gets alone."""
    spec = TinySpec(**{**ARCHITECTURES["gemma3"], "dim": 128, "ffn_dim": 128, "head_dim": 64}, linear_type=block)
    model = load_model(str(write_tiny_gguf(tmp_path / "q.gguf", spec)), cpu(weights="int4")).model
    assert model.blk[0].attn_qkv.__class__.__name__ == "Int8Q8"
    a, b = IDS[:9], IDS[3:]
    cache = model.new_cache(2, 16)
    forward(model, cache, [(Chunk(0, 0, 4), a[:4]), (Chunk(1, 0, 8), b[:8])])
    forward(model, cache, [(Chunk(0, 4, 4), a[4:8])])
    step = forward(model, cache, [(Chunk(0, 8, 1), a[8:]), (Chunk(1, 8, 1), b[8:])])
    for row, alone in zip(step, (a, b)):
        assert torch.equal(row, all_logits(model, alone)[-1])


def test_an_unknown_architecture_is_a_clear_error_naming_it(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "mamba.gguf", TinySpec(architecture="mamba"))
    with pytest.raises(ModelFileError, match=r"unsupported architecture 'mamba'.*gemma3") as raised:
        load_model(str(path), cpu())
    assert str(path) in str(raised.value)


def test_a_missing_family_tensor_is_named(tmp_path: Path) -> None:
    spec = TinySpec(**ARCHITECTURES["gemma3"], omit_tensors=["blk.2.post_ffw_norm.weight"])
    path = write_tiny_gguf(tmp_path / "g.gguf", spec)
    with pytest.raises(ModelFileError, match=r"blk\.2\.post_ffw_norm\.weight"):
        load_model(str(path), cpu())


def test_the_probe_and_the_what_if_tools_see_what_each_architecture_computes(loaded: LoadedModel) -> None:
    """The full-level detail recomputed for a position (attention, logit lens, neurons) and a layer's prompt
    attention matrix, on every family: a local layer's weights are zero outside its window, each row sums to 1, and
    the last layer's lens is the model's own prediction."""
    model, config = loaded.model, loaded.config
    detail = what_if.inspect(model, IDS)
    attention = torch.from_numpy(detail.attention.astype("float32"))  # [L, H, S]
    assert tuple(attention.shape) == (config.n_layers, config.n_heads, len(IDS))
    assert torch.allclose(attention.sum(-1), torch.ones(config.n_layers, config.n_heads), atol=1e-2)
    for layer in range(config.n_layers):
        first = len(IDS) - config.window(layer) if config.window(layer) else 0
        assert float(attention[layer, :, :first].abs().sum()) == 0.0
    assert detail.logit_lens[-1].token_id == int(all_logits(model, IDS)[-1].argmax())
    assert len(detail.top_neurons) == config.n_layers
    for layer in range(config.n_layers):
        matrix = what_if.prompt_attention(model, IDS, layer)  # [H, T, T]
        window = config.window(layer)
        for row in range(len(IDS)):
            seen = range(max(0, row + 1 - window) if window else 0, row + 1)
            assert float(matrix[:, row, [p for p in range(len(IDS)) if p not in seen]].abs().sum()) == 0.0


def test_an_unknown_tokenizer_model_is_a_clear_error_naming_it(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "bert.gguf", TinySpec(tokenizer_model="bert"))
    with pytest.raises(ModelFileError, match=r"tokenizer model 'bert' is not supported; supported: 'gpt2'.*'llama'"):
        load_model(str(path), cpu())


def test_an_unsupported_tensor_type_is_a_clear_error_naming_the_tensor(tmp_path: Path) -> None:
    """Q8_K is ggml's activation format, never a weight's: the gguf package cannot dequantize it, nor can we."""
    path = write_tiny_gguf(tmp_path / "q8k.gguf", TinySpec(dim=256, ffn_dim=256, linear_type=GGMLQuantizationType.Q8_K))
    with pytest.raises(ModelFileError, match=r"tensor 'blk\.0\.attn_q\.weight' uses Q8_K, which cannot be dequantized"):
        load_model(str(path), cpu())


def test_q6_k_runs_exactly_through_its_own_kernel(tmp_path: Path) -> None:
    """Q6_K's scale per 16 weights kept as the file holds it (`Int6Q8`): its multiply equals the file's own values
    times the activations, to the rounding of the activations (two int8 parts: within float32's reach)."""
    spec = TinySpec(
        **{**ARCHITECTURES["gemma3"], "dim": 256, "ffn_dim": 256, "n_heads": 4, "head_dim": 64},
        linear_type=GGMLQuantizationType.Q6_K,
    )
    path = write_tiny_gguf(tmp_path / "q6k.gguf", spec)
    model = load_model(str(path), cpu(weights="int4")).model
    down = model.blk[0].ffn_down
    assert type(down).__name__ == "Int6Q8"
    weight = torch.from_numpy(GGUFFile(str(path)).dequantize("blk.0.ffn_down.weight"))
    x = torch.randn(3, 256)
    exact = x @ weight.T
    two_parts = cpu_kernels.matmul("q6", x, down.packed, down.out_features, 2)
    assert (two_parts - exact).abs().max() < 1e-3 * exact.abs().max()
