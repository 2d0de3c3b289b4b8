"""The sampler: greedy, seeds, filters, penalties, and clear errors for impossible values."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from inference.errors import InvalidRequestError
from inference.params import SamplingParams
from inference.sampling import Sampler

V = 50
STOP = frozenset({0})


def _logits(seed: int = 0) -> torch.Tensor:
    return torch.randn(V, generator=torch.Generator().manual_seed(seed)) * 3


def _sampler(**params: object) -> Sampler:
    return Sampler(SamplingParams(**params), V, [1, 2, 3], STOP)  # type: ignore[arg-type]


def _run(sampler: Sampler, steps: int = 20) -> list[int]:
    return [sampler.sample(_logits(i)).token_id for i in range(steps)]


def test_temperature_zero_is_argmax() -> None:
    sampler = _sampler(temperature=0.0)
    for i in range(10):
        assert sampler.sample(_logits(i)).token_id == int(_logits(i).argmax())


def test_the_same_seed_gives_the_same_tokens() -> None:
    assert _run(_sampler(temperature=1.0, seed=42)) == _run(_sampler(temperature=1.0, seed=42))


def test_different_seeds_give_different_tokens() -> None:
    assert _run(_sampler(temperature=1.0, seed=1)) != _run(_sampler(temperature=1.0, seed=2))


def test_without_a_seed_one_is_chosen_and_reported() -> None:
    a, b = _sampler(temperature=1.0), _sampler(temperature=1.0)
    assert a.seed != b.seed
    assert _run(a) == _run(_sampler(temperature=1.0, seed=a.seed))


def test_top_k_one_is_greedy() -> None:
    sampler = _sampler(temperature=1.5, top_k=1, seed=3)
    assert [sampler.sample(_logits(i)).token_id for i in range(10)] == [int(_logits(i).argmax()) for i in range(10)]


def test_top_k_only_draws_from_the_k_best() -> None:
    sampler = _sampler(temperature=2.0, top_k=3, seed=0)
    best3 = set(torch.topk(_logits(0), 3).indices.tolist())
    assert {sampler.sample(_logits(0)).token_id for _ in range(200)} <= best3


def test_top_p_keeps_the_smallest_nucleus() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05] + [1e-9] * (V - 4)))
    sample = _sampler(temperature=1.0, top_p=0.8, seed=0).sample(logits, detail_top_n=4)
    assert sample.detail is not None
    assert [c.removed_by for c in sample.detail.candidates] == [None, None, "top_p", "top_p"]
    assert sample.detail.kept == 2
    assert math.isclose(sum(c.final_prob for c in sample.detail.candidates), 1.0, rel_tol=1e-5)


def test_min_p_removes_tokens_far_below_the_best() -> None:
    logits = torch.log(torch.tensor([0.6, 0.3, 0.05, 0.05] + [1e-9] * (V - 4)))
    detail = _sampler(temperature=1.0, min_p=0.2, seed=0).sample(logits, detail_top_n=4).detail
    assert detail is not None
    assert [c.removed_by for c in detail.candidates] == [None, None, "min_p", "min_p"]


def test_draws_follow_the_filtered_distribution() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2] + [1e-12] * (V - 3)))
    sampler = _sampler(temperature=1.0, seed=7)
    counts = Counter(sampler.sample(logits).token_id for _ in range(3000))
    assert abs(counts[0] / 3000 - 0.5) < 0.04 and abs(counts[1] / 3000 - 0.3) < 0.04


def test_the_draw_picks_the_token_where_the_cumulative_probability_passes_it() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2] + [1e-12] * (V - 3)))
    sampler = _sampler(temperature=1.0, seed=11)
    for _ in range(50):
        sample = sampler.sample(logits, detail_top_n=3)
        assert sample.detail is not None and sample.detail.draw is not None
        draw = sample.detail.draw
        assert sample.token_id == (0 if draw < 0.5 else 1 if draw < 0.8 else 2)


def test_the_trace_reports_raw_and_adjusted_probabilities_rank_and_logprob() -> None:
    logits = _logits(5)
    sample = _sampler(temperature=0.5, seed=1).sample(logits, detail_top_n=5)
    raw = torch.softmax(logits, -1)
    assert sample.detail is not None
    top = sample.detail.candidates[0]
    assert top.token_id == int(logits.argmax())
    assert math.isclose(top.raw_prob, float(raw.max()), rel_tol=1e-5)
    assert math.isclose(top.adjusted_prob, float(torch.softmax(logits / 0.5, -1).max()), rel_tol=1e-5)
    assert math.isclose(sample.logprob, float(torch.log(raw[sample.token_id])), rel_tol=1e-5)
    assert sample.rank == int((raw > raw[sample.token_id]).sum()) + 1
    assert math.isclose(sample.detail.eos_prob, float(raw[0]), rel_tol=1e-5)


def test_top_logprobs_are_the_models_best_tokens() -> None:
    logits = _logits(2)
    sample = _sampler(temperature=0.0, top_logprobs=3).sample(logits)
    assert [i for i, _ in sample.top_logprobs] == torch.topk(logits, 3).indices.tolist()


def test_repetition_penalty_lowers_tokens_already_seen() -> None:
    logits = torch.zeros(V)
    logits[1], logits[10] = 2.0, 1.9  # token 1 is in the prompt
    assert _sampler(temperature=0.0).sample(logits).token_id == 1
    assert _sampler(temperature=0.0, repetition_penalty=1.2).sample(logits).token_id == 10


def test_frequency_penalty_grows_with_each_repeat() -> None:
    logits = torch.zeros(V)
    logits[5], logits[6] = 1.0, 0.5
    sampler = _sampler(temperature=0.0, frequency_penalty=0.3)
    assert [sampler.sample(logits).token_id for _ in range(3)] == [5, 5, 6]


def test_presence_penalty_applies_once_per_token() -> None:
    logits = torch.zeros(V)
    logits[5], logits[6] = 1.0, 0.5
    sampler = _sampler(temperature=0.0, presence_penalty=0.6)
    # 5 drops below 6 once seen, 6 drops too, and neither sinks further with repeats.
    assert [sampler.sample(logits).token_id for _ in range(4)] == [5, 6, 5, 5]


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("temperature", 5.0),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("min_p", 2.0),
        ("repetition_penalty", 0.0),
        ("presence_penalty", 3.0),
        ("frequency_penalty", -2.5),
        ("max_tokens", 0),
        ("top_logprobs", 21),
        ("seed", 2**70),
    ],
)
def test_impossible_values_are_rejected_with_the_parameter_named(field: str, value: object) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**{field: value}).validate()  # type: ignore[arg-type]
    assert info.value.param == field
    assert field in str(info.value)


@pytest.mark.parametrize("stop", [("",), ("a", "b", "c", "d", "e")])
def test_bad_stop_lists_are_rejected(stop: tuple[str, ...]) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(stop=stop).validate()
    assert info.value.param == "stop"


def test_logit_bias_is_added_before_everything_and_shown_on_the_candidate() -> None:
    logits = torch.zeros(V)
    logits[5], logits[6] = 2.0, 1.0
    sampler = Sampler(SamplingParams(temperature=0.0, logit_bias=((5, -100.0), (7, 1.5))), V, [1], STOP)
    sample = sampler.sample(logits, detail_top_n=3)
    assert sample.token_id == 7  # 0 + 1.5 beats 6's 1.0, and 5 is out
    assert sample.detail is not None
    assert {c.token_id: c.bias for c in sample.detail.candidates}[7] == 1.5


def test_a_logit_bias_outside_the_vocabulary_is_named() -> None:
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        Sampler(SamplingParams(logit_bias=((V + 3, 1.0),)), V, [1], STOP)


def test_an_observed_token_counts_for_the_penalties_like_a_sampled_one() -> None:
    logits = torch.zeros(V)
    logits[7], logits[8] = 2.0, 1.0
    sampler = _sampler(temperature=0.0, frequency_penalty=1.5)
    assert sampler.sample(logits.clone()).token_id == 7  # sampled once: now penalised by 1.5, below token 8
    assert sampler.sample(logits.clone()).token_id == 8
    replayed = _sampler(temperature=0.0, frequency_penalty=1.5)
    replayed.observe(7)  # a re-sample of the second step replays the first
    assert replayed.sample(logits.clone()).token_id == 8
