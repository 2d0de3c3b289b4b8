"""The CUDA path (bf16 weights and stream): the same checks as on the CPU, where a GPU is present."""

from __future__ import annotations

import pytest
import torch
from forward import last_logits

from inference.load_config import LoadConfig
from inference.loader import LoadedModel, load_model
from inference.params import SamplingParams
from inference.pipeline import ChatPipeline
from inference.trace import Finished

pytestmark = pytest.mark.hardware("cuda")


@pytest.fixture(scope="module")
def on_gpu() -> LoadedModel:
    return load_model(settings=LoadConfig(device="cuda"))


def test_it_runs_bf16_on_the_gpu(on_gpu: LoadedModel) -> None:
    assert on_gpu.device.type == "cuda" and on_gpu.dtype == torch.bfloat16
    assert on_gpu.weights_description.startswith("bf16")


def test_the_seed_question_is_answered_on_the_gpu(on_gpu: LoadedModel) -> None:
    pipeline = ChatPipeline(on_gpu)
    request = pipeline.prepare(
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What's the capital of India?"},
        ],
        SamplingParams(temperature=0.0, max_tokens=64),
    )
    done = list(pipeline.stream(request))[-1]
    assert isinstance(done, Finished) and "New Delhi" in done.text


def test_gpu_logits_match_the_cpu_float32_model_on_the_likeliest_tokens(
    on_gpu: LoadedModel, smollm2: LoadedModel
) -> None:
    ids = smollm2.tokenizer.encode("What's the capital of India? The capital of India is").ids
    ours, reference = last_logits(on_gpu.model, ids).cpu(), last_logits(smollm2.model, ids)
    likely = reference.topk(20).indices
    assert int(ours.argmax()) == int(reference.argmax())
    assert float((ours[likely] - reference[likely]).abs().max()) < 0.05 * float(reference.abs().max())
