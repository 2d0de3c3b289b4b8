"""Turning logits into the next token: penalties, temperature, top-k, top-p, min-p and a seeded draw.

The sampler keeps what the trace shows: each top candidate's raw probability, its
probability after penalties and temperature, which filter (if any) removed it, the
uniform draw, the chosen token's rank and log-probability.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import Tensor

from inference.params import SamplingParams
from inference.trace import Candidate, SamplingDetail


@dataclass(frozen=True)
class Sample:
    token_id: int
    logprob: float  # under the model's raw distribution, as OpenAI's logprobs report it
    rank: int  # 1 = the model's most likely token
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)
    detail: SamplingDetail | None = None


class Sampler:
    """Per-request sampler: owns the seeded generator and the token counts the penalties need."""

    def __init__(self, params: SamplingParams, vocab_size: int, prompt_ids: Sequence[int], stop_ids: frozenset[int]) -> None:
        params.validate()
        self.params = params
        self.seed = params.seed if params.seed is not None else secrets.randbits(63)
        self._generator = torch.Generator().manual_seed(self.seed % 2**64)
        self._seen = torch.zeros(vocab_size, dtype=torch.bool)
        self._seen[torch.tensor(list(prompt_ids), dtype=torch.long)] = True
        self._counts = torch.zeros(vocab_size, dtype=torch.float32)
        self._stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.long)
        self._penalised = (params.repetition_penalty, params.presence_penalty, params.frequency_penalty) != (1.0, 0.0, 0.0)

    def sample(self, logits: Tensor, detail_top_n: int = 0) -> Sample:
        """Pick the next token from float32 logits [V]; with detail_top_n > 0, explain the decision."""
        detail_top_n = min(detail_top_n, logits.shape[-1])
        raw_logprobs = torch.log_softmax(logits, dim=-1)
        adjusted = self._apply_penalties(logits) if self._penalised else logits
        p = self.params
        if p.temperature == 0.0:
            token = int(torch.argmax(adjusted))
            draw = None
            order, keep, final = None, None, None
        else:
            token, draw, order, keep, final = self._draw(adjusted / p.temperature)
        self._seen[token] = True
        self._counts[token] += 1
        chosen_logprob = raw_logprobs[token]
        sample_top = max(p.top_logprobs, detail_top_n)
        top_lp, top_ids = torch.topk(raw_logprobs, sample_top) if sample_top else (None, None)
        top_logprobs = (
            list(zip(top_ids[: p.top_logprobs].tolist(), top_lp[: p.top_logprobs].tolist()))
            if top_ids is not None and top_lp is not None
            else []
        )
        detail = (
            self._explain(raw_logprobs, adjusted, order, keep, final, draw, detail_top_n) if detail_top_n else None
        )
        return Sample(
            token_id=token,
            logprob=float(chosen_logprob),
            rank=int((raw_logprobs > chosen_logprob).sum()) + 1,
            top_logprobs=top_logprobs,
            detail=detail,
        )

    def _apply_penalties(self, logits: Tensor) -> Tensor:
        """Repetition penalty over prompt and output (llama.cpp/HF); presence and frequency over output (OpenAI)."""
        p = self.params
        out = logits.clone()
        if p.repetition_penalty != 1.0:
            seen = out[self._seen]
            out[self._seen] = torch.where(seen > 0, seen / p.repetition_penalty, seen * p.repetition_penalty)
        if p.frequency_penalty or p.presence_penalty:
            out -= p.frequency_penalty * self._counts + p.presence_penalty * (self._counts > 0).float()
        return out

    def _draw(self, scaled: Tensor) -> tuple[int, float, Tensor, Tensor, Tensor]:
        """Filter in llama.cpp's order (top-k, top-p, min-p) over sorted tokens, then invert the CDF at a uniform draw."""
        p = self.params
        sorted_logits, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        keep = torch.zeros(probs.shape[0], dtype=torch.int8)  # 0 kept, 1 top_k, 2 top_p, 3 min_p
        if p.top_k:
            keep[p.top_k :] = 1
        if p.top_p < 1.0:
            kept = torch.where(keep == 0, probs, 0.0)
            cum = torch.cumsum(kept / kept.sum(), dim=-1)
            cut = (cum - kept / kept.sum()) >= p.top_p  # tokens wholly past the nucleus
            keep[(keep == 0) & cut] = 2
        if p.min_p > 0.0:
            keep[(keep == 0) & (probs < p.min_p * probs[0])] = 3
        final = torch.where(keep == 0, probs, 0.0)
        final = final / final.sum()
        draw = float(torch.rand((), generator=self._generator))
        index = int(torch.searchsorted(torch.cumsum(final, dim=-1), torch.tensor([draw]), right=True)[0])
        index = min(index, int((keep == 0).sum()) - 1)  # guard against the draw landing on float round-off
        return int(order[index]), draw, order, keep, final

    def _explain(
        self,
        raw_logprobs: Tensor,
        adjusted: Tensor,
        order: Tensor | None,
        keep: Tensor | None,
        final: Tensor | None,
        draw: float | None,
        top_n: int,
    ) -> SamplingDetail:
        removed_names = (None, "top_k", "top_p", "min_p")
        eos = float(raw_logprobs[self._stop_ids].exp().sum()) if len(self._stop_ids) else 0.0
        if order is None or keep is None or final is None:  # greedy: the top token is certain
            adjusted_probs = torch.softmax(adjusted, dim=-1)
            ids = torch.topk(adjusted, top_n).indices.tolist()
            candidates = [
                Candidate(i, float(raw_logprobs[i].exp()), float(adjusted_probs[i]), None if r == 0 else "greedy", 1.0 if r == 0 else 0.0)
                for r, i in enumerate(ids)
            ]
            return SamplingDetail(candidates=candidates, draw=None, kept=1, eos_prob=eos)
        adjusted_probs = torch.softmax(adjusted / self.params.temperature, dim=-1)
        candidates = [
            Candidate(
                token_id=int(order[r]),
                raw_prob=float(raw_logprobs[order[r]].exp()),
                adjusted_prob=float(adjusted_probs[order[r]]),
                removed_by=removed_names[int(keep[r])],
                final_prob=float(final[r]),
            )
            for r in range(min(top_n, order.shape[0]))
        ]
        return SamplingDetail(candidates=candidates, draw=draw, kept=int((keep == 0).sum()), eos_prob=eos)
