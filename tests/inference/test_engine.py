"""The engine (scheduler, model runner, update) on the tiny model: batching changes no answer, chunked prefill
interleaves, the prefix cache, admission by KV budget and batch size, abort, step mode and per-request failures."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from engine_runs import (
    NEAR_TIE,
    PROMPTS,
    alone,
    assert_same_or_near_tie,
    events_of,
    make_engine,
    run_all,
    sequence_request,
    tokens_of,
)
from load_settings import cpu

from inference.engine import Engine
from inference.loader import LoadedModel
from inference.outputs import SequenceOutput
from inference.params import SamplingParams
from inference.scheduler import QueueFullError
from inference.trace import BatchStep, Finished, ForwardStep, TraceLevel


def test_requests_decoded_together_give_the_same_greedy_tokens_as_eachalone(tiny_model: LoadedModel) -> None:
    requests = [sequence_request(f"r{i}", p, top_logprobs=2) for i, p in enumerate(PROMPTS)]
    together = run_all(make_engine(tiny_model), requests)
    for request in requests:
        batched = tokens_of(together[request.request_id])
        assert len(batched) == 24
        assert_same_or_near_tie(batched, alone(tiny_model, request), NEAR_TIE)


def test_seeds_reproduce_inside_a_batch(tiny_model: LoadedModel) -> None:
    requests = [sequence_request(f"s{i}", p, temperature=1.0, seed=100 + i) for i, p in enumerate(PROMPTS)]
    together = run_all(make_engine(tiny_model), requests)
    for request in requests:
        assert [s.token_id for s in tokens_of(together[request.request_id])] == [
            s.token_id for s in alone(tiny_model, request)
        ]


def test_every_request_in_a_step_refers_to_the_same_batch_step(tiny_model: LoadedModel) -> None:
    requests = [sequence_request(f"b{i}", p, TraceLevel.SUMMARY, max_tokens=4) for i, p in enumerate(PROMPTS[:3])]
    outputs = run_all(make_engine(tiny_model), requests)
    batches = {rid: [e for e in events_of(o) if isinstance(e, BatchStep)] for rid, o in outputs.items()}
    first = batches["b0"][0]
    assert first.batch_size == 3 and sorted(first.requests) == ["b0", "b1", "b2"]
    assert first.prefill_tokens == sum(len(p) for p in PROMPTS[:3]) and first.decode_tokens == 0
    assert all(b[0] == first for b in batches.values())
    forward = next(e for e in events_of(outputs["b1"]) if isinstance(e, ForwardStep))
    assert forward.batch_step == first.step and forward.duration == first.duration
    finished = next(e for e in events_of(outputs["b1"]) if isinstance(e, Finished))
    assert finished.peers == ["b0", "b2"] and finished.max_batch_size == 3


def test_a_long_prompt_alone_is_prefilled_in_the_larger_chunks(tiny_model: LoadedModel) -> None:
    engine = make_engine(tiny_model, prefill_chunk=64, prefill_chunk_decoding=16)
    engine.scheduler.add(
        sequence_request("long", [1] + [3 + i % 250 for i in range(100)], TraceLevel.SUMMARY, max_tokens=2)
    )
    forwards = [e for _ in range(2) for o in engine.step() for e in o.events if isinstance(e, ForwardStep)]
    assert [f.n_tokens for f in forwards] == [64, 37]


def test_while_others_decode_each_newcomer_gets_its_own_small_chunk(tiny_model: LoadedModel) -> None:
    """A crowd of newcomers is not starved by one shared small chunk: each takes its few tokens per step, up to the
    step's whole prompt budget."""
    engine = make_engine(tiny_model, prefill_chunk=10, prefill_chunk_decoding=4)
    engine.scheduler.add(sequence_request("running", PROMPTS[0], max_tokens=30))
    engine.step()
    for i in range(3):
        engine.scheduler.add(
            sequence_request(f"new{i}", [1] + [3 + i + j for j in range(20)], TraceLevel.SUMMARY, max_tokens=2)
        )
    outputs = {o.request_id: o for o in engine.step()}
    fed = {
        rid: [e.n_tokens for e in o.events if isinstance(e, ForwardStep)]
        for rid, o in outputs.items()
        if rid != "running"
    }
    assert fed == {"new0": [4], "new1": [4], "new2": [2]}  # 4 each, until the step's 10 prompt tokens are spent


