"""A chat request end to end on a tiny model: stop conditions, seeds, trace levels and timings."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from inference.chat_template import Message
from inference.errors import InvalidRequestError
from inference.params import SamplingParams
from inference.pipeline import ChatPipeline
from inference.trace import ContextBuilt, Finished, ForwardStep, Sampled, TextDelta, Tokenized, TraceEvent, TraceLevel

MESSAGES: list[Message] = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "the heat is on"}]


def _run(pipeline: ChatPipeline, level: TraceLevel = TraceLevel.OFF, **params: Any) -> list[TraceEvent]:
    request = pipeline.prepare(MESSAGES, SamplingParams(**params))
    return list(pipeline.stream(request, level))


def _finished(events: list[TraceEvent]) -> Finished:
    assert isinstance(events[-1], Finished)
    return events[-1]


def test_streamed_text_equals_the_final_text_and_the_decoded_tokens(tiny_pipeline: ChatPipeline) -> None:
    events = _run(tiny_pipeline, temperature=1.0, seed=5, max_tokens=40)
    streamed = "".join(e.text for e in events if isinstance(e, TextDelta))
    ids = [e.token_id for e in events if isinstance(e, Sampled) and not e.is_stop]
    assert streamed == _finished(events).text == tiny_pipeline.loaded.tokenizer.decode(ids)


def test_max_tokens_ends_with_length(tiny_pipeline: ChatPipeline) -> None:
    done = _finished(_run(tiny_pipeline, temperature=0.0, max_tokens=7))
    assert done.finish_reason == "length" and done.completion_tokens == 7


def test_a_stop_string_ends_the_text_just_before_it(tiny_pipeline: ChatPipeline) -> None:
    free = _finished(_run(tiny_pipeline, temperature=1.0, seed=9, max_tokens=40)).text
    stop = free[12:14]
    events = _run(tiny_pipeline, temperature=1.0, seed=9, max_tokens=40, stop=(stop,))
    done = _finished(events)
    assert done.finish_reason == "stop"
    assert done.text == free[: free.index(stop)]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == done.text


def test_the_same_seed_repeats_the_answer_and_another_does_not(tiny_pipeline: ChatPipeline) -> None:
    a = _finished(_run(tiny_pipeline, temperature=1.0, seed=123, max_tokens=20))
    b = _finished(_run(tiny_pipeline, temperature=1.0, seed=123, max_tokens=20))
    c = _finished(_run(tiny_pipeline, temperature=1.0, seed=124, max_tokens=20))
    assert a.text == b.text and a.text != c.text and a.seed == 123


def test_an_unseeded_request_reports_the_seed_that_repeats_it(tiny_pipeline: ChatPipeline) -> None:
    first = _finished(_run(tiny_pipeline, temperature=1.0, max_tokens=20))
    again = _finished(_run(tiny_pipeline, temperature=1.0, seed=first.seed, max_tokens=20))
    assert again.text == first.text


def test_off_level_yields_only_what_the_answer_needs(tiny_pipeline: ChatPipeline) -> None:
    events = _run(tiny_pipeline, temperature=0.0, max_tokens=5)
    assert {type(e) for e in events} <= {Sampled, TextDelta, Finished}
    assert all(e.detail is None for e in events if isinstance(e, Sampled))


def test_summary_level_traces_every_stage_without_layer_detail(tiny_pipeline: ChatPipeline) -> None:
    events = _run(tiny_pipeline, TraceLevel.SUMMARY, temperature=0.7, max_tokens=5)
    tokenized = next(e for e in events if isinstance(e, Tokenized))
    context = next(e for e in events if isinstance(e, ContextBuilt))
    steps = [e for e in events if isinstance(e, ForwardStep)]
    samples = [e for e in events if isinstance(e, Sampled)]
    assert context.prompt_tokens == len(tokenized.ids) and context.context_length == 256
    assert [s.phase for s in steps] == ["prefill"] + ["decode"] * (len(samples) - 1)
    assert steps[0].n_tokens == len(tokenized.ids)
    assert [s.kv_length for s in steps[1:]] == [len(tokenized.ids) + i for i in range(1, len(samples))]
    assert all(s.detail is None for s in steps)
    assert all(s.detail is not None and len(s.detail.candidates) == 10 for s in samples)
    times = [e.t for e in events]
    assert times == sorted(times)


def test_full_level_adds_attention_norms_and_logit_lens(tiny_pipeline: ChatPipeline) -> None:
    events = _run(tiny_pipeline, TraceLevel.FULL, temperature=0.0, max_tokens=3)
    config = tiny_pipeline.loaded.config
    steps = [e for e in events if isinstance(e, ForwardStep)]
    first = next(e for e in events if isinstance(e, Sampled))
    for step in steps:
        assert step.detail is not None
        attention = step.detail.attention
        assert attention.shape == (config.n_layers, config.n_heads, step.kv_length)
        assert np.allclose(attention.astype(np.float32).sum(-1), 1.0, atol=1e-2)
        assert len(step.detail.residual_norms) == config.n_layers + 1
        assert len(step.detail.logit_lens) == config.n_layers
    # The last layer's logit-lens guess is the model's own prediction: greedy picks it.
    prefill = steps[0].detail
    assert prefill is not None and prefill.logit_lens[-1].token_id == first.token_id


def test_timings_add_up(tiny_pipeline: ChatPipeline) -> None:
    done = _finished(_run(tiny_pipeline, TraceLevel.SUMMARY, temperature=0.0, max_tokens=6))
    t = done.timings
    assert len(t.token_times) == 6 and t.token_times == sorted(t.token_times)
    assert t.ttft == t.token_times[0] and 0 < t.prefill < t.ttft <= t.total
    assert t.mean_itl is not None and t.mean_itl > 0 and len(t.inter_token_latencies) == 5


@pytest.mark.parametrize("level", list(TraceLevel))
def test_every_level_gives_the_same_answer(tiny_pipeline: ChatPipeline, level: TraceLevel) -> None:
    baseline = _finished(_run(tiny_pipeline, temperature=0.9, seed=77, max_tokens=12)).text
    assert _finished(_run(tiny_pipeline, level, temperature=0.9, seed=77, max_tokens=12)).text == baseline


def test_full_level_attention_matches_a_plain_recomputation(tiny_pipeline: ChatPipeline) -> None:
    from naive_transformer import file_weights, kv_rounding, naive_forward

    loaded = tiny_pipeline.loaded
    request = tiny_pipeline.prepare(MESSAGES, SamplingParams(temperature=0.0, max_tokens=1))
    prefill = next(e for e in tiny_pipeline.stream(request, TraceLevel.FULL) if isinstance(e, ForwardStep))
    _, attention = naive_forward(loaded.config, file_weights(loaded), request.prompt.ids, kv_dtype=kv_rounding(loaded))
    assert prefill.detail is not None
    assert np.allclose(prefill.detail.attention.astype(np.float32), attention, atol=2e-3)


def test_full_level_feed_forward_half_matches_a_plain_recomputation(tiny_pipeline: ChatPipeline) -> None:
    """Each half's update, the top SwiGLU neurons and the logit lens after each half, against float64 numpy."""
    from naive_transformer import NaiveLayer, file_weights, kv_rounding, naive_forward, rms_norm

    loaded = tiny_pipeline.loaded
    config = loaded.config
    request = tiny_pipeline.prepare(MESSAGES, SamplingParams(temperature=0.0, max_tokens=1))
    prefill = next(e for e in tiny_pipeline.stream(request, TraceLevel.FULL) if isinstance(e, ForwardStep))
    weights = file_weights(loaded)
    layers: list[NaiveLayer] = []
    naive_forward(config, weights, request.prompt.ids, layers, kv_rounding(loaded))
    detail = prefill.detail
    assert detail is not None and len(layers) == config.n_layers
    assert np.allclose(
        detail.attention_update_norms, [np.linalg.norm(n.middle - n.entering) for n in layers], rtol=1e-4
    )
    assert np.allclose(
        detail.feed_forward_update_norms, [np.linalg.norm(n.leaving - n.middle) for n in layers], rtol=1e-4
    )
    for neurons, n in zip(detail.top_neurons, layers):
        activation = n.gate * n.up
        expected = np.argsort(-np.abs(activation))[: len(neurons)]
        assert [x.index for x in neurons] == expected.tolist()
        assert np.allclose([x.activation for x in neurons], activation[expected], rtol=1e-4, atol=1e-6)
        assert np.allclose([x.gate for x in neurons], n.gate[expected], rtol=1e-4, atol=1e-6)

    head = weights.get("output.weight", weights["token_embd.weight"]).astype(np.float64)

    def lens(h: np.ndarray) -> tuple[int, float]:
        logits = head @ rms_norm(h, weights["output_norm.weight"], config.norm_eps)
        probs = np.exp(logits - logits.max())
        return int(logits.argmax()), float(probs.max() / probs.sum())

    for guesses, stage in ((detail.logit_lens_after_attention, "middle"), (detail.logit_lens, "leaving")):
        assert [g.layer for g in guesses] == list(range(config.n_layers))
        for g in guesses:
            token, prob = lens(getattr(layers[g.layer], stage))
            assert g.token_id == token and np.isclose(g.prob, prob, rtol=1e-4)


