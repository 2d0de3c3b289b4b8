"""The scheduler: which sequences run in the next forward, with which tokens, and what their results mean.

In the shape of vLLM's scheduler: `add` a request, `abort` one; each engine step (`inference.engine`) is
`schedule()` → the model runs the plan (`inference.model_runner`) → `update_from_output()`. Scheduling admits waiting
requests while the KV-cache budget and the batch limit allow (each is charged its prompt plus every token it may
generate, so a running sequence never runs out of room), feeds one decode token per running sequence plus a bounded
chunk of prompt for newcomers (a long prompt is prefilled over several steps, so it never freezes the others' streams),
and the update samples every row with its own parameters and lets finished or aborted sequences leave, freeing their
slot. A prompt's leading blocks come from the prefix cache when an earlier request computed them.

The scheduler knows nothing about text and runs no model: prompts arrive as ids; each sequence's own state
(`inference.sequence`) turns its tokens into text and trace events; the KV cache is handed in.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from inference.errors import InferenceError, InvalidRequestError
from inference.kv_cache import SlotCache, round_capacity
from inference.outputs import ModelOutput, ScheduledChunk, SchedulerOutput, SequenceOutput
from inference.prefix_cache import PrefixCache
from inference.sequence import Phase, SequenceRequest, SequenceState
from inference.step_cost import StepCost
from inference.trace import BatchStep

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
    # ...and beyond that, while other sequences decode, only as many prompt tokens
    decode_gap_stretch: float | None = 1.75
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
    """`cache`: the KV cache the model runs in (slots are handed out here); `vocab_size`, `stop_ids` and
    `token_bytes`: what each sequence's sampler and detokenizer need."""

    def __init__(
        self,
        cache: SlotCache,
        vocab_size: int,
        stop_ids: frozenset[int],
        token_bytes: Sequence[bytes],
        config: SchedulerConfig = SchedulerConfig(),
    ) -> None:
        self.cache = cache
        self.vocab_size = vocab_size
        self.stop_ids = stop_ids
        self.token_bytes = token_bytes
        self.config = config
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
        state = SequenceState(request, self.vocab_size, self.stop_ids, self.token_bytes)
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
            state.resume()

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
    def schedule(self) -> SchedulerOutput:
        """The next forward: drop aborted sequences, admit waiting ones, and give each running sequence its tokens (a
        decode token, or a share of the prompt for newcomers). Runs the last step's bookkeeping first, if the caller
        left it (see `finish_step`)."""
        self.finish_step()
        outputs = self._drop_aborted()
        outputs += self._admit()
        rows = [s for s in self.running if not s.paused]
        newcomers = [s for s in rows if s.phase == Phase.PREFILL]
        shares = iter(
            self._prompt_shares([len(s.prompt_ids) - s.computed for s in newcomers], len(rows) - len(newcomers))
        )
        chunks = []
        for state in rows:
            tokens = state.next_tokens(next(shares) if state.phase == Phase.PREFILL else 1)
            if tokens:
                samples = state.phase == Phase.DECODE or state.computed + len(tokens) == len(state.prompt_ids)
                chunks.append(ScheduledChunk(state, tokens, samples))
        return SchedulerOutput(chunks, outputs)

    def update_from_output(self, scheduled: SchedulerOutput, result: ModelOutput) -> list[SequenceOutput]:
        """What the forward means for each sequence in it: its forward and sampling events, a token from its row of
        logits, and whether it is done. A sequence whose update fails ends with the error; the batch goes on.

        The step's bookkeeping (finished sequences' prefixes into the prefix cache, their slots to the others, a
        completed prompt shared) is left to `finish_step`, which the caller runs once the outputs are on their way:
        when a batch of streams finishes together it costs several ms, and their last tokens need not wait for it."""
        self.step_cost.observe(scheduled.n_tokens, result.duration)
        self.steps += 1
        batch = BatchStep(
            result.ended,
            self.steps,
            len(scheduled.chunks),
            scheduled.prefill_tokens,
            scheduled.decode_rows,
            result.duration,
            [c.state.request_id for c in scheduled.chunks],
        )
        self.last_batch = batch
        outputs, leaving, rows = [], [], iter(range(len(scheduled.chunks)))
        for chunk, detail in zip(scheduled.chunks, result.details):
            state, output = chunk.state, SequenceOutput(chunk.state.request_id)
            outputs.append(output)
            row = next(rows) if chunk.samples else -1  # its row of logits: the sampling rows come in chunk order
            try:
                output.events += state.forwarded(batch, len(chunk.tokens), result.started, detail)
                if chunk.samples:
                    output.events += state.sample(result.logits[row], result.summaries[row])
            except Exception as exc:  # this request fails; the batch goes on
                output.error, state.phase = exc, Phase.DONE
            if state.phase == Phase.DONE:
                output.done = True
                leaving.append(state)
            elif chunk.samples and len(state.generated) == 1:  # its prompt is all in: share it with later requests
                self._sharing.append(state)
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
            if sibling is not None and sibling.slot is not None:
                # copy the other choice's prompt, all but its last token
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
