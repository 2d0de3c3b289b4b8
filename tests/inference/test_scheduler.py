"""The batched scheduler on the tiny model: batching changes no answer, chunked prefill interleaves,
the prefix cache, admission by KV budget and batch size, abort, step mode and per-request failures."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from inference.errors import InvalidRequestError
from inference.loader import LoadedModel
from inference.params import SamplingParams
from inference.scheduler import QueueFullError, Scheduler, SchedulerConfig, SequenceOutput
from inference.sequence import SequenceRequest
from inference.trace import BatchStep, Finished, ForwardStep, Sampled, TraceEvent, TraceLevel

PROMPTS = [
    [1, 50, 60, 70],
    [1, 200, 3, 44, 45, 46, 47],
    [1, 9],
    [1, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89],
    [1, 120, 130],
    [1, 66, 67, 68, 69],
]
NEAR_TIE = 1e-4  # top-two logit gap (tiny model, float32) within which batched arithmetic may pick the other token


def _scheduler(loaded: LoadedModel, **config: Any) -> Scheduler:
    return Scheduler(loaded.model, loaded.stop_ids, loaded.tokenizer.token_bytes, SchedulerConfig(**config))


def _request(rid: str, prompt: list[int], level: TraceLevel = TraceLevel.OFF, **params: Any) -> SequenceRequest:
    params.setdefault("temperature", 0.0)
    params.setdefault("max_tokens", 24)
    return SequenceRequest(rid, prompt, SamplingParams(**params), level)


def _run(
    scheduler: Scheduler, requests: list[SequenceRequest], max_steps: int = 500
) -> dict[str, list[SequenceOutput]]:
    """Add every request, step until all are done; each request's outputs in order."""
    for request in requests:
        scheduler.add(request)
    outputs: dict[str, list[SequenceOutput]] = {r.request_id: [] for r in requests}
    done: set[str] = set()
    for _ in range(max_steps):
        for output in scheduler.step():
            outputs[output.request_id].append(output)
            if output.done:
                done.add(output.request_id)
        scheduler.finish_step()  # as the engine does, once the outputs are sent
        if done == set(outputs):
            return outputs
    raise AssertionError(f"not finished after {max_steps} steps: {set(outputs) - done}")


def _events(outputs: list[SequenceOutput]) -> list[TraceEvent]:
    return [e for o in outputs for e in o.events]


def _tokens(outputs: list[SequenceOutput]) -> list[Sampled]:
    return [e for e in _events(outputs) if isinstance(e, Sampled)]


def _alone(loaded: LoadedModel, request: SequenceRequest) -> list[Sampled]:
    return _tokens(_run(_scheduler(loaded), [request])[request.request_id])


def assert_same_or_near_tie(batched: list[Sampled], alone: list[Sampled], tolerance: float) -> None:
    """Identical tokens, or at the first difference both choices were among the alone run's best (its top logprobs)
    and the batched run's within `tolerance` of the best: a near-tie, of two or more tokens."""
    ids_b, ids_a = [s.token_id for s in batched], [s.token_id for s in alone]
    if ids_b == ids_a:
        return
    at = next((i for i, (x, y) in enumerate(zip(ids_b, ids_a)) if x != y), min(len(ids_a), len(ids_b)))
    assert at < min(len(ids_a), len(ids_b)), "one run stopped where the other did not"
    top = dict(alone[at].top_logprobs)
    assert ids_a[at] in top and ids_b[at] in top, (
        f"diverged at {at} to a token outside the alone run's best {sorted(top)}"
    )
    gap = max(top.values()) - top[ids_b[at]]
    assert gap < tolerance, f"diverged at {at} with gap {gap}"


def test_requests_decoded_together_give_the_same_greedy_tokens_as_each_alone(tiny_model: LoadedModel) -> None:
    requests = [_request(f"r{i}", p, top_logprobs=2) for i, p in enumerate(PROMPTS)]
    together = _run(_scheduler(tiny_model), requests)
    for request in requests:
        batched = _tokens(together[request.request_id])
        assert len(batched) == 24
        assert_same_or_near_tie(batched, _alone(tiny_model, request), NEAR_TIE)