def _prompt_fed(engine: Engine, newcomers: int) -> dict[str, list[int]]:
    """Prompt tokens each of `newcomers` 20-token newcomers gets in one step beside one decoding stream."""
    engine.scheduler.add(sequence_request("running", PROMPTS[0], max_tokens=30))
    engine.step()
    for i in range(newcomers):
        engine.scheduler.add(
            sequence_request(f"new{i}", [1] + [3 + i + j for j in range(20)], TraceLevel.SUMMARY, max_tokens=2)
        )
    outputs = {o.request_id: o for o in engine.step()}
    return {
        rid: [e.n_tokens for e in o.events if isinstance(e, ForwardStep)]
        for rid, o in outputs.items()
        if rid != "running"
    }


def test_beside_decoding_streams_newcomers_get_what_the_measured_step_cost_allows_the_earliest_first(
    tiny_model: LoadedModel,
) -> None:
    """A step of 5 ms plus 1 ms a row: within 1.75 one-row steps (10.5 ms) it carries 5 rows, so beside one decoding
    stream 4 prompt tokens: the first newcomer takes all but the one its follower is owed."""
    engine = make_engine(tiny_model, prefill_chunk=64, prefill_chunk_decoding=1, decode_gap_stretch=1.75)
    for rows in [1, 6, 12] * 100:
        engine.scheduler.step_cost.observe(rows, 0.005 + 0.001 * rows)
    assert _prompt_fed(engine, 2) == {"new0": [3], "new1": [1]}


def test_without_a_measured_step_cost_each_newcomer_gets_its_minimum(tiny_model: LoadedModel) -> None:
    for stretch in (None, 1.75):  # no bound asked for; a bound but no steps measured yet
        fed = _prompt_fed(
            make_engine(tiny_model, prefill_chunk=64, prefill_chunk_decoding=2, decode_gap_stretch=stretch), 3
        )
        assert fed == {"new0": [2], "new1": [2], "new2": [2]}


def test_a_long_prompt_is_prefilled_in_chunks_between_the_others_decode_steps(tiny_model: LoadedModel) -> None:
    engine = make_engine(tiny_model, prefill_chunk=64, prefill_chunk_decoding=16)
    engine.scheduler.add(sequence_request("short", PROMPTS[0], TraceLevel.SUMMARY, max_tokens=30))
    engine.step()  # the short prompt is in; it decodes from now on
    long_prompt = [1] + [3 + i % 250 for i in range(100)]
    engine.scheduler.add(sequence_request("long", long_prompt, TraceLevel.SUMMARY, max_tokens=3))
    steps: list[tuple[list[ForwardStep], list[ForwardStep]]] = []
    for _ in range(8):
        outputs = {o.request_id: o for o in engine.step()}
        forwards = {rid: [e for e in o.events if isinstance(e, ForwardStep)] for rid, o in outputs.items()}
        steps.append((forwards.get("long", []), forwards.get("short", [])))
    long_prefill = [f for long, _ in steps for f in long if f.phase == "prefill"]
    assert [f.n_tokens for f in long_prefill] == [16] * 6 + [5]
    assert [f.position for f in long_prefill] == list(range(0, 101, 16))
    for long, short in steps[:7]:  # the short request decoded a token in every one of those steps, in the same forward
        assert len(short) == 1 and short[0].phase == "decode" and short[0].batch_step == long[0].batch_step


def test_prefix_cache_hits_give_the_same_tokens_as_a_coldrun_all(tiny_model: LoadedModel) -> None:
    system = [1] + [3 + (7 * i) % 250 for i in range(70)]
    first = sequence_request("first", system + [100, 101], max_tokens=10)
    second = sequence_request("second", system + [100, 101, 5, 6, 7], TraceLevel.SUMMARY, max_tokens=20, top_logprobs=2)
    warm = make_engine(tiny_model, prefix_block=16)
    run_all(warm, [first])
    hit = run_all(warm, [second])["second"]
    finished = next(e for e in events_of(hit) if isinstance(e, Finished))
    assert finished.cached_tokens == 64  # four whole blocks of the shared 72 tokens; the rest is computed
    assert warm.scheduler.stats().prefix_hit_tokens == 64
    cold = alone(tiny_model, dataclasses.replace(second, level=TraceLevel.OFF))
    assert_same_or_near_tie(tokens_of(hit), cold, NEAR_TIE)


def test_a_conversation_turn_reuses_the_previous_turn_including_its_answer(tiny_model: LoadedModel) -> None:
    engine = make_engine(tiny_model, prefix_block=8)
    turn = run_all(engine, [sequence_request("t1", PROMPTS[3], max_tokens=20)])["t1"]
    answer = [s.token_id for s in tokens_of(turn)]
    follow_up = PROMPTS[3] + answer + [2, 1, 70, 71]
    second = run_all(engine, [sequence_request("t2", follow_up, max_tokens=5)])["t2"]
    finished = next(e for e in events_of(second) if isinstance(e, Finished))
    assert finished.cached_tokens == (len(PROMPTS[3]) + len(answer) - 1) // 8 * 8 > len(PROMPTS[3])


