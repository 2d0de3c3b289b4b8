"""The scheduler without a model: what `schedule()` plans for a step, and what `update_from_output()` makes of logits
written by hand."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from inference.config import ModelConfig
from inference.kv_cache import SlotCache
from inference.outputs import ModelOutput, SchedulerOutput
from inference.params import SamplingParams
from inference.sampling import summarize
from inference.scheduler import Scheduler, SchedulerConfig
from inference.sequence import Phase, SequenceRequest
from inference.trace import Finished, Sampled

VOCAB = 32
STOP = 0
CONFIG = ModelConfig(
    "llama",
    n_layers=1,
    dim=8,
    n_heads=2,
    n_kv_heads=1,
    ffn_dim=16,
    vocab_size=VOCAB,
    context_length=256,
    rope_base=10000.0,
    rope_dim=4,
    norm_eps=1e-5,
)


def scheduler(**config: Any) -> Scheduler:
    cache = SlotCache(CONFIG, torch.device("cpu"), torch.float32)
    return Scheduler(
        cache, VOCAB, frozenset({STOP}), [bytes([65 + i % 26]) for i in range(VOCAB)], SchedulerConfig(**config)
    )


def request(rid: str, prompt_length: int, max_tokens: int = 3, **changes: Any) -> SequenceRequest:
    prompt = [1 + i % (VOCAB - 1) for i in range(prompt_length)]
    return dataclasses.replace(
        SequenceRequest(rid, prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens)), **changes
    )


def choosing(scheduled: SchedulerOutput, tokens: list[int]) -> ModelOutput:
    """A forward whose row for each sampling chunk puts all its weight on the given token."""
    rows = [chunk for chunk in scheduled.chunks if chunk.samples]
    assert len(rows) == len(tokens)
    logits = torch.full((len(rows), VOCAB), -10.0)
    logits[torch.arange(len(rows)), torch.tensor(tokens)] = 10.0
    return ModelOutput(logits, summarize(logits), [None] * len(scheduled.chunks), 1.0, 1.002)


def test_newcomers_share_the_prompt_budget_in_arrival_order_and_only_a_prompts_last_chunk_samples() -> None:
    s = scheduler(prefill_chunk=10)
    s.add(request("a", 6))
    s.add(request("b", 8))
    plan = s.schedule()
    assert [(c.state.request_id, len(c.tokens), c.samples) for c in plan.chunks] == [("a", 6, True), ("b", 4, False)]
    assert [state.slot for state in s.running] == [0, 1] and plan.prefill_tokens == 10 and plan.decode_rows == 0


def test_a_sampled_row_becomes_the_sequences_token_and_its_prompt_is_decoded_from_then_on() -> None:
    s = scheduler()
    s.add(request("a", 5))
    plan = s.schedule()
    [output] = s.update_from_output(plan, choosing(plan, [7]))
    sampled = [e for e in output.events if isinstance(e, Sampled)]
    assert [e.token_id for e in sampled] == [7] and not output.done
    assert s.running[0].phase == Phase.DECODE and s.last_batch is not None and s.last_batch.prefill_tokens == 5
    decode = s.schedule()
    assert [(c.tokens, c.samples) for c in decode.chunks] == [([7], True)] and decode.decode_rows == 1


def test_a_stop_token_finishes_the_sequence_and_finish_step_frees_its_slot() -> None:
    s = scheduler()
    s.add(request("a", 4))
    plan = s.schedule()
    [output] = s.update_from_output(plan, choosing(plan, [STOP]))
    finished = [e for e in output.events if isinstance(e, Finished)]
    assert output.done and finished[0].finish_reason == "stop" and finished[0].completion_tokens == 1
    assert len(s.running) == 1  # released by the bookkeeping, after the outputs went out
    s.finish_step()
    assert s.running == [] and not s.has_work


def test_a_failing_sequence_ends_alone_and_the_others_still_read_their_own_rows() -> None:
    s = scheduler()
    s.add(request("a", 3))
    broken = s.add(request("b", 3))
    s.add(request("c", 3))

    def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("sampler exploded")

    broken.sampler.sample = explode  # type: ignore[method-assign]
    plan = s.schedule()
    outputs = {o.request_id: o for o in s.update_from_output(plan, choosing(plan, [5, 6, 9]))}
    assert outputs["b"].done and isinstance(outputs["b"].error, RuntimeError)
    assert [e.token_id for e in outputs["a"].events if isinstance(e, Sampled)] == [5]
    assert [e.token_id for e in outputs["c"].events if isinstance(e, Sampled)] == [9]  # its row, not b's


def test_a_paused_sequence_is_left_out_of_the_plan_until_resumed() -> None:
    s = scheduler()
    s.add(request("p", 3, step_mode=True))
    plan = s.schedule()
    s.update_from_output(plan, choosing(plan, [4]))
    assert s.schedule().chunks == [] and not s.has_work
    s.resume("p")
    assert [c.state.request_id for c in s.schedule().chunks] == ["p"]


def test_an_aborted_sequence_leaves_in_the_next_plan() -> None:
    s = scheduler()
    s.add(request("a", 3))
    s.add(request("b", 3))
    s.update_from_output(plan := s.schedule(), choosing(plan, [4, 5]))
    s.abort("a")
    plan = s.schedule()
    assert [o.request_id for o in plan.outputs if o.cancelled] == ["a"]
    assert [c.state.request_id for c in plan.chunks] == ["b"] and [state.slot for state in s.running] == [0]


def test_a_full_batch_keeps_newcomers_waiting_in_order() -> None:
    s = scheduler(max_batch=1)
    for rid in "abc":
        s.add(request(rid, 3))
    plan = s.schedule()
    assert [c.state.request_id for c in plan.chunks] == ["a"]
    assert [state.request_id for state in s.waiting] == ["b", "c"] and s.ahead_of("c") == 1