def test_seeds_reproduce_inside_a_batch(tiny_model: LoadedModel) -> None:
    requests = [_request(f"s{i}", p, temperature=1.0, seed=100 + i) for i, p in enumerate(PROMPTS)]
    together = _run(_scheduler(tiny_model), requests)
    for request in requests:
        assert [s.token_id for s in _tokens(together[request.request_id])] == [
            s.token_id for s in _alone(tiny_model, request)
        ]


def test_every_request_in_a_step_refers_to_the_same_batch_step(tiny_model: LoadedModel) -> None:
    requests = [_request(f"b{i}", p, TraceLevel.SUMMARY, max_tokens=4) for i, p in enumerate(PROMPTS[:3])]
    outputs = _run(_scheduler(tiny_model), requests)
    batches = {rid: [e for e in _events(o) if isinstance(e, BatchStep)] for rid, o in outputs.items()}
    first = batches["b0"][0]
    assert first.batch_size == 3 and sorted(first.requests) == ["b0", "b1", "b2"]
    assert first.prefill_tokens == sum(len(p) for p in PROMPTS[:3]) and first.decode_tokens == 0
    assert all(b[0] == first for b in batches.values())
    forward = next(e for e in _events(outputs["b1"]) if isinstance(e, ForwardStep))
    assert forward.batch_step == first.step and forward.duration == first.duration
    finished = next(e for e in _events(outputs["b1"]) if isinstance(e, Finished))
    assert finished.peers == ["b0", "b2"] and finished.max_batch_size == 3


def test_a_long_prompt_alone_is_prefilled_in_the_larger_chunks(tiny_model: LoadedModel) -> None:
    scheduler = _scheduler(tiny_model, prefill_chunk=64, prefill_chunk_decoding=16)
    scheduler.add(_request("long", [1] + [3 + i % 250 for i in range(100)], TraceLevel.SUMMARY, max_tokens=2))
    forwards = [e for _ in range(2) for o in scheduler.step() for e in o.events if isinstance(e, ForwardStep)]
    assert [f.n_tokens for f in forwards] == [64, 37]


def test_while_others_decode_each_newcomer_gets_its_own_small_chunk(tiny_model: LoadedModel) -> None:
    """A crowd of newcomers is not starved by one shared small chunk: each takes its few tokens per step, up to the
    step's whole prompt budget."""
    scheduler = _scheduler(tiny_model, prefill_chunk=10, prefill_chunk_decoding=4)
    scheduler.add(_request("running", PROMPTS[0], max_tokens=30))
    scheduler.step()
    for i in range(3):
        scheduler.add(_request(f"new{i}", [1] + [3 + i + j for j in range(20)], TraceLevel.SUMMARY, max_tokens=2))
    outputs = {o.request_id: o for o in scheduler.step()}
    fed = {
        rid: [e.n_tokens for e in o.events if isinstance(e, ForwardStep)]
        for rid, o in outputs.items()
        if rid != "running"
    }
    assert fed == {"new0": [4], "new1": [4], "new2": [2]}  # 4 each, until the step's 10 prompt tokens are spent


def _prompt_fed(scheduler: Scheduler, newcomers: int) -> dict[str, list[int]]:
    """Prompt tokens each of `newcomers` 20-token newcomers gets in one step beside one decoding stream."""
    scheduler.add(_request("running", PROMPTS[0], max_tokens=30))
    scheduler.step()
    for i in range(newcomers):
        scheduler.add(_request(f"new{i}", [1] + [3 + i + j for j in range(20)], TraceLevel.SUMMARY, max_tokens=2))
    outputs = {o.request_id: o for o in scheduler.step()}
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
    scheduler = _scheduler(tiny_model, prefill_chunk=64, prefill_chunk_decoding=1, decode_gap_stretch=1.75)
    for rows in [1, 6, 12] * 100:
        scheduler.step_cost.observe(rows, 0.005 + 0.001 * rows)
    assert _prompt_fed(scheduler, 2) == {"new0": [3], "new1": [1]}