def test_abort_frees_the_slot_at_the_next_step(tiny_model: LoadedModel) -> None:
    engine = make_engine(tiny_model, max_batch=1)
    engine.scheduler.add(sequence_request("a", PROMPTS[0], max_tokens=100))
    engine.scheduler.add(sequence_request("b", PROMPTS[1], max_tokens=5))
    engine.step()
    engine.step()
    assert [s.request_id for s in engine.scheduler.running] == ["a"] and engine.scheduler.ahead_of("b") == 0
    engine.scheduler.abort("a")
    outputs = engine.step()
    assert outputs[0] == SequenceOutput("a", [], done=True, cancelled=True)
    assert [s.request_id for s in engine.scheduler.running] == ["b"] and any(
        o.request_id == "b" and o.events for o in outputs[1:]
    )


def test_work_beyond_the_kv_budget_waits_in_the_queue(tiny_model: LoadedModel) -> None:
    probe = make_engine(tiny_model)
    per_sequence = 256 * probe.scheduler.cache.bytes_per_position  # one slot: reserves round up to 256 positions
    engine = make_engine(tiny_model, kv_budget_bytes=2 * per_sequence)
    for i in range(3):
        engine.scheduler.add(sequence_request(f"k{i}", PROMPTS[i], max_tokens=8))
    engine.step()
    assert len(engine.scheduler.running) == 2 and engine.scheduler.ahead_of("k2") == 0
    assert engine.scheduler.stats().kv_usage == 1.0
    finished: set[str] = set()
    while not finished:
        finished = {o.request_id for o in engine.step() if o.done}
    assert finished == {"k0", "k1"} and engine.scheduler.ahead_of("k2") == 0  # a slot frees at the end of a step...
    engine.step()
    assert [s.request_id for s in engine.scheduler.running] == ["k2"]  # ...and the next step admits the waiting request


def test_a_full_queue_refuses_at_once(tiny_model: LoadedModel) -> None:
    engine = make_engine(tiny_model, max_batch=1, max_waiting=2)
    for i in range(3):  # one for the free slot, two for the queue
        engine.scheduler.add(sequence_request(f"q{i}", PROMPTS[i]))
    with pytest.raises(QueueFullError):
        engine.scheduler.add(sequence_request("q3", PROMPTS[3]))


def test_an_exception_in_one_sequence_fails_only_thatsequence_request(tiny_model: LoadedModel) -> None:
    engine = make_engine(tiny_model)
    engine.scheduler.add(sequence_request("ok", PROMPTS[0], max_tokens=6))
    broken = engine.scheduler.add(sequence_request("broken", PROMPTS[1], max_tokens=6))

    def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("sampler exploded")

    broken.sampler.sample = explode  # type: ignore[method-assign]
    outputs: list[SequenceOutput] = []
    for _ in range(10):
        outputs += engine.step()
    failed = [o for o in outputs if o.request_id == "broken"]
    assert len(failed) == 2 and failed[-1].done and isinstance(failed[-1].error, RuntimeError)  # admitted, then failed
    assert len(tokens_of([o for o in outputs if o.request_id == "ok"])) == 6
    assert not engine.scheduler.running


def test_a_paused_sequence_sits_out_steps_until_resumed(tiny_model: LoadedModel) -> None:
    engine = make_engine(tiny_model)
    engine.scheduler.add(dataclasses.replace(sequence_request("p", PROMPTS[0], max_tokens=5), step_mode=True))
    engine.scheduler.add(sequence_request("free", PROMPTS[1], max_tokens=5))
    engine.step()
    for _ in range(3):
        assert [o.request_id for o in engine.step()] == ["free"]
    assert engine.scheduler.has_work
    engine.scheduler.resume("p")
    assert "p" in [o.request_id for o in engine.step()]


def test_time_paused_in_step_mode_is_left_out_of_the_latencies(tiny_model: LoadedModel) -> None:
    engine = make_engine(tiny_model)
    engine.scheduler.add(dataclasses.replace(sequence_request("p", PROMPTS[0], max_tokens=3), step_mode=True))
    outputs = list(engine.step())
    for _ in range(2):
        time.sleep(0.3)  # a reader looking at the token before pressing Next
        engine.scheduler.resume("p")
        outputs += engine.step()
    timings = next(e for e in events_of(outputs) if isinstance(e, Finished)).timings
    gaps = [b - a for a, b in zip(timings.token_times, timings.token_times[1:], strict=False)]
    assert len(timings.pauses) == 2 and all(0.3 <= p < min(gaps) for p in timings.pauses)
    assert timings.inter_token_latencies == pytest.approx([g - p for g, p in zip(gaps, timings.pauses, strict=True)])
    assert timings.mean_itl is not None and timings.mean_itl < 0.3 and timings.decode < 0.6


