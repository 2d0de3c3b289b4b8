"""The engine: prompt ids in, generated ids out, as a generator of trace events.

It knows nothing about text. Generation is split into prefill (the whole prompt in one
pass), decode_one (one new token through the cached model) and sample; the generator
does no work until the consumer asks for the next event, so a consumer that stops
(a stop string matched, a client left) stops the model within one token.
"""

from __future__ import annotations

import time
from typing import Generator, Sequence

import torch
from torch import Tensor

from inference.model import KVCache, Transformer
from inference.probe import LayerProbe
from inference.sampling import Sampler, SamplingParams
from inference.trace import ForwardStep, LayerDetail, Sampled, TraceLevel

DETAIL_TOP_N = 10  # candidates explained per sampling decision at summary level and above


class Engine:
    def __init__(self, model: Transformer, stop_ids: frozenset[int]) -> None:
        self.model = model
        self.stop_ids = stop_ids
        self.device = model.token_embd.weight.device

    def prefill(self, cache: KVCache, ids: Sequence[int], probe: LayerProbe | None = None) -> Tensor:
        """Run the whole prompt in one pass; return the logits [V] for the next token."""
        tokens = torch.tensor([list(ids)], device=self.device)  # [1, T]
        positions = torch.arange(len(ids), device=self.device)[None]  # [1, T]
        return self.model(tokens, positions, cache, probe)[0]

    def decode_one(self, cache: KVCache, token: int, position: int, probe: LayerProbe | None = None) -> Tensor:
        """Feed one token at `position`; return the logits [V] for the token after it."""
        tokens = torch.tensor([[token]], device=self.device)  # [1, 1]
        positions = torch.tensor([[position]], device=self.device)  # [1, 1]
        return self.model(tokens, positions, cache, probe)[0]

    @torch.inference_mode()
    def inspect(self, ids: Sequence[int]) -> LayerDetail:
        """The full-level look at the last position of `ids`, recomputed from scratch.

        Lets a page ask, after the fact, for the attention of any token of a finished run
        (which was traced at summary level, or beyond the full level's position budget).
        """
        probe = LayerProbe()
        self.prefill(self.model.new_cache(1, len(ids)), ids, probe)
        return probe.detail(self.model)

    @torch.inference_mode()
    def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, level: TraceLevel = TraceLevel.OFF
    ) -> Generator[ForwardStep | Sampled, None, None]:
        """Yield a ForwardStep per pass (summary and full only) and a Sampled per generated token."""
        sampler = Sampler(params, self.model.config.vocab_size, prompt_ids, self.stop_ids)
        cache = self.model.new_cache(1, len(prompt_ids) + params.max_tokens)
        traced = level != TraceLevel.OFF
        detail_top_n = DETAIL_TOP_N if traced else 0
        position = len(prompt_ids)

        probe = LayerProbe() if level == TraceLevel.FULL else None
        started = time.perf_counter()
        logits = self.prefill(cache, prompt_ids, probe)
        if traced:
            yield self._step_event(0, "prefill", 0, len(prompt_ids), started, probe)
        for step in range(1, params.max_tokens + 1):
            started = time.perf_counter()
            sample = sampler.sample(logits.float().cpu(), detail_top_n)
            is_stop = sample.token_id in self.stop_ids
            yield Sampled(
                t=time.perf_counter(),
                step=step,
                token_id=sample.token_id,
                logprob=sample.logprob,
                rank=sample.rank,
                is_stop=is_stop,
                duration=time.perf_counter() - started,
                top_logprobs=sample.top_logprobs,
                detail=sample.detail,
            )
            if is_stop or step == params.max_tokens:
                return
            probe = LayerProbe() if level == TraceLevel.FULL else None
            started = time.perf_counter()
            logits = self.decode_one(cache, sample.token_id, position, probe)
            position += 1
            if traced:
                yield self._step_event(step, "decode", position - 1, 1, started, probe)

    def _step_event(
        self, step: int, phase: str, position: int, n_tokens: int, started: float, probe: LayerProbe | None
    ) -> ForwardStep:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # honest clocks: wait for the kernels, not just their launch
        ended = time.perf_counter()
        return ForwardStep(
            t=ended,
            step=step,
            phase=phase,
            position=position,
            n_tokens=n_tokens,
            kv_length=position + n_tokens,
            duration=ended - started,
            detail=probe.detail(self.model) if probe is not None else None,
        )