def test_without_a_measured_step_cost_each_newcomer_gets_its_minimum(tiny_model: LoadedModel) -> None:
    for stretch in (None, 1.75):  # no bound asked for; a bound but no steps measured yet
        fed = _prompt_fed(
            _scheduler(tiny_model, prefill_chunk=64, prefill_chunk_decoding=2, decode_gap_stretch=stretch), 3
        )
        assert fed == {"new0": [2], "new1": [2], "new2": [2]}


def test_a_long_prompt_is_prefilled_in_chunks_between_the_others_decode_steps(tiny_model: LoadedModel) -> None:
    scheduler = _scheduler(tiny_model, prefill_chunk=64, prefill_chunk_decoding=16)
    scheduler.add(_request("short", PROMPTS[0], TraceLevel.SUMMARY, max_tokens=30))
    scheduler.step()  # the short prompt is in; it decodes from now on
    long_prompt = [1] + [3 + i % 250 for i in range(100)]
    scheduler.add(_request("long", long_prompt, TraceLevel.SUMMARY, max_tokens=3))
    steps: list[tuple[list[ForwardStep], list[ForwardStep]]] = []
    for _ in range(8):
        outputs = {o.request_id: o for o in scheduler.step()}
        forwards = {rid: [e for e in o.events if isinstance(e, ForwardStep)] for rid, o in outputs.items()}
        steps.append((forwards.get("long", []), forwards.get("short", [])))
    long_prefill = [f for long, _ in steps for f in long if f.phase == "prefill"]
    assert [f.n_tokens for f in long_prefill] == [16] * 6 + [5]
    assert [f.position for f in long_prefill] == list(range(0, 101, 16))
    for long, short in steps[:7]:  # the short request decoded a token in every one of those steps, in the same forward
        assert len(short) == 1 and short[0].phase == "decode" and short[0].batch_step == long[0].batch_step


def test_prefix_cache_hits_give_the_same_tokens_as_a_cold_run(tiny_model: LoadedModel) -> None:
    system = [1] + [3 + (7 * i) % 250 for i in range(70)]
    first = _request("first", system + [100, 101], max_tokens=10)
    second = _request("second", system + [100, 101, 5, 6, 7], TraceLevel.SUMMARY, max_tokens=20, top_logprobs=2)
    warm = _scheduler(tiny_model, prefix_block=16)
    _run(warm, [first])
    hit = _run(warm, [second])["second"]
    finished = next(e for e in _events(hit) if isinstance(e, Finished))
    assert finished.cached_tokens == 64  # four whole blocks of the shared 72 tokens; the rest is computed
    assert warm.stats().prefix_hit_tokens == 64
    cold = _alone(tiny_model, dataclasses.replace(second, level=TraceLevel.OFF))
    assert_same_or_near_tie(_tokens(hit), cold, NEAR_TIE)


def test_a_conversation_turn_reuses_the_previous_turn_including_its_answer(tiny_model: LoadedModel) -> None:
    scheduler = _scheduler(tiny_model, prefix_block=8)
    turn = _run(scheduler, [_request("t1", PROMPTS[3], max_tokens=20)])["t1"]
    answer = [s.token_id for s in _tokens(turn)]
    follow_up = PROMPTS[3] + answer + [2, 1, 70, 71]
    second = _run(scheduler, [_request("t2", follow_up, max_tokens=5)])["t2"]
    finished = next(e for e in _events(second) if isinstance(e, Finished))
    assert finished.cached_tokens == (len(PROMPTS[3]) + len(answer) - 1) // 8 * 8 > len(PROMPTS[3])


