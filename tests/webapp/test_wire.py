"""The typed wire: every class round-trips through the dict the channel layer carries, and a dict that does not fit
is refused naming what was wrong."""

from __future__ import annotations

import json

import pytest

from inference.errors import ContextLengthExceededError, InvalidRequestError
from inference.params import SamplingParams
from webapp.worker import wire

SEGMENT = wire.Segment(
    kind="message", role="user", message_index=0, token_start=3, token_end=7, char_start=12, char_end=30
)
ATTENTION = wire.Attention(shape=[1, 2, 3], kv_length=3, positions=[0, 1, 2], row_max=[[0.5, 0.9]], data="AAECAwQF")
LENS = wire.LensGuess(layer=2, id=11, token=" New", prob=0.7)
DETAIL = wire.LayerDetail(
    attention=ATTENTION,
    residual_norms=[1.0, 2.5],
    attention_update_norms=[0.5],
    feed_forward_update_norms=[0.25],
    logit_lens=[LENS],
    logit_lens_after_attention=[LENS],
    top_neurons=[[wire.Neuron(index=5, gate=2.6, up=2.2, activation=5.7)]],
)
CANDIDATE = wire.Candidate(
    token_id=11, token=" New", raw_prob=0.8, adjusted_prob=0.9, removed_by=None, final_prob=1.0, bias=0.5
)
SAMPLING = wire.SamplingDetail(
    candidates=[CANDIDATE], draw=0.25, kept=3, eos_prob=0.01, grammar_cut=2, mask_seconds=0.001
)
TOP = wire.TopLogprob(id=11, token=" New", logprob=-0.2, bytes=[32, 78, 101, 119])
TIMINGS = wire.Timings(
    tokenize=0.001,
    queue=0.0,
    prefill=0.02,
    prefill_saved=0.0,
    ttft=0.03,
    decode=0.05,
    total=0.09,
    token_times=[0.03, 0.04],
    mean_itl=0.01,
    decode_tokens_per_s=100.0,
)
SAMPLED = wire.Sampled(
    t=2.0,
    step=1,
    token_id=11,
    token=" New",
    bytes=[32, 78, 101, 119],
    logprob=-0.2,
    rank=1,
    is_stop=False,
    duration=0.001,
    top_logprobs=[TOP],
    detail=SAMPLING,
)
EVENTS: list[wire.TraceEvent] = [
    wire.Tokenized(t=1.0, duration=0.001, text="hi", ids=[1, 2], spans=[(0, 1), (1, 2)], tokens=["h", "i"]),
    wire.ContextBuilt(
        t=1.1,
        segments=[SEGMENT],
        prompt_tokens=2,
        max_tokens=5,
        context_length=64,
        dropped_messages=0,
        rope_base=10000.0,
        rope_dim=16,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        cached_tokens=1,
    ),
    wire.BatchStep(t=1.2, step=7, batch_size=2, prefill_tokens=2, decode_tokens=1, duration=0.01, requests=["a", "b"]),
    wire.ForwardStep(
        t=1.2, step=0, phase="prefill", position=0, n_tokens=2, kv_length=2, duration=0.01, batch_step=7, detail=DETAIL
    ),
    SAMPLED,
    wire.TextDelta(t=2.1, step=1, token_id=11, token=" New", text=" New", pending_bytes=[226], held_text=""),
    wire.Finished(
        t=3.0,
        finish_reason="length",
        prompt_tokens=2,
        completion_tokens=1,
        seed=7,
        text=" New",
        timings=TIMINGS,
        cached_tokens=1,
        peers=["b"],
        max_batch_size=2,
    ),
]
PARAMS = SamplingParams(
    temperature=0.5, top_k=3, stop=("END",), seed=9, logit_bias=((5, -100.0),), grammar="start: /a+/"
)
ASKED = {"request_id": "r", "model": "tiny", "reply_to": "reply.r"}
REQUESTS: list[wire.AnyRequest] = [
    wire.Generate(
        **ASKED,
        messages=[{"role": "user", "content": "hi"}],
        params=PARAMS,
        level="full",
        prompt=None,
        tools=[{"name": "f", "parameters": {"type": "object"}}],
        step=True,
        n=2,
        continue_final=True,
        sent_at=5.0,
    ),
    wire.Tokenize(**ASKED, messages=[{"role": "user", "content": "hi"}]),
    wire.Detokenize(**ASKED, ids=[1, 2, 3]),
    wire.Inspect(**ASKED, ids=[1, 2]),
    wire.PromptAttention(**ASKED, ids=[1, 2], layer=1),
    wire.Resample(**ASKED, prompt_ids=[1, 2], generated=[3], params=PARAMS),
    wire.Merges(**ASKED, text=" capital"),
    wire.NextTokens(**ASKED, text="The capital of India is"),
    wire.Cancel(request_id="r"),
    wire.Next(request_id="r"),
]
REPLIES: list[wire.AnyReply] = [
    wire.Queued(request_id="r", control="inbox.1", worker="w", ahead=2),
    wire.Waiting(request_id="r", ahead=1),
    wire.Accepted(
        request_id="r", control="inbox.1", worker="w", weights="int4, 116 MB", prompt_tokens=9, seed=3, queued=0.01
    ),
    wire.Events(request_id="r", index=1, events=EVENTS),
    wire.Error(request_id="r", status=503, message="busy", code="overloaded", param=None, retry_after=2, ahead=70),
    wire.Cancelled(request_id="r"),
    wire.Tokens(request_id="r", ids=[1], tokens=["a"], spans=[(0, 1)], text="a", segments=[SEGMENT]),
    wire.Detokenized(request_id="r", text="abc"),
    wire.Inspection(request_id="r", detail=DETAIL),
    wire.PromptAttentionMatrix(request_id="r", attention=ATTENTION),
    wire.Resampled(request_id="r", event=SAMPLED),
    wire.NextTokenView(
        request_id="r",
        ids=[2, 818],
        tokens=["<bos>", "The"],
        pieces=["<bos>", "The"],
        spans=[(0, 0), (0, 3)],
        likely=[wire.Likely(token_id=5279, token=" capital", prob=0.25)],
        tokenizer="SentencePiece",
    ),
    wire.MergeSteps(
        request_id="r",
        pieces=[
            wire.PieceMerges(
                text=" ab",
                start=[" ", "a", "b"],
                merges=[wire.MergeStep(rank=3, pair=("a", "b"), symbols=[" ", "ab"])],
                ids=[5, 9],
            )
        ],
    ),
]
STATUS = wire.WorkerStatus(
    worker="w",
    channel="inbox.1",
    host="h",
    pid=1,
    t=4.0,
    models={"tiny": wire.ModelSlots(running=1, waiting=0, max_batch=4, max_waiting=4, kv_usage=0.25)},
)
LOADS = [
    wire.ModelLoad(state="loading", stage="converting", done=3, total=9, detail="blk.1"),
    wire.ModelLoad(state="not started"),
    wire.ModelLoad(
        state="ready",
        card=wire.ModelCard(
            architecture="gemma3",
            name="Gemma 3 270m",
            layers=2,
            width=640,
            heads=4,
            kv_heads=1,
            head_size=256,
            feed_forward=2048,
            vocabulary=262144,
            context=32768,
            tokenizer="SentencePiece",
            chat_template=False,
            features=["QK-norm"],
            layer_windows=[512, 0],
        ),
    ),
]