def test_it_stops_at_an_end_of_turn_token_unless_told_to_ignore_it(tiny_model: LoadedModel) -> None:
    greedy = [s.token_id for s in alone(tiny_model, sequence_request("g", PROMPTS[0], max_tokens=5))]
    stopping = Engine(tiny_model.model, frozenset({greedy[2]}), tiny_model.tokenizer.token_bytes)
    events = tokens_of(run_all(stopping, [sequence_request("s", PROMPTS[0], max_tokens=5)])["s"])
    assert len(events) == greedy.index(greedy[2]) + 1 and events[-1].is_stop
    ignoring = Engine(tiny_model.model, frozenset({greedy[2]}), tiny_model.tokenizer.token_bytes)
    assert (
        len(tokens_of(run_all(ignoring, [sequence_request("i", PROMPTS[0], max_tokens=5, ignore_eos=True)])["i"])) == 5
    )


def test_arrivals_one_at_a_time_grow_the_cache_with_room_to_spare(tiny_model: LoadedModel) -> None:
    """Growing the cache copies it while every stream waits: a burst of arrivals must not regrow it once per
    newcomer."""
    engine = make_engine(tiny_model)
    sizes = []
    for i in range(5):
        engine.scheduler.add(sequence_request(f"g{i}", PROMPTS[i], max_tokens=40))
        engine.step()
        sizes.append(engine.scheduler.cache.slots)
    assert sizes == [4, 4, 4, 4, 8]
    # the running sequences', not the spare slots'
    assert engine.scheduler.stats().kv_bytes == 5 * engine.scheduler.cache.nbytes // 8


def test_spare_slots_are_kept_while_sequences_run_and_freed_when_idle(tiny_model: LoadedModel) -> None:
    engine = make_engine(tiny_model, idle_kv_bytes=0)
    for i in range(5):
        engine.scheduler.add(sequence_request(f"s{i}", PROMPTS[i], max_tokens=3 if i else 30))
    slots = []
    while engine.scheduler.has_work:
        engine.step()
        slots.append((len(engine.scheduler.running), engine.scheduler.cache.slots))
    assert (1, 5) in slots  # one sequence left: the burst's slots stay (shrinking would copy it mid-stream)
    assert slots[-1] == (0, 0) and engine.scheduler.cache.nbytes == 0


def test_an_idle_engine_keeps_a_small_cache_so_the_next_request_does_not_allocate_one(tiny_model: LoadedModel) -> None:
    engine = make_engine(tiny_model)
    run_all(engine, [sequence_request("first", PROMPTS[0], max_tokens=3)])
    engine.scheduler.finish_step()
    kept = engine.scheduler.cache.k
    assert (
        0 < engine.scheduler.cache.nbytes <= engine.scheduler.config.idle_kv_bytes
        and engine.scheduler.stats().kv_bytes == 0
    )
    second = run_all(engine, [sequence_request("second", PROMPTS[1], max_tokens=3)])["second"]
    assert engine.scheduler.cache.k is kept  # admitted into the kept cache: no new allocation
    assert [t.token_id for t in tokens_of(second)] == [
        t.token_id for t in alone(tiny_model, sequence_request("a", PROMPTS[1], max_tokens=3))
    ]


def test_an_idle_engine_keeps_no_more_than_its_idle_budget(tiny_model: LoadedModel) -> None:
    engine = make_engine(tiny_model)
    run_all(engine, [sequence_request(f"b{i}", PROMPTS[i], max_tokens=3) for i in range(5)])
    engine.scheduler.finish_step()
    per_slot = engine.scheduler.cache.nbytes // engine.scheduler.cache.slots
    small = make_engine(tiny_model, idle_kv_bytes=2 * per_slot)
    run_all(small, [sequence_request(f"b{i}", PROMPTS[i], max_tokens=3) for i in range(5)])
    small.scheduler.finish_step()
    assert small.scheduler.cache.slots == 2 and small.scheduler.cache.nbytes <= small.scheduler.config.idle_kv_bytes