def test_abort_frees_the_slot_at_the_next_step(tiny_model: LoadedModel) -> None:
    scheduler = _scheduler(tiny_model, max_batch=1)
    scheduler.add(_request("a", PROMPTS[0], max_tokens=100))
    scheduler.add(_request("b", PROMPTS[1], max_tokens=5))
    scheduler.step()
    scheduler.step()
    assert [s.request_id for s in scheduler.running] == ["a"] and scheduler.ahead_of("b") == 0
    scheduler.abort("a")
    outputs = scheduler.step()
    assert outputs[0] == SequenceOutput("a", [], done=True, cancelled=True)
    assert [s.request_id for s in scheduler.running] == ["b"] and any(
        o.request_id == "b" and o.events for o in outputs[1:]
    )


def test_work_beyond_the_kv_budget_waits_in_the_queue(tiny_model: LoadedModel) -> None:
    probe = _scheduler(tiny_model)
    per_sequence = 256 * probe.cache.bytes_per_position  # one slot: reserves round up to 256 positions
    scheduler = _scheduler(tiny_model, kv_budget_bytes=2 * per_sequence)
    for i in range(3):
        scheduler.add(_request(f"k{i}", PROMPTS[i], max_tokens=8))
    scheduler.step()
    assert len(scheduler.running) == 2 and scheduler.ahead_of("k2") == 0
    assert scheduler.stats().kv_usage == 1.0
    finished: set[str] = set()
    while not finished:
        finished = {o.request_id for o in scheduler.step() if o.done}
    assert finished == {"k0", "k1"} and scheduler.ahead_of("k2") == 0  # a slot frees at the end of a step...
    scheduler.step()
    assert [s.request_id for s in scheduler.running] == ["k2"]  # ...and the next step admits the waiting request


def test_a_full_queue_refuses_at_once(tiny_model: LoadedModel) -> None:
    scheduler = _scheduler(tiny_model, max_batch=1, max_waiting=2)
    for i in range(3):  # one for the free slot, two for the queue
        scheduler.add(_request(f"q{i}", PROMPTS[i]))
    with pytest.raises(QueueFullError):
        scheduler.add(_request("q3", PROMPTS[3]))


def test_an_exception_in_one_sequence_fails_only_that_request(tiny_model: LoadedModel) -> None:
    scheduler = _scheduler(tiny_model)
    scheduler.add(_request("ok", PROMPTS[0], max_tokens=6))
    broken = scheduler.add(_request("broken", PROMPTS[1], max_tokens=6))

    def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("sampler exploded")

    broken.sampler.sample = explode  # type: ignore[method-assign]
    outputs: list[SequenceOutput] = []
    for _ in range(10):
        outputs += scheduler.step()
    failed = [o for o in outputs if o.request_id == "broken"]
    assert len(failed) == 2 and failed[-1].done and isinstance(failed[-1].error, RuntimeError)  # admitted, then failed
    assert len(_tokens([o for o in outputs if o.request_id == "ok"])) == 6
    assert not scheduler.running


def test_a_paused_sequence_sits_out_steps_until_resumed(tiny_model: LoadedModel) -> None:
    scheduler = _scheduler(tiny_model)
    scheduler.add(dataclasses.replace(_request("p", PROMPTS[0], max_tokens=5), step_mode=True))
    scheduler.add(_request("free", PROMPTS[1], max_tokens=5))
    scheduler.step()
    for _ in range(3):
        assert [o.request_id for o in scheduler.step()] == ["free"]
    assert scheduler.has_work
    scheduler.resume("p")
    assert "p" in [o.request_id for o in scheduler.step()]


def test_it_stops_at_an_end_of_turn_token_unless_told_to_ignore_it(tiny_model: LoadedModel) -> None:
    greedy = [s.token_id for s in _alone(tiny_model, _request("g", PROMPTS[0], max_tokens=5))]
    stopping = Scheduler(tiny_model.model, frozenset({greedy[2]}), tiny_model.tokenizer.token_bytes)
    events = _tokens(_run(stopping, [_request("s", PROMPTS[0], max_tokens=5)])["s"])
    assert len(events) == greedy.index(greedy[2]) + 1 and events[-1].is_stop
    ignoring = Scheduler(tiny_model.model, frozenset({greedy[2]}), tiny_model.tokenizer.token_bytes)
    assert len(_tokens(_run(ignoring, [_request("i", PROMPTS[0], max_tokens=5, ignore_eos=True)])["i"])) == 5


