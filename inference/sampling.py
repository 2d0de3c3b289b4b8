"""Turning logits into the next token: penalties, temperature, top-k, top-p, min-p and a seeded draw.

The sampler keeps what the trace shows: each top candidate's raw probability, its
probability after penalties and temperature, which filter (if any) removed it, the
uniform draw, the chosen token's rank and log-probability.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from inference import cpu_kernels
from inference.params import SamplingParams
from inference.trace import Candidate, SamplingDetail

HEAD = 256  # candidates sorted for the filters and the trace (see `Sampler._draw`)


@dataclass(frozen=True)
class Sample:
    token_id: int
    logprob: float  # under the model's raw distribution, as OpenAI's logprobs report it
    rank: int  # 1 = the model's most likely token
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)
    detail: SamplingDetail | None = None


@dataclass(frozen=True)
class RowSummary:
    """What every draw needs from a row of logits, computed for a whole batch in two passes instead of two per row."""

    log_z: float  # logsumexp of the raw logits
    best: int  # the likeliest token


def summarize(logits: Tensor) -> list[RowSummary]:
    """Each row's RowSummary, for float32 logits [n, V]: at 8 rows of a 49k vocabulary, one batched pass costs about
    what two per-row passes did for a single row."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and cpu_kernels.is_loaded():
        z, b = cpu_kernels.row_summary(logits)  # one pass for the best, one for the partition
    else:
        z, b = torch.logsumexp(logits, dim=-1), logits.max(dim=-1).indices
    return [RowSummary(log_z, best) for log_z, best in zip(z.tolist(), b.tolist())]


