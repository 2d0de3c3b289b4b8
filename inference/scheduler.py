"""The engine: every step, one batched forward for every running sequence.

In the shape of vLLM's scheduler: `add` a request, `abort` one, `step` the whole batch.
A step admits waiting requests while the KV-cache budget and the batch limit allow
(each is charged its prompt plus every token it may generate, so a running sequence
never runs out of room), feeds one decode token per running sequence plus a bounded
chunk of prompt for newcomers (a long prompt is prefilled over several steps, so it
never freezes the others' streams), samples every row with its own parameters, and lets
finished or aborted sequences leave, freeing their slot. A prompt's leading blocks come
from the prefix cache when an earlier request computed them.

The scheduler knows nothing about text: prompts arrive as ids; each sequence's own
state (`inference.sequence`) turns its tokens into text and trace events.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from inference.batch import Chunk
from inference.errors import InferenceError, InvalidRequestError
from inference.kv_cache import round_capacity
from inference.model import ForwardProbe, Transformer
from inference.params import SamplingParams
from inference.prefix_cache import PrefixCache
from inference.probe import LayerProbe, PromptMatrixProbe, lens_layers
from inference.sampling import Sample, Sampler, summarize
from inference.sequence import DETAIL_TOP_N, Phase, SequenceRequest, SequenceState
from inference.step_cost import StepCost
from inference.trace import BatchStep, LayerDetail, TraceEvent, TraceLevel

GIB = 1024**3
SHRINK_SLACK_BYTES = GIB // 4  # spare KV cache kept while sequences run (see `Scheduler._shrink`)


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int = 32  # sequences in one forward
    max_waiting: int = 64  # requests queued while every slot is taken; beyond that `add` refuses
    kv_budget_bytes: int = 2 * GIB  # the running sequences' KV cache may not grow past this
    prefill_chunk: int = 128  # prompt tokens per step, shared by the newcomers
    prefill_chunk_decoding: int = 4  # ...and at least this many per newcomer while other sequences decode, so that a
    # crowd of newcomers all make progress
    decode_gap_stretch: float | None = (
        1.75  # ...and beyond that, while other sequences decode, only as many prompt tokens
    )
    # as keep the step within this many one-row decode steps (by the measured cost of a row, `inference.step_cost`):
    # a step costs about its row count, and its time is every decoding stream's gap between two tokens. None: no more.
    idle_kv_bytes: int = GIB // 8  # KV cache kept while nothing runs, so the next request need not allocate it again
    prefix_cache_bytes: int = GIB // 8  # 0 turns the prefix cache off
    prefix_block: int = 16  # tokens per prefix-cache block (vLLM's default): a short system prompt fills one


class QueueFullError(InferenceError):
    """Every slot is taken and the waiting queue is full: try again shortly."""

    def __init__(self, waiting: int) -> None:
        super().__init__(f"The server is busy: {waiting} requests are already waiting; retry shortly.")
        self.waiting = waiting


class KVBudgetExceededError(InvalidRequestError):
    """A request that could never run: its prompt and max_tokens alone need more KV cache than the budget."""

    def __init__(self, positions: int, budget_positions: int) -> None:
        super().__init__(
            f"This request needs room for {positions} tokens in the KV cache, but this server's budget holds"
            f" {budget_positions}; lower max_tokens or shorten the messages.",
            param="max_tokens",
        )


@dataclass
class SequenceOutput:
    """What one sequence produced in a step; `done` when it left the scheduler."""

    request_id: str
    events: list[TraceEvent] = field(default_factory=list)
    done: bool = False
    error: Exception | None = None
    cancelled: bool = False


@dataclass(frozen=True)
class SchedulerStats:
    running: int
    waiting: int
    paused: int
    kv_bytes: int  # held by the running sequences (the cache may hold spare slots beyond these)
    kv_budget_bytes: int
    prefix_cache_bytes: int
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    steps: int

    @property
    def kv_usage(self) -> float:
        return self.kv_bytes / self.kv_budget_bytes if self.kv_budget_bytes else 0.0


class Scheduler:
    def __init__(
        self,
        model: Transformer,
        stop_ids: frozenset[int],
        token_bytes: Sequence[bytes],
        config: SchedulerConfig = SchedulerConfig(),
    ) -> None:
        self.model = model
        self.stop_ids = stop_ids
        self.token_bytes = token_bytes
        self.config = config
        self.device = model.device
        with torch.inference_mode():
            self.cache = model.new_cache(0, 0)
        self.prefix_cache = PrefixCache(config.prefix_cache_bytes, config.prefix_block)
        self.prefix_cache.allocate(self.cache)
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []  # running[i] holds cache slot i
        self._aborted: set[str] = set()
        self._known: dict[str, SequenceState] = {}
        self._leaving: list[tuple[SequenceState, bool]] = []  # finished in the last step; released by `finish_step`
        self._sharing: list[SequenceState] = []  # whose prompt the last step completed; shared by `finish_step`
        self.step_cost = StepCost()
        self.steps = 0
        self.last_batch: BatchStep | None = None  # the latest forward, for metrics

    # --- the interface -------------------------------------------------------------------------

    def add(self, request: SequenceRequest) -> SequenceState:
        """Queue a request; QueueFullError when the queue is full, KVBudgetExceededError when it could never fit."""
        if request.request_id in self._known:
            raise InvalidRequestError(f"request {request.request_id!r} is already running")
        queued = len(self.waiting) - (self.config.max_batch - len(self.running))  # beyond the free slots, they wait
        if queued >= self.config.max_waiting:
            raise QueueFullError(queued)
        state = SequenceState(request, self.model.config.vocab_size, self.stop_ids, self.token_bytes)
        if self._bytes(1, round_capacity(state.reserve)) > self.config.kv_budget_bytes:
            raise KVBudgetExceededError(state.reserve, self.config.kv_budget_bytes // self.cache.bytes_per_position)
        self.waiting.append(state)
        self._known[request.request_id] = state
        return state

    def abort(self, request_id: str) -> None:
        """Stop a request; it leaves (and frees its slot) at the start of the next step."""
        if request_id in self._known:
            self._aborted.add(request_id)

    def resume(self, request_id: str) -> None:
        """Step mode: let a paused sequence take part in steps again."""
        state = self._known.get(request_id)
        if state is not None:
            state.paused = False

    def ahead_of(self, request_id: str) -> int | None:
        """How many requests wait before this one; None once it runs (or is unknown)."""
        for position, state in enumerate(self.waiting):
            if state.request_id == request_id:
                return position
        return None

    @property
    def has_work(self) -> bool:
        """Whether `step` would do anything (so an idle engine thread can sleep instead of spinning)."""
        if self._aborted or self._leaving or self._sharing or any(not s.paused for s in self.running):
            return True
        return bool(self.waiting) and self._admissible(1) > 0

    def stats(self) -> SchedulerStats:
        running = len(self.running) - len(self._leaving)
        return SchedulerStats(
            running=running,
            waiting=len(self.waiting),
            paused=sum(s.paused for s in self.running),
            kv_bytes=self._bytes(running, self.cache.capacity),
            kv_budget_bytes=self.config.kv_budget_bytes,
            prefix_cache_bytes=self.prefix_cache.nbytes,
            prefix_queried_tokens=self.prefix_cache.queried_tokens,
            prefix_hit_tokens=self.prefix_cache.hit_tokens,
            steps=self.steps,
        )

    @torch.inference_mode()
    def step(self) -> list[SequenceOutput]:
        """Drop aborted sequences, admit waiting ones, run one batched forward and sample every row.

        The step's bookkeeping (finished sequences' prefixes into the prefix cache, their slots to the others, a
        completed prompt shared) is left to `finish_step`, which the caller runs once the outputs are on their way:
        when a batch of streams finishes together it costs several ms, and their last tokens need not wait for it.
        A caller that does not run it has it run at the start of the next step."""
        self.finish_step()
        outputs = self._drop_aborted()
        outputs += self._admit()
        rows = [s for s in self.running if not s.paused]
        if not rows:
            return outputs
        newcomers = [s for s in rows if s.phase == Phase.PREFILL]
        shares = iter(
            self._prompt_shares([len(s.prompt_ids) - s.computed for s in newcomers], len(rows) - len(newcomers))
        )
        fed = [state.next_tokens(next(shares) if state.phase == Phase.PREFILL else 1) for state in rows]
        scheduled = [(s, t) for s, t in zip(rows, fed) if t]
        chunks = [Chunk(s.slot or 0, s.computed, len(t)) for s, t in scheduled]
        samples = [s.phase == Phase.DECODE or s.computed + len(t) == len(s.prompt_ids) for s, t in scheduled]
        prefilling = sum(s.phase == Phase.PREFILL for s, _ in scheduled)
        prefill_tokens = sum(len(t) for s, t in scheduled if s.phase == Phase.PREFILL)
        plan = self.model.plan(chunks)
        sampled_tokens = [int(plan.last_tokens[i]) for i, wants in enumerate(samples) if wants]
        probes = {
            int(plan.last_tokens[i]): LayerProbe()
            for i, (s, _) in enumerate(scheduled)
            if samples[i] and s.request.level == TraceLevel.FULL
        }
        token_ids = torch.tensor([token for _, t in scheduled for token in t], device=self.device)
        started = time.perf_counter()
        logits = self.model(
            token_ids, plan, self.cache, probes, torch.tensor(sampled_tokens, device=self.device, dtype=torch.long)
        )
        logits = logits.cpu()  # also waits for the device: honest step clocks
        ended = time.perf_counter()
        self.step_cost.observe(len(token_ids), ended - started)
        self.steps += 1
        batch = BatchStep(
            ended,
            self.steps,
            len(scheduled),
            prefill_tokens,
            len(scheduled) - prefilling,
            ended - started,
            [s.request_id for s, _ in scheduled],
        )
        self.last_batch = batch
        summaries = summarize(logits)
        row = 0
        leaving: list[SequenceState] = []
        for i, (state, fed_tokens) in enumerate(scheduled):
            output = SequenceOutput(state.request_id)
            try:
                probe = probes.get(int(plan.last_tokens[i])) if samples[i] else None
                detail = probe.detail() if probe is not None else None
                output.events += state.forwarded(batch, len(fed_tokens), started, detail)
                if samples[i]:
                    output.events += state.sample(logits[row], summaries[row])
                    row += 1
            except Exception as exc:  # this request fails; the batch goes on
                output.error, output.done = exc, True
                state.phase = Phase.DONE
                leaving.append(state)
                outputs.append(output)
                continue
            if state.phase == Phase.DONE:
                output.done = True
                leaving.append(state)
            elif samples[i] and len(state.generated) == 1:  # its prompt is all in: share it with later requests
                self._sharing.append(state)
            outputs.append(output)
        self._leaving += [(state, state.finish_reason is not None) for state in leaving]
        return outputs

    @torch.inference_mode()
    def finish_step(self) -> None:
        """The last step's bookkeeping: share the prompts it completed, release the sequences that left (keeping a
        finished one's tokens in the prefix cache) and give spare memory back."""
        for state in self._sharing:
            if state.slot is not None:
                self.prefix_cache.insert(state.prompt_ids, self.cache, state.slot, len(state.prompt_ids))
        self._sharing.clear()
        for state, keep in self._leaving:
            self._release(state, keep)
        self._leaving.clear()
        self._shrink()

    def drop_all(self) -> list[str]:
        """Forget every sequence (after a forward that failed for all of them); their ids."""
        leaving = {s.request_id for s, _ in self._leaving}
        dropped = [s.request_id for s in self.running if s.request_id not in leaving] + [
            s.request_id for s in self.waiting
        ]
        self._leaving.clear()
        self._sharing.clear()
        self.running.clear()
        self.waiting.clear()
        self._known.clear()
        self._aborted.clear()
        self.cache.resize(0, 0, [])
        return dropped

    @torch.inference_mode()
    def inspect(self, ids: Sequence[int]) -> LayerDetail:
        """The full-level look at the last position of `ids`, recomputed from scratch in a cache of its own.

        Lets a page ask, after the fact, for the attention of any token of a finished run
        (which was traced at summary level, or beyond the live position budget).
        """
        probe = LayerProbe(lens_layers(self.model.config.n_layers, None))
        self._last_logits(ids, {len(ids) - 1: probe})
        return probe.detail()

    @torch.inference_mode()
    def prompt_attention(self, ids: Sequence[int], layer: int) -> Tensor:
        """The prefill's full token x token attention at `layer` for `ids`: [H, T, T], recomputed in a cache of its
        own (a live trace keeps the row of the token each pass fed last; this is every row, on demand)."""
        c = self.model.config
        if not 0 <= layer < c.n_layers:
            raise InvalidRequestError(f"'layer' must be 0 to {c.n_layers - 1}", "layer")
        probe = PromptMatrixProbe(layer, c.n_heads, len(ids))
        self._last_logits(ids, dict.fromkeys(range(len(ids)), probe))
        return probe.weights

    @torch.inference_mode()
    def resample(self, prompt_ids: Sequence[int], generated: Sequence[int], params: SamplingParams) -> Sample:
        """What if a past step had been sampled otherwise: the next token after `prompt_ids` + `generated`,
        drawn with `params` (penalties see `generated` as the output so far) from that step's real logits,
        recomputed from scratch; explained as the sampling stage shows a live step."""
        ids = [*prompt_ids, *generated]
        sampler = Sampler(params, self.model.config.vocab_size, prompt_ids, self.stop_ids)
        for token in generated:
            sampler.observe(token)
        return sampler.sample(self._last_logits(ids, {}), DETAIL_TOP_N)

    def _last_logits(self, ids: Sequence[int], probes: Mapping[int, ForwardProbe]) -> Tensor:
        """float32 logits [V] after `ids`, computed in a cache of their own (the running batch is untouched)."""
        cache = self.model.new_cache(1, len(ids))
        plan = self.model.plan([Chunk(0, 0, len(ids))])
        return self.model(torch.tensor(list(ids), device=self.device), plan, cache, dict(probes))[0].float().cpu()

    # --- admission and slots -----------------------------------------------------------------

    def _prompt_shares(self, needs: list[int], decoding: int) -> list[int]:
        """Prompt tokens for each newcomer this step (`needs`: what each has left, in arrival order) beside `decoding`
        decode rows. Alone, newcomers share `prefill_chunk`, first come first served. Beside decoding streams each
        gets `prefill_chunk_decoding`, and the earliest more, as far as the step stays within `decode_gap_stretch`
        one-row steps: beyond those few tokens each, a long prompt lengthens the others' gaps between tokens only
        within that bound, and the first newcomer reaches its first token soonest."""
        if not needs:  # the usual decode step: nothing to size, and no fit to consult
            return []
        chunk = self.config.prefill_chunk
        least = self.config.prefill_chunk_decoding if decoding else chunk
        budget = chunk if not decoding else min(chunk, max(least * len(needs), self._rows_beside(decoding)))
        shares = []
        for i, need in enumerate(needs):
            later = least * (len(needs) - i - 1)  # what the newcomers behind this one are owed
            share = min(need, max(min(least, budget), budget - later))
            shares.append(share)
            budget -= share
        return shares

    def _rows_beside(self, decoding: int) -> int:
        """Prompt tokens a step may carry beside `decoding` decode rows within `decode_gap_stretch` one-row steps;
        0 until the step cost is measured."""
        stretch = self.config.decode_gap_stretch
        rows = self.step_cost.rows_within(stretch) if stretch is not None else None
        return max(0, (rows or 0) - decoding)

    def _bytes(self, slots: int, capacity: int) -> int:
        return slots * capacity * self.cache.bytes_per_position

    def _admissible(self, limit: int) -> int:
        """How many of the first `limit` waiting requests fit beside the running ones now."""
        capacity = max((s.reserve for s in self.running), default=0)
        count = 0
        for state in list(self.waiting)[:limit]:
            if len(self.running) + count + 1 > self.config.max_batch or self._awaits_sibling(state):
                break
            capacity = max(capacity, state.reserve)
            if self._bytes(len(self.running) + count + 1, round_capacity(capacity)) > self.config.kv_budget_bytes:
                break
            count += 1
        return count

    def _slots_to_allocate(self, slots: int, capacity: int) -> int:
        """At least `slots`, and room for as many again (within the batch limit, the KV budget and the spare memory
        `_shrink` would keep).

        Growing the cache reallocates and copies all of it while every stream waits (tens of ms at 8
        sequences); a burst of arrivals that grew it one slot at a time paid that once per newcomer.
        """
        per_slot = max(1, self._bytes(1, capacity))
        roomy = min(self.config.max_batch, max(slots, 2 * self.cache.slots, 4), slots + SHRINK_SLACK_BYTES // per_slot)
        return max(slots, min(roomy, self.config.kv_budget_bytes // per_slot))

    def _admit(self) -> list[SequenceOutput]:
        count = self._admissible(len(self.waiting))
        if not count:
            return []
        newcomers = [self.waiting.popleft() for _ in range(count)]
        slots = len(self.running) + count
        capacity = round_capacity(max(s.reserve for s in self.running + newcomers))
        if slots > self.cache.slots or capacity > self.cache.capacity:
            self.cache.resize(self._slots_to_allocate(slots, capacity), capacity, [s.computed for s in self.running])
        now = time.perf_counter()
        outputs = []
        for state in newcomers:
            slot = len(self.running)
            self.running.append(state)
            sibling = self._sibling(state)
            if (
                sibling is not None and sibling.slot is not None
            ):  # copy the other choice's prompt, all but its last token
                shared = len(state.prompt_ids) - 1
                k, v = self.cache.read(sibling.slot, 0, shared)
                self.cache.load(slot, 0, k, v)
                outputs.append(SequenceOutput(state.request_id, state.admit(slot, shared, now)))
                continue
            hit = self.prefix_cache.lookup(state.prompt_ids, len(state.prompt_ids) - 1)
            if hit.k is not None and hit.v is not None:
                self.cache.load(slot, 0, hit.k, hit.v)
            outputs.append(SequenceOutput(state.request_id, state.admit(slot, hit.tokens, now)))
        return outputs

    def _sibling(self, state: SequenceState) -> SequenceState | None:
        """The running choice whose prompt this one shares (n > 1), if it is still here."""
        other = self._known.get(state.request.shares_prompt_with or "")
        return other if other is not None and other.slot is not None else None

    def _awaits_sibling(self, state: SequenceState) -> bool:
        """A later choice waits while the first is queued or still prefilling (then it copies the finished prompt)."""
        name = state.request.shares_prompt_with
        other = self._known.get(name) if name else None
        return other is not None and (other.slot is None or other.computed < len(state.prompt_ids) - 1)

    def _drop_aborted(self) -> list[SequenceOutput]:
        if not self._aborted:
            return []
        outputs = []
        for state in [s for s in self.waiting if s.request_id in self._aborted]:
            self.waiting.remove(state)
            self._known.pop(state.request_id, None)
            outputs.append(SequenceOutput(state.request_id, done=True, cancelled=True))
        for state in [s for s in self.running if s.request_id in self._aborted]:
            self._release(state, keep=True)
            outputs.append(SequenceOutput(state.request_id, done=True, cancelled=True))
        self._aborted.clear()
        self._shrink()
        return outputs

    def _release(self, state: SequenceState, keep: bool) -> None:
        """Free the sequence's slot (keeping its computed prefix for later requests when `keep`);
        the last running sequence moves into the hole so slots stay 0..n-1."""
        slot = state.slot
        self._known.pop(state.request_id, None)
        self._aborted.discard(state.request_id)
        if slot is None:
            return
        if keep and state.computed:
            self.prefix_cache.insert(state.ids, self.cache, slot, state.computed)
        last = len(self.running) - 1
        if slot != last:
            mover = self.running[last]
            self.cache.move(last, slot, mover.computed)
            mover.slot = slot
            self.running[slot] = mover
        self.running.pop()
        state.slot = None

    def _shrink(self) -> None:
        """Give memory back once the cache is far bigger than the running sequences need, and when nothing runs keep
        at most `idle_kv_bytes` of it.

        Shrinking copies every running sequence's keys and values while all of them wait (30 ms at a
        handful of sequences on 2 cores), so a burst's spare slots are kept until it is over, unless they
        are a lot of memory. Allocating is not free either (3-5 ms for 4 slots of the default model, 14 ms
        to grow to 8, fresh pages each time), so an idle engine keeps a small cache for the next request.
        """
        if not self.running:
            if self.cache.nbytes > self.config.idle_kv_bytes:
                slots = min(self.cache.slots, self.config.idle_kv_bytes // max(1, self._bytes(1, self.cache.capacity)))
                self.cache.resize(slots, self.cache.capacity if slots else 0, [])
            return
        capacity = round_capacity(max(s.reserve for s in self.running))
        if self.cache.nbytes > 4 * self._bytes(len(self.running), capacity) + SHRINK_SLACK_BYTES:
            self.cache.resize(len(self.running), capacity, [s.computed for s in self.running])