def test_arrivals_one_at_a_time_grow_the_cache_with_room_to_spare(tiny_model: LoadedModel) -> None:
    """Growing the cache copies it while every stream waits: a burst of arrivals must not regrow it once per newcomer."""
    scheduler = _scheduler(tiny_model)
    sizes = []
    for i in range(5):
        scheduler.add(_request(f"g{i}", PROMPTS[i], max_tokens=40))
        scheduler.step()
        sizes.append(scheduler.cache.slots)
    assert sizes == [4, 4, 4, 4, 8]
    assert scheduler.stats().kv_bytes == 5 * scheduler.cache.nbytes // 8  # the running sequences', not the spare slots'


def test_spare_slots_are_kept_while_sequences_run_and_freed_when_idle(tiny_model: LoadedModel) -> None:
    scheduler = _scheduler(tiny_model, idle_kv_bytes=0)
    for i in range(5):
        scheduler.add(_request(f"s{i}", PROMPTS[i], max_tokens=3 if i else 30))
    slots = []
    while scheduler.has_work:
        scheduler.step()
        slots.append((len(scheduler.running), scheduler.cache.slots))
    assert (1, 5) in slots  # one sequence left: the burst's slots stay (shrinking would copy it mid-stream)
    assert slots[-1] == (0, 0) and scheduler.cache.nbytes == 0


def test_an_idle_engine_keeps_a_small_cache_so_the_next_request_does_not_allocate_one(tiny_model: LoadedModel) -> None:
    scheduler = _scheduler(tiny_model)
    _run(scheduler, [_request("first", PROMPTS[0], max_tokens=3)])
    scheduler.finish_step()
    kept = scheduler.cache.k
    assert 0 < scheduler.cache.nbytes <= scheduler.config.idle_kv_bytes and scheduler.stats().kv_bytes == 0
    second = _run(scheduler, [_request("second", PROMPTS[1], max_tokens=3)])["second"]
    assert scheduler.cache.k is kept  # admitted into the kept cache: no new allocation
    assert [t.token_id for t in _tokens(second)] == [
        t.token_id for t in _alone(tiny_model, _request("a", PROMPTS[1], max_tokens=3))
    ]


def test_an_idle_engine_keeps_no_more_than_its_idle_budget(tiny_model: LoadedModel) -> None:
    scheduler = _scheduler(tiny_model)
    _run(scheduler, [_request(f"b{i}", PROMPTS[i], max_tokens=3) for i in range(5)])
    scheduler.finish_step()
    per_slot = scheduler.cache.nbytes // scheduler.cache.slots
    small = _scheduler(tiny_model, idle_kv_bytes=2 * per_slot)
    _run(small, [_request(f"b{i}", PROMPTS[i], max_tokens=3) for i in range(5)])
    small.finish_step()
    assert small.cache.slots == 2 and small.cache.nbytes <= small.config.idle_kv_bytes


def test_a_finished_sequence_leaves_its_slot_and_fills_the_prefix_cache_after_its_outputs(
    tiny_model: LoadedModel,
) -> None:
    """Releasing a batch of finished streams costs ms (their prefixes are copied into the prefix cache): their last
    tokens go out first; `finish_step` (or else the next step) does the rest."""
    scheduler = _scheduler(tiny_model, prefix_block=4)
    scheduler.add(_request("f", PROMPTS[0], max_tokens=6))  # its answer fills at least one more block of 4
    while not any(o.done for o in scheduler.step()):
        pass
    assert [s.request_id for s in scheduler.running] == ["f"] and scheduler.stats().running == 0 and scheduler.has_work
    cached = len(scheduler.prefix_cache)
    scheduler.finish_step()
    assert scheduler.running == [] and len(scheduler.prefix_cache) > cached and not scheduler.has_work


