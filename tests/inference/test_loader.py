"""Loading GGUF files: every quantization type, tied weights, clear errors, progress and the cache."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from load_settings import cpu

from inference.errors import ModelFileError
from inference.gguf_file import GGUFFile
from inference.loader import default_model_path, load_model
from inference.progress import LoadProgress

BLOCKED_TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.BF16]
K_TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K]


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, *BLOCKED_TYPES, *K_TYPES], ids=lambda q: q.name)
def test_it_loads_each_tensor_type_as_ggufs_own_dequantization(write_gguf: Any, qtype: Q) -> None:
    # K-quants pack 256 values per block, so their rows need a width of 256.
    width = 256 if qtype in K_TYPES else 64
    path = write_gguf(linear_type=qtype, dim=width, ffn_dim=width)
    loaded = load_model(str(path), cpu())
    gguf = GGUFFile(path)
    assert gguf.tensor_type("blk.0.attn_q.weight") == qtype
    expected = gguf.dequantize("blk.1.ffn_down.weight")
    assert np.array_equal(loaded.model.blk[1].ffn_down.weight.numpy(), expected)
    assert torch.isfinite(loaded.model.blk[1].ffn_down.weight).all()
    q_rows = loaded.config.n_heads * loaded.config.head_dim  # attn_qkv stacks the file's attn_q, attn_k and attn_v
    assert np.array_equal(loaded.model.blk[1].attn_qkv.weight[:q_rows].numpy(), gguf.dequantize("blk.1.attn_q.weight"))


def test_quantized_weights_stay_close_to_the_originals(write_gguf: Any) -> None:
    exact = load_model(str(write_gguf("a.gguf", linear_type=Q.F32)), cpu())
    q8 = load_model(str(write_gguf("b.gguf", linear_type=Q.Q8_0)), cpu())
    a, b = exact.model.blk[0].attn_qkv.weight, q8.model.blk[0].attn_qkv.weight
    assert (a - b).abs().max() < 0.02 * a.abs().max()


def test_tied_embeddings_share_the_output_projection(tiny_model: Any) -> None:
    assert tiny_model.model.output is tiny_model.model.token_embd


def test_the_default_model_is_smollm2_from_the_wheel(smollm2: Any) -> None:
    assert default_model_path().endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    c = smollm2.config
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim) == (30, 576, 9, 3, 64, 1536)
    assert (c.vocab_size, c.context_length, c.rope_base) == (49152, 8192, 100000.0)


def test_an_unknown_architecture_is_named(write_gguf: Any) -> None:
    path = write_gguf(architecture="mamba")
    with pytest.raises(ModelFileError, match="unsupported architecture 'mamba'") as info:
        load_model(str(path), cpu())
    assert str(path) in str(info.value)


def test_a_missing_tensor_is_named(write_gguf: Any) -> None:
    path = write_gguf(omit_tensors=["blk.1.ffn_up.weight"])
    with pytest.raises(ModelFileError, match=r"tensor 'blk.1.ffn_up.weight' is missing"):
        load_model(str(path), cpu())


def test_a_truncated_file_is_reported(write_gguf: Any) -> None:
    path = write_gguf()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError) as info:
        load_model(str(path), cpu())
    assert str(path) in str(info.value)


def test_a_file_that_is_not_gguf_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "notes.gguf"
    path.write_text("hello, I am not a model")
    with pytest.raises(ModelFileError, match="not a readable GGUF file"):
        load_model(str(path), cpu())


def test_a_missing_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="no such file"):
        load_model(str(tmp_path / "absent.gguf"))


def test_a_file_without_hyper_parameters_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "bare.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b"])
    writer.add_token_merges(["a b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFileError, match=r"'llama\.embedding_length' is missing"):
        load_model(str(path), cpu())


def test_loading_reports_progress_through_every_tensor(write_gguf: Any) -> None:
    events: list[LoadProgress] = []
    load_model(str(write_gguf()), cpu(), events.append)
    dequant = [e for e in events if e.stage == "converting"]
    assert [e.done for e in dequant] == list(range(1, dequant[0].total + 1))
    assert events[-1].stage == "building" and events[-1].fraction == 1.0


def test_the_second_load_comes_from_the_cache_with_the_same_weights(write_gguf: Any, tmp_path: Path) -> None:
    path = str(write_gguf())
    cached = cpu(use_cache=True, cache_dir=tmp_path / "cache")
    first = load_model(path, cached)
    second = load_model(path, cached)
    assert not first.from_cache and second.from_cache
    for (name, a), (_, b) in zip(first.model.state_dict().items(), second.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert second.tokenizer.encode("the heat").ids == first.tokenizer.encode("the heat").ids


def test_replacing_the_file_misses_the_cache(write_gguf: Any, tmp_path: Path) -> None:
    path = write_gguf(seed=1)
    cached = cpu(use_cache=True, cache_dir=tmp_path / "cache")
    load_model(str(path), cached)
    write_gguf(seed=2)  # same name, new weights
    os.utime(path, ns=(0, 10**18))
    reloaded = load_model(str(path), cached)
    assert not reloaded.from_cache
    q_rows = reloaded.config.n_heads * reloaded.config.head_dim
    assert np.array_equal(
        reloaded.model.blk[0].attn_qkv.weight[:q_rows].numpy(), GGUFFile(path).dequantize("blk.0.attn_q.weight")
    )


def test_it_names_the_kv_cache_choices_for_a_mistyped_setting(write_gguf: Any) -> None:
    with pytest.raises(ModelFileError, match=r"ROUNDTRIP_KV_CACHE='fp8': use auto, float32, float16"):
        load_model(str(write_gguf()), cpu(kv_cache="fp8"))


def test_the_kv_cache_setting_sets_the_caches_dtype(write_gguf: Any) -> None:
    loaded = load_model(str(write_gguf()), cpu(kv_cache="float16"))
    assert loaded.model.new_cache(1, 4).k.dtype == torch.float16