class Sampler:
    """Per-request sampler: owns the seeded generator and the token counts the penalties need."""

    def __init__(
        self, params: SamplingParams, vocab_size: int, prompt_ids: Sequence[int], stop_ids: frozenset[int]
    ) -> None:
        params.validate(vocab_size)
        self.params = params
        self.seed = params.seed if params.seed is not None else secrets.randbits(63)
        self._generator = torch.Generator().manual_seed(self.seed % 2**64)
        self._seen = torch.zeros(vocab_size, dtype=torch.bool)
        self._seen[torch.tensor(list(prompt_ids), dtype=torch.long)] = True
        self._counts = torch.zeros(vocab_size, dtype=torch.float32)
        self._stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.long)
        self._penalised = (params.repetition_penalty, params.presence_penalty, params.frequency_penalty) != (
            1.0,
            0.0,
            0.0,
        ) or bool(params.logit_bias)
        self._bias_map = dict(params.logit_bias)
        self._bias_ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.long)
        self._bias = torch.tensor([b for _, b in params.logit_bias], dtype=torch.float32)

    def sample(
        self, logits: Tensor, detail_top_n: int = 0, allowed: Tensor | None = None, summary: RowSummary | None = None
    ) -> Sample:
        """Pick the next token from float32 logits [V]; with detail_top_n > 0, explain the decision.
        `allowed` (bool [V], from a grammar) removes every other token before the filters; `summary`, when the
        batch's rows were summarized at once, saves this row's own passes.

        Written for a 49k vocabulary on a CPU, where every full pass costs tens of microseconds:
        log-probabilities come from one logsumexp, and greedy decoding is a single max.
        """
        detail_top_n = min(detail_top_n, logits.shape[-1])
        summary = summary or summarize(logits[None])[0]
        log_z = summary.log_z  # raw log-probability of token i = logits[i] - log_z
        unmasked = self._apply_penalties(logits) if self._penalised else logits
        adjusted = unmasked if allowed is None else torch.where(allowed, unmasked, float("-inf"))
        p = self.params
        if p.temperature == 0.0:
            token = summary.best if adjusted is logits else int(adjusted.max(dim=-1).indices)
            draw = None
            order, keep, final = None, None, None
        else:
            token, draw, order, keep, final = self._draw(adjusted / p.temperature)
        self.observe(token)
        chosen = logits[token]
        top_logprobs: list[tuple[int, float]] = []
        if p.top_logprobs:
            values, ids = torch.topk(logits, p.top_logprobs)
            top_logprobs = list(zip(ids.tolist(), (values - log_z).tolist()))
        detail = (
            self._explain(logits, log_z, unmasked, allowed, order, keep, final, draw, detail_top_n)
            if detail_top_n
            else None
        )
        # greedy on the raw logits: the model's first choice
        certain_best = draw is None and not self._penalised and allowed is None
        return Sample(
            token_id=token,
            logprob=float(chosen - log_z),
            rank=1 if certain_best else int((logits > chosen).sum()) + 1,
            top_logprobs=top_logprobs,
            detail=detail,
        )

    def observe(self, token: int) -> None:
        """Count `token` as generated (what presence, frequency and repetition penalties look at): `sample` does
        it for its own draws; a re-sample of a past step replays the tokens before it."""
        self._seen[token] = True
        self._counts[token] += 1

    def _apply_penalties(self, logits: Tensor) -> Tensor:
        """Logit bias (OpenAI: added to the logits first), then the repetition penalty over prompt and output
        (llama.cpp/HF), then presence and frequency over output (OpenAI)."""
        p = self.params
        out = logits.clone()
        if len(self._bias_ids):
            out[self._bias_ids] += self._bias
        if p.repetition_penalty != 1.0:
            seen = out[self._seen]
            out[self._seen] = torch.where(seen > 0, seen / p.repetition_penalty, seen * p.repetition_penalty)
        if p.frequency_penalty or p.presence_penalty:
            out -= p.frequency_penalty * self._counts + p.presence_penalty * (self._counts > 0).float()
        return out

    def _draw(self, scaled: Tensor) -> tuple[int, float, Tensor, Tensor, Tensor]:
        """Filter in llama.cpp's order (top-k, top-p, min-p) over the best tokens sorted by probability, then
        invert the CDF at a uniform draw. Returns (token, draw, order, keep, final) for the sorted candidates.

        Sorting all 49k tokens costs milliseconds, so only the best `HEAD` (or top_k) are sorted; the rest
        matter only when the filters keep some of them (a flat distribution under a wide top_p or no
        filter at all): then a draw beyond the sorted head picks among them in token order, which leaves
        the distribution unchanged.
        """
        p = self.params
        probs = torch.softmax(scaled, dim=-1)
        head = min(p.top_k or HEAD, probs.shape[0])
        top, order = torch.topk(probs, head)  # sorted, descending
        keep = torch.zeros(head, dtype=torch.int8)  # 0 kept, 1 top_k, 2 top_p, 3 min_p, 4 grammar
        tail_kept = not p.top_k and head < probs.shape[0] and float(top[-1]) > 0  # tokens beyond the head are still in
        if p.top_p < 1.0:
            cum = torch.cumsum(top, dim=-1)
            cut = (cum - top) >= p.top_p  # tokens wholly past the nucleus
            keep[cut] = 2
            tail_kept = tail_kept and not bool(cut.any())
        if p.min_p > 0.0:
            keep[(keep == 0) & (top < p.min_p * top[0])] = 3
            tail_kept = tail_kept and float(top[-1]) >= p.min_p * float(top[0])
        # -inf logits: removed by the grammar (a sorted head reaches them when few tokens are allowed)
        keep[top == 0] = 4
        final = torch.where(keep == 0, top, 0.0)
        tail_mass = max(0.0, 1.0 - float(top.sum())) if tail_kept else 0.0
        total = float(final.sum()) + tail_mass
        final = final / total
        draw = float(torch.rand((), generator=self._generator))
        kept_head = int((keep == 0).sum())
        if draw * total < total - tail_mass or not tail_kept:
            index = int(torch.searchsorted(torch.cumsum(final, dim=-1), torch.tensor([draw]), right=True)[0])
            index = min(index, kept_head - 1)  # guard against the draw landing on float round-off
            return int(order[index]), draw, order, keep, final
        rest = probs.clone()
        rest[order] = 0.0
        past = draw * total - (total - tail_mass)  # how far into the tail's mass the draw landed
        index = int(torch.searchsorted(torch.cumsum(rest, dim=-1), torch.tensor([past]), right=True)[0])
        return min(index, probs.shape[0] - 1), draw, order, keep, final

    def _explain(
        self,
        logits: Tensor,
        log_z: float,
        adjusted: Tensor,
        allowed: Tensor | None,
        order: Tensor | None,
        keep: Tensor | None,
        final: Tensor | None,
        draw: float | None,
        top_n: int,
    ) -> SamplingDetail:
        """The top candidates of the model (after penalties, before any grammar) and what became of each."""
        eos = float((logits[self._stop_ids] - log_z).exp().sum()) if len(self._stop_ids) else 0.0
        cut = 0 if allowed is None else int(allowed.shape[0] - allowed.sum())
        greedy = order is None or keep is None or final is None
        scaled = adjusted if greedy else adjusted / self.params.temperature
        ids = torch.topk(scaled, top_n).indices if allowed is not None or greedy else order[:top_n]  # type: ignore[index]
        raw = (logits[ids] - log_z).exp().tolist()
        scaled_probs = (scaled[ids] - torch.logsumexp(scaled, dim=-1)).exp().tolist()
        allowed_ids = [True] * top_n if allowed is None else allowed[ids].tolist()
        token_ids = ids.tolist()
        if greedy:
            best = next((r for r, ok in enumerate(allowed_ids) if ok), -1)
            removed = [
                None if r == best else "grammar" if not allowed_ids[r] else "greedy" for r in range(len(token_ids))
            ]
            finals = [1.0 if r == best else 0.0 for r in range(len(token_ids))]
            kept = 1
        else:
            assert order is not None and keep is not None and final is not None
            where = {int(t): r for r, t in enumerate(order.tolist())}
            names = (None, "top_k", "top_p", "min_p", "grammar")
            keeps, final_list = keep.tolist(), final.tolist()
            removed = [
                (
                    "grammar"
                    if not allowed_ids[r]
                    else names[keeps[where[t]]]
                    if t in where
                    else "top_k"
                    if self.params.top_k
                    else None
                )
                for r, t in enumerate(token_ids)
            ]
            finals = [final_list[where[t]] if t in where and allowed_ids[r] else 0.0 for r, t in enumerate(token_ids)]
            kept = self._kept(keep, logits.shape[0] - cut)
        candidates = [
            Candidate(
                token_id=t,
                raw_prob=raw[r],
                adjusted_prob=scaled_probs[r],
                removed_by=removed[r],
                final_prob=finals[r],
                bias=self._bias_map.get(t, 0.0),
            )
            for r, t in enumerate(token_ids)
        ]
        return SamplingDetail(candidates=candidates, draw=draw, kept=kept, eos_prob=eos, grammar_cut=cut)

    def _kept(self, keep: Tensor, vocab: int) -> int:
        """How many tokens stayed in after the filters (the whole tail too, when no filter reached it)."""
        kept = int((keep == 0).sum())
        p = self.params
        if kept == keep.shape[0] and not p.top_k and p.top_p >= 1.0 and p.min_p == 0.0:
            return vocab
        return kept
