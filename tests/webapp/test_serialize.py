"""The worker's serializer: every engine event has its wire event, token ids gain their text, and full-level attention
travels as bounded 8-bit rows."""

from __future__ import annotations

import base64
import typing

import numpy as np

from inference import trace
from inference.loader import LoadedModel
from inference.params import SamplingParams
from inference.pipeline import ChatPipeline
from webapp.worker import serialize, wire


def test_every_engine_event_has_a_converter() -> None:
    assert set(serialize.CONVERTERS) == set(typing.get_args(trace.TraceEvent))


def test_a_traced_run_becomes_wire_events_with_token_text(tiny_pipeline: ChatPipeline, tiny_model: LoadedModel) -> None:
    request = tiny_pipeline.prepare([{"role": "user", "content": "hi"}], SamplingParams(temperature=0.0, max_tokens=3))
    events = [serialize.to_wire(e, tiny_model.tokenizer) for e in tiny_pipeline.stream(request, trace.TraceLevel.FULL)]
    kinds = {type(e) for e in events}
    assert {wire.Tokenized, wire.BatchStep, wire.ForwardStep, wire.Sampled, wire.TextDelta, wire.Finished} <= kinds
    sampled = next(e for e in events if isinstance(e, wire.Sampled))
    assert sampled.token == tiny_model.tokenizer.token_text(sampled.token_id) and sampled.detail is not None
    assert all(c.token == tiny_model.tokenizer.token_text(c.token_id) for c in sampled.detail.candidates)
    forward = next(e for e in events if isinstance(e, wire.ForwardStep) and e.detail is not None)
    assert forward.detail is not None and forward.detail.attention.shape[0] == tiny_model.config.n_layers


def test_attention_beyond_the_budget_keeps_the_first_positions_and_the_most_recent() -> None:
    weights = np.random.default_rng(0).random((2, 3, 40)).astype(np.float16)
    rows = serialize.attention_rows(weights, budget=20)
    assert rows.shape == [2, 3, 20] and rows.kv_length == 40
    assert rows.positions == list(range(serialize.ATTENTION_SINK_POSITIONS)) + list(range(36, 40))
    data = np.frombuffer(base64.b64decode(rows.data), dtype=np.uint8).reshape(2, 3, 20)
    decoded = data / 255 * np.array(rows.row_max)[..., None]
    assert np.allclose(decoded, weights.astype(np.float32)[:, :, rows.positions], atol=weights.max() / 255)