def every_wire_class() -> set[type]:
    found, todo = set(), [wire.Wire]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.add(sub)
            todo.append(sub)
    return found - {wire.Event, wire.Request, wire.Question, wire.Reply}


def test_every_wire_class_has_an_example_here() -> None:
    examples = [
        *EVENTS,
        *REQUESTS,
        *REPLIES,
        STATUS,
        *LOADS,
        SEGMENT,
        ATTENTION,
        LENS,
        DETAIL,
        CANDIDATE,
        SAMPLING,
        TOP,
        TIMINGS,
        *DETAIL.top_neurons[0],
        *STATUS.models.values(),
        *(piece for reply in REPLIES if isinstance(reply, wire.MergeSteps) for piece in reply.pieces),
        *(m for reply in REPLIES if isinstance(reply, wire.MergeSteps) for p in reply.pieces for m in p.merges),
        *(load.card for load in LOADS if load.card is not None),
        *(likely for reply in REPLIES if isinstance(reply, wire.NextTokenView) for likely in reply.likely),
    ]
    assert every_wire_class() == {type(example) for example in examples}


@pytest.mark.parametrize("message", REQUESTS, ids=lambda m: type(m).__name__)
def test_a_request_round_trips_through_its_dict(message: wire.AnyRequest) -> None:
    data = json.loads(json.dumps(wire.encode(message)))  # as JSON (and msgpack) carry it: tuples become lists
    assert wire.decode_request(data) == message