def test_the_next_step_does_the_bookkeeping_a_caller_left(tiny_model: LoadedModel) -> None:
    scheduler = _scheduler(tiny_model, max_batch=1)
    scheduler.add(_request("first", PROMPTS[0], max_tokens=1))
    scheduler.add(_request("second", PROMPTS[1], max_tokens=1))
    assert any(o.request_id == "first" and o.done for o in scheduler.step())
    assert any(o.request_id == "second" for o in scheduler.step())  # its slot, freed at the start of this step


def test_idle_scheduler_has_no_work_and_gives_its_memory_back(tiny_model: LoadedModel) -> None:
    scheduler = _scheduler(tiny_model)
    _run(scheduler, [_request("x", PROMPTS[0], max_tokens=3)])
    assert not scheduler.has_work and scheduler.stats().kv_bytes == 0 and scheduler.stats().running == 0


REAL_TOPICS = [
    "a lighthouse keeper",
    "the moon",
    "a clockmaker",
    "a city under the sea",
    "an old violin",
    "a desert caravan",
]


@pytest.mark.parametrize("weights, tolerance", [("fp32", 1e-3), ("bf16", 0.5), ("int4", 0.5)])
def test_the_real_model_batched_gives_each_request_its_own_greedy_answer(
    weights: str, tolerance: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32: batching changes nothing measurable. bfloat16 activations round differently for different batch
    shapes, so a near-tie can flip; the test shows the two top logits at the first divergence were within `tolerance`."""
    from inference.loader import load_model
    from inference.pipeline import ChatPipeline

    monkeypatch.setenv("ROUNDTRIP_WEIGHTS", weights)
    loaded = load_model(device="cpu")
    pipeline = ChatPipeline(loaded)
    requests = [
        pipeline.sequence_request(
            pipeline.prepare(
                [{"role": "user", "content": f"Write a story about {t}."}],
                SamplingParams(temperature=0.0, max_tokens=32, top_logprobs=3),
            ),
            f"real{i}",
        )
        for i, t in enumerate(REAL_TOPICS)
    ]
    together = _run(_scheduler(loaded), requests)
    for request in requests:
        assert_same_or_near_tie(_tokens(together[request.request_id]), _alone(loaded, request), tolerance)


def test_choices_of_one_request_share_one_prefill_and_decode_together(tiny_model: LoadedModel) -> None:
    """n > 1: the later choices wait for the first one's prompt, copy it, and join its batch; each choice is what its
    own seed gives alone."""
    prompt = PROMPTS[0] * 3
    first = _request("n", prompt, TraceLevel.SUMMARY, temperature=1.0, seed=5, max_tokens=8)
    others = [
        dataclasses.replace(
            first, request_id=f"n#{i}", params=dataclasses.replace(first.params, seed=5 + i), shares_prompt_with="n"
        )
        for i in (1, 2)
    ]
    outputs = _run(_scheduler(tiny_model, prefix_cache_bytes=0), [first, *others])
    batches = [e for e in _events(outputs["n"]) if isinstance(e, BatchStep)]
    assert (
        batches[0].prefill_tokens == len(prompt) and batches[0].batch_size == 1
    )  # only the first choice prefills the prompt
    assert max(b.batch_size for b in batches) == 3  # then all three decode in one forward
    for other in others:
        finished = next(e for e in _events(outputs[other.request_id]) if isinstance(e, Finished))
        assert finished.cached_tokens == len(prompt) - 1  # copied from the first choice, not recomputed
        alone = dataclasses.replace(other, request_id="alone", shares_prompt_with=None)
        assert [s.token_id for s in _tokens(outputs[other.request_id])] == [
            s.token_id for s in _alone(tiny_model, alone)
        ]


def test_resampling_a_past_step_greedily_gives_the_token_the_run_chose(tiny_model: LoadedModel) -> None:
    prompt = PROMPTS[1]
    run = [s.token_id for s in _alone(tiny_model, _request("r", prompt, max_tokens=8, ignore_eos=True))]
    scheduler = _scheduler(tiny_model)
    for step in (0, 3, 7):
        again = scheduler.resample(prompt, run[:step], SamplingParams(temperature=0.0))
        assert again.token_id == run[step]
        assert again.detail is not None and again.detail.candidates[0].token_id == run[step]


def test_resampling_the_first_step_with_the_runs_seed_draws_the_same_token(tiny_model: LoadedModel) -> None:
    params = dict(temperature=1.3, top_p=0.95, seed=11)
    first = _alone(tiny_model, _request("r", PROMPTS[0], max_tokens=1, ignore_eos=True, **params))[0]
    again = _scheduler(tiny_model).resample(PROMPTS[0], [], SamplingParams(**params))
    assert again.token_id == first.token_id and again.detail is not None and again.detail.draw is not None


def test_other_settings_change_that_steps_distribution(tiny_model: LoadedModel) -> None:
    scheduler = _scheduler(tiny_model)
    cool = scheduler.resample(PROMPTS[0], [], SamplingParams(temperature=0.5, seed=1))
    warm = scheduler.resample(PROMPTS[0], [], SamplingParams(temperature=2.0, seed=1))
    assert cool.detail is not None and warm.detail is not None
    assert [c.raw_prob for c in cool.detail.candidates] == [
        c.raw_prob for c in warm.detail.candidates
    ]  # the same logits
    assert (
        cool.detail.candidates[0].adjusted_prob > warm.detail.candidates[0].adjusted_prob
    )  # a cooler, sharper distribution
    only_best = scheduler.resample(PROMPTS[0], [], SamplingParams(temperature=1.0, top_k=1, seed=1))
    assert only_best.token_id == cool.detail.candidates[0].token_id and only_best.detail is not None
    assert only_best.detail.kept == 1


def test_penalties_in_a_resample_see_the_tokens_generated_before_that_step(tiny_model: LoadedModel) -> None:
    prompt = PROMPTS[1]
    run = [s.token_id for s in _alone(tiny_model, _request("r", prompt, max_tokens=6, ignore_eos=True))]
    scheduler = _scheduler(tiny_model)
    free = scheduler.resample(prompt, run[:5], SamplingParams(temperature=0.0))
    barred = scheduler.resample(
        prompt,
        run[:5],
        SamplingParams(temperature=0.0, frequency_penalty=2.0, logit_bias=[(t, -100.0) for t in prompt]),
    )
    assert free.token_id == run[5]
    assert barred.token_id not in run[:5] + prompt  # earlier outputs penalised, the prompt's tokens biased away
    assert barred.detail is not None and all(
        c.token_id not in prompt or c.adjusted_prob < 1e-6 for c in barred.detail.candidates
    )


def test_the_prompts_full_attention_matrix_matches_each_positions_own_row(tiny_model: LoadedModel) -> None:
    """Row i of the recomputed matrix is what a full-level probe of position i alone records at that layer."""

    prompt = PROMPTS[3]
    scheduler = _scheduler(tiny_model)
    matrix = scheduler.prompt_attention(prompt, layer=1)  # [H, T, T]
    assert matrix.shape == (tiny_model.config.n_heads, len(prompt), len(prompt))
    for i in (0, 4, len(prompt) - 1):
        row = torch.from_numpy(
            scheduler.inspect(prompt[: i + 1]).attention[1].astype("float32")
        )  # [H, i + 1], float16 in the detail
        assert torch.allclose(matrix[:, i, : i + 1], row, atol=2e-3)
        assert float(matrix[:, i, i + 1 :].abs().sum()) == 0.0  # causal: nothing after the query
    assert torch.allclose(matrix.sum(dim=-1), torch.ones(matrix.shape[:2]), atol=1e-5)
    with pytest.raises(InvalidRequestError, match="'layer'"):
        scheduler.prompt_attention(prompt, layer=tiny_model.config.n_layers)