def _count_renders(pipeline: ChatPipeline, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    template = pipeline.loaded.chat_template
    real = template.render

    def counted(messages: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(messages))
        return real(messages, *args, **kwargs)

    monkeypatch.setattr(template, "render", counted)
    return calls


def test_a_request_of_thousands_of_messages_is_refused_before_any_rendering(
    tiny_pipeline: ChatPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once 48 s of the engine's time for 8,000 messages; now a count, no template, no tokenizer."""
    from inference.errors import ContextLengthExceededError

    renders = _count_renders(tiny_pipeline, monkeypatch)
    for messages in ([{"role": "user", "content": "hi"}] * 10_000, [{"role": "user", "content": "x" * 200_000}]):
        with pytest.raises(ContextLengthExceededError, match="cannot fit"):
            tiny_pipeline.prepare(messages, SamplingParams(max_tokens=4))  # type: ignore[arg-type]
    assert renders == []


def test_truncating_a_long_history_takes_a_few_renders_not_one_per_turn(
    tiny_pipeline: ChatPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns: list[Message] = [{"role": "system", "content": "be brief"}]
    for i in range(200):
        turns += [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
    turns.append({"role": "user", "content": "the last question"})
    renders = _count_renders(tiny_pipeline, monkeypatch)
    request = tiny_pipeline.prepare(turns, SamplingParams(max_tokens=8), truncate_history=True)
    assert len(renders) <= 12  # bisection over 400 droppable turns
    assert len(request.prompt.ids) + 8 <= tiny_pipeline.loaded.config.context_length
    keep_one_more = [turns[0], *turns[request.dropped_messages :]]  # the fewest dropped: one turn more would not fit
    assert (
        len(tiny_pipeline.loaded.chat_template.render(keep_one_more).ids) + 8
        > tiny_pipeline.loaded.config.context_length
    )
    assert "the last question" in request.prompt.text


def test_an_empty_raw_prompt_on_a_model_without_bos_is_refused_not_run(tiny_pipeline: ChatPipeline) -> None:
    with pytest.raises(InvalidRequestError, match="no tokens") as refused:
        tiny_pipeline.prepare([], SamplingParams(max_tokens=4), text="")
    assert refused.value.param == "prompt"