@pytest.mark.parametrize("message", REPLIES, ids=lambda m: type(m).__name__)
def test_a_reply_round_trips_through_its_dict(message: wire.AnyReply) -> None:
    data = json.loads(json.dumps(wire.encode(message)))
    assert wire.decode_reply(data) == message


def test_heartbeats_and_load_progress_round_trip() -> None:
    assert wire.decode(wire.encode(STATUS), wire.WorkerStatus) == STATUS
    for load in LOADS:
        assert wire.decode(wire.encode(load), wire.ModelLoad) == load
    assert wire.encode(LOADS[1]) == {"state": "not started"}  # what is not known yet is left out of /health


def test_the_page_reads_events_in_the_json_shape_it_always_had() -> None:
    frame = json.loads(json.dumps(wire.plain({"type": "trace", "event": SAMPLED})))
    assert frame["event"]["event"] == "sampled" and frame["event"]["detail"]["candidates"][0]["token"] == " New"
    assert json.loads(json.dumps(wire.plain(EVENTS[0])))["spans"] == [[0, 1], [1, 2]]


@pytest.mark.parametrize(
    "data, words",
    [
        ({"type": "events", "request_id": "r", "events": [{"event": "sampled", "t": "soon"}]}, "at `$.events[0].t`"),
        (
            {"type": "events", "request_id": "r", "events": [{"event": "guess", "t": 1.0}]},
            "Invalid value 'guess' - at `$.events[0].event`",
        ),
        ({"type": "accepted", "request_id": "r"}, "missing required field"),
        ({"type": "teleport", "request_id": "r"}, "Invalid value 'teleport' - at `$.type`"),
        ("not a dict", "Expected `object`"),
    ],
)
def test_a_reply_that_does_not_fit_is_refused_naming_what(data: object, words: str) -> None:
    with pytest.raises(wire.WireError) as info:
        wire.decode_reply(data)
    assert words in str(info.value)


def test_a_request_with_bad_sampling_values_is_refused_naming_the_field() -> None:
    data = wire.encode(REQUESTS[0])
    data["params"]["temperature"] = "hot"
    with pytest.raises(wire.WireError, match=r"\$\.params\.temperature"):
        wire.decode_request(data)


def test_inference_failures_become_error_replies_in_the_clients_terms() -> None:
    too_long = wire.error_reply("r", ContextLengthExceededError(9000, 10, 8192))
    bad = wire.error_reply("r", InvalidRequestError("top_p must be positive", "top_p"))
    broken = wire.error_reply("r", RuntimeError("kernel fault at 0x1"))
    assert (too_long.status, too_long.code, too_long.param) == (400, "context_length_exceeded", "messages")
    assert (bad.status, bad.code, bad.param) == (400, "invalid_value", "top_p")
    assert broken.status == 500 and "0x1" not in broken.message and "RuntimeError" in broken.message
    busy = wire.overloaded("r", 70)
    assert (busy.status, busy.retry_after, busy.ahead) == (503, 2, 70)