def test_a_finished_sequence_leaves_its_slot_and_fills_the_prefix_cache_after_its_outputs(
    tiny_model: LoadedModel,
) -> None:
    """Releasing a batch of finished streams costs ms (their prefixes are copied into the prefix cache): their last
    tokens go out first; `finish_step` (or else the next step) does the rest."""
    engine = make_engine(tiny_model, prefix_block=4)
    # its answer fills at least one more block of 4
    engine.scheduler.add(sequence_request("f", PROMPTS[0], max_tokens=6))
    while not any(o.done for o in engine.step()):
        pass
    assert (
        [s.request_id for s in engine.scheduler.running] == ["f"]
        and engine.scheduler.stats().running == 0
        and engine.scheduler.has_work
    )
    cached = len(engine.scheduler.prefix_cache)
    engine.scheduler.finish_step()
    assert (
        engine.scheduler.running == [] and len(engine.scheduler.prefix_cache) > cached and not engine.scheduler.has_work
    )


def test_the_next_step_does_the_bookkeeping_a_caller_left(tiny_model: LoadedModel) -> None:
    engine = make_engine(tiny_model, max_batch=1)
    engine.scheduler.add(sequence_request("first", PROMPTS[0], max_tokens=1))
    engine.scheduler.add(sequence_request("second", PROMPTS[1], max_tokens=1))
    assert any(o.request_id == "first" and o.done for o in engine.step())
    assert any(o.request_id == "second" for o in engine.step())  # its slot, freed at the start of this step


def test_idle_scheduler_has_no_work_and_gives_its_memory_back(tiny_model: LoadedModel) -> None:
    engine = make_engine(tiny_model)
    run_all(engine, [sequence_request("x", PROMPTS[0], max_tokens=3)])
    assert (
        not engine.scheduler.has_work
        and engine.scheduler.stats().kv_bytes == 0
        and engine.scheduler.stats().running == 0
    )


REAL_TOPICS = ["a lighthouse keeper", "the moon", "a clockmaker", "an old violin"]  # a batch of four: every row differs


# The served format (int4) for 32 tokens; the slower float formats for 10, which keeps `make test-fast` within its
# minute on a CPU without AVX-512.
@pytest.mark.parametrize("weights, tolerance, tokens", [("fp32", 1e-3, 10), ("bf16", 0.5, 10), ("int4", 0.5, 32)])
def test_the_real_model_batched_gives_each_request_its_own_greedy_answer(
    weights: str, tolerance: float, tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32: batching changes nothing measurable. bfloat16 activations round differently for different batch
    shapes, so a near-tie can flip; the test shows the two top logits at the first divergence were within
    `tolerance`."""
    from inference.loader import load_model
    from inference.pipeline import ChatPipeline

    loaded = load_model(settings=cpu(weights=weights, use_cache=True))
    pipeline = ChatPipeline(loaded)
    requests = [
        pipeline.sequence_request(
            pipeline.prepare(
                [{"role": "user", "content": f"Write a story about {t}."}],
                SamplingParams(temperature=0.0, max_tokens=tokens, top_logprobs=3),
            ),
            f"real{i}",
        )
        for i, t in enumerate(REAL_TOPICS)
    ]
    together = run_all(make_engine(loaded), requests)
    for request in requests:
        assert_same_or_near_tie(tokens_of(together[request.request_id]), alone(loaded, request), tolerance)


def test_choices_of_one_request_share_one_prefill_and_decode_together(tiny_model: LoadedModel) -> None:
    """n > 1: the later choices wait for the first one's prompt, copy it, and join its batch; each choice is what its
    own seed gives alone."""
    prompt = PROMPTS[0] * 3
    first = sequence_request("n", prompt, TraceLevel.SUMMARY, temperature=1.0, seed=5, max_tokens=8)
    others = [
        dataclasses.replace(
            first, request_id=f"n#{i}", params=dataclasses.replace(first.params, seed=5 + i), shares_prompt_with="n"
        )
        for i in (1, 2)
    ]
    outputs = run_all(make_engine(tiny_model, prefix_cache_bytes=0), [first, *others])
    batches = [e for e in events_of(outputs["n"]) if isinstance(e, BatchStep)]
    # only the first choice prefills the prompt
    assert batches[0].prefill_tokens == len(prompt) and batches[0].batch_size == 1
    assert max(b.batch_size for b in batches) == 3  # then all three decode in one forward
    for other in others:
        finished = next(e for e in events_of(outputs[other.request_id]) if isinstance(e, Finished))
        assert finished.cached_tokens == len(prompt) - 1  # copied from the first choice, not recomputed
        by_itself = dataclasses.replace(other, request_id="alone", shares_prompt_with=None)
        assert [s.token_id for s in tokens_of(outputs[other.request_id])] == [
            s.token_id for s in alone(tiny_model, by_itself)
        ]
