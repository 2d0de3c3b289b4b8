"""The page's what-if tools on the tiny model: a past step resampled with other settings, the prompt's whole attention
matrix at one layer, and a token's full-level detail, each recomputed beside (never inside) a running batch."""

from __future__ import annotations

import pytest
import torch
from engine_runs import PROMPTS, alone, sequence_request

from inference import what_if
from inference.errors import InvalidRequestError
from inference.loader import LoadedModel
from inference.params import SamplingParams


def test_resampling_a_past_step_greedily_gives_the_token_the_run_chose(tiny_model: LoadedModel) -> None:
    prompt = PROMPTS[1]
    run = [s.token_id for s in alone(tiny_model, sequence_request("r", prompt, max_tokens=8, ignore_eos=True))]
    for step in (0, 3, 7):
        again = what_if.resample(
            tiny_model.model, tiny_model.stop_ids, prompt, run[:step], SamplingParams(temperature=0.0)
        )
        assert again.token_id == run[step]
        assert again.detail is not None and again.detail.candidates[0].token_id == run[step]


def test_resampling_the_first_step_with_the_runs_seed_draws_the_same_token(tiny_model: LoadedModel) -> None:
    params = {"temperature": 1.3, "top_p": 0.95, "seed": 11}
    first = alone(tiny_model, sequence_request("r", PROMPTS[0], max_tokens=1, ignore_eos=True, **params))[0]
    again = what_if.resample(tiny_model.model, tiny_model.stop_ids, PROMPTS[0], [], SamplingParams(**params))
    assert again.token_id == first.token_id and again.detail is not None and again.detail.draw is not None


def test_other_settings_change_that_steps_distribution(tiny_model: LoadedModel) -> None:
    cool = what_if.resample(
        tiny_model.model, tiny_model.stop_ids, PROMPTS[0], [], SamplingParams(temperature=0.5, seed=1)
    )
    warm = what_if.resample(
        tiny_model.model, tiny_model.stop_ids, PROMPTS[0], [], SamplingParams(temperature=2.0, seed=1)
    )
    assert cool.detail is not None and warm.detail is not None
    assert [c.raw_prob for c in cool.detail.candidates] == [
        c.raw_prob for c in warm.detail.candidates
    ]  # the same logits
    # a cooler, sharper distribution
    assert cool.detail.candidates[0].adjusted_prob > warm.detail.candidates[0].adjusted_prob
    only_best = what_if.resample(
        tiny_model.model, tiny_model.stop_ids, PROMPTS[0], [], SamplingParams(temperature=1.0, top_k=1, seed=1)
    )
    assert only_best.token_id == cool.detail.candidates[0].token_id and only_best.detail is not None
    assert only_best.detail.kept == 1


def test_penalties_in_a_resample_see_the_tokens_generated_before_that_step(tiny_model: LoadedModel) -> None:
    prompt = PROMPTS[1]
    run = [s.token_id for s in alone(tiny_model, sequence_request("r", prompt, max_tokens=6, ignore_eos=True))]
    free = what_if.resample(tiny_model.model, tiny_model.stop_ids, prompt, run[:5], SamplingParams(temperature=0.0))
    barred = what_if.resample(
        tiny_model.model,
        tiny_model.stop_ids,
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
    matrix = what_if.prompt_attention(tiny_model.model, prompt, layer=1)  # [H, T, T]
    assert matrix.shape == (tiny_model.config.n_heads, len(prompt), len(prompt))
    for i in (0, 4, len(prompt) - 1):
        # [H, i + 1], float16 in the detail
        row = torch.from_numpy(what_if.inspect(tiny_model.model, prompt[: i + 1]).attention[1].astype("float32"))
        assert torch.allclose(matrix[:, i, : i + 1], row, atol=2e-3)
        assert float(matrix[:, i, i + 1 :].abs().sum()) == 0.0  # causal: nothing after the query
    assert torch.allclose(matrix.sum(dim=-1), torch.ones(matrix.shape[:2]), atol=1e-5)
    with pytest.raises(InvalidRequestError, match="'layer'"):
        what_if.prompt_attention(tiny_model.model, prompt, layer=tiny_model.config.n_layers)
