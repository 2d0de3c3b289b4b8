"""The real SmolLM2-135M-Instruct against llama.cpp on the same file (shared/reference)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from forward import last_logits
from load_settings import cpu

from inference.chat_template import Message
from inference.loader import load_model
from inference.params import SamplingParams
from inference.pipeline import ChatPipeline
from inference.trace import Finished, ForwardStep, Sampled, TextDelta, TraceLevel

SYSTEM = "You are a helpful assistant."


def test_the_seed_example_answers_new_delhi_and_stops_on_im_end(smollm2_pipeline: ChatPipeline) -> None:
    request = smollm2_pipeline.prepare(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What's the capital of India?"}],
        SamplingParams(temperature=0.0, max_tokens=64),
    )
    events = list(smollm2_pipeline.stream(request))
    done = events[-1]
    assert isinstance(done, Finished)
    assert done.text == "The capital of India is New Delhi."
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == done.text
    assert done.finish_reason == "stop"
    last = [e for e in events if isinstance(e, Sampled)][-1]
    assert last.is_stop and last.token_id == smollm2_pipeline.loaded.tokenizer.special_ids["<|im_end|>"]
    assert done.prompt_tokens == 27


@pytest.fixture(scope="module")
def precise_pipeline() -> Iterator[ChatPipeline]:
    """The default format with our int4 kernel's activations in two int8 parts (`ROUNDTRIP_Q4_ACTIVATIONS=int8x2`)."""
    yield ChatPipeline(load_model(settings=cpu(weights="auto", use_cache=True, q4_activations="int8x2")))


@pytest.fixture(scope="module")
def default_pipeline() -> ChatPipeline:
    """The real model in the weight format a user gets by default (int4 on a CPU, chosen by measurement)."""
    return ChatPipeline(load_model(settings=cpu(weights="auto", use_cache=True)))


@pytest.mark.parametrize(
    "question, answer",
    [
        ("What's the capital of India?", "The capital of India is New Delhi."),
        ("What is the capital of France?", "The capital of France is Paris."),
    ],
)
def test_int8x2_activations_answer_the_pages_questions_like_float32(
    precise_pipeline: ChatPipeline, question: str, answer: str
) -> None:
    """With the page's system prompt both answers pass a near-tie (0.08 logits at France's first token); one int8 per
    activation flipped India's to "Mumbai" here (llama.cpp, rounding at its own points, says New Delhi); two int8 parts
    give float32's answers."""
    request = precise_pipeline.prepare(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        SamplingParams(temperature=0.0, max_tokens=24),
    )
    done = list(precise_pipeline.stream(request))[-1]
    assert isinstance(done, Finished) and done.text == answer


@pytest.mark.parametrize("weights", ["fp32", "default"])
@pytest.mark.parametrize("case_index", range(4))
def test_greedy_output_agrees_with_llama_cpp_up_to_a_near_tie(
    request: pytest.FixtureRequest, llamacpp_reference: dict[str, Any], case_index: int, weights: str
) -> None:
    """Identical at the start; where the two diverge, llama.cpp's token is our close second (README).
    fp32 agreed for 32/32, 9/9, 11/32 and 22/25 tokens. The default format with our int4 kernel rounds every
    projection's input to int8, as llama.cpp does but at its own rounding points, so it may part from llama.cpp at
    the first near-tie: on cases 1 and 2 at tokens 2 and 0, where the two best logits were 0.22 and 0.24 apart."""
    smollm2_pipeline: ChatPipeline = request.getfixturevalue(
        "smollm2_pipeline" if weights == "fp32" else "default_pipeline"
    )
    case = llamacpp_reference["greedy"][case_index]
    expected: list[int] = case["greedy_ids"]
    request = smollm2_pipeline.prepare(
        [{"role": "system", "content": case["system"]}, {"role": "user", "content": case["user"]}],
        SamplingParams(temperature=0.0, max_tokens=len(expected)),
    )
    assert request.prompt.ids == case["prompt_ids"]
    ours = [e.token_id for e in smollm2_pipeline.stream(request) if isinstance(e, Sampled) and not e.is_stop]
    agreed = next((i for i, (a, b) in enumerate(zip(ours, expected)) if a != b), min(len(ours), len(expected)))
    if weights == "fp32":
        assert agreed >= min(9, len(expected))
    if agreed == len(expected):
        assert ours == expected
        return
    # A near-tie: both tokens among the best three, their logits within 0.5. (Recomputed in one multi-row pass, which a
    # split format such as int4 decode + fp32 prefill runs with the other weights, so either of the two may lead.)
    logits = last_logits(smollm2_pipeline.loaded.model, case["prompt_ids"] + expected[:agreed])
    best3 = torch.topk(logits, 3).indices.tolist()
    assert ours[agreed] in best3 and expected[agreed] in best3
    assert abs(float(logits[ours[agreed]] - logits[expected[agreed]])) < 0.5


def test_the_last_layers_logit_lens_is_the_samplers_probability_in_the_default_format(
    default_pipeline: ChatPipeline,
) -> None:
    """The logit lens after the last layer is the model's own prediction: in the compact head's format too, the page
    shows the same probability for it in the forward pass as in the sampling stage (the last step, <|im_end|> after
    "New Delhi.", once read 95.4 % against 71.3 %: the lens rows skipped the head's float32 refinement)."""
    messages: list[Message] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What's the capital of India?"},
    ]
    request = default_pipeline.prepare(messages, SamplingParams(temperature=0, max_tokens=12))
    forward: ForwardStep | None = None
    checked = 0
    for event in default_pipeline.stream(request, TraceLevel.FULL):
        if isinstance(event, ForwardStep):
            forward = event
        elif isinstance(event, Sampled):
            assert forward is not None and forward.detail is not None
            lens = forward.detail.logit_lens[-1]
            assert lens.token_id == event.token_id
            assert lens.prob == pytest.approx(math.exp(event.logprob), abs=0.005)
            checked += 1
    assert checked >= 9  # "The capital of India is New Delhi." and its end
