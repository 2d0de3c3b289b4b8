"""One-shot questions the page asks the worker about a step of a finished run, through the same gateway as a turn.

"inspect": the full-level detail (attention, norms, logit lens) of one token, recomputed.
"prompt_attention": the prefill's full token x token attention at one layer (a live trace keeps one row per pass).
"merges": how BPE builds a word's tokens from its bytes, merge by merge, from the tokenizer's table.
"compare": one text read by two models side by side, each one's tokens and likeliest next tokens.
"resample": what if that step had been drawn with other settings — the step's real logits, recomputed from
the tokens before it, through the sampler with the new temperature, top-k, top-p, min-p or penalties.
Each answers with one frame ("inspection" / "prompt_attention" / "merges" / "comparison" / "resampled", or "error")
and leaves one usage row per model asked.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from visualizer.frames import CompareFrame, InspectFrame, MergesFrame, PromptAttentionFrame, ResampleFrame
from visualizer.runs import Visitor, error_frame
from webapp.api.protocol import parse
from webapp.catalog import ModelRoute
from webapp.gateway import client
from webapp.gateway.identity import identify_session
from webapp.gateway.lifecycle import Turn
from webapp.worker import wire


async def _ask(
    visitor: Visitor, endpoint: str, model: object, work: Callable[[Turn, ModelRoute], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """Authenticate the visitor, admit the model, run `work`; an error frame for any failure; always settled."""
    turn = Turn(endpoint, visitor.client_ip)
    try:
        turn.authenticated(
            identify_session(visitor.user_id, visitor.session_key, visitor.client_ip), time.perf_counter()
        )
        route = await turn.admit(str(model or "default"))
        return await work(turn, route)
    except Exception as exc:
        error = turn.fail(exc)
        return error_frame(error)
    finally:
        await turn.settle()


async def inspect(visitor: Visitor, frame: dict[str, Any]) -> dict[str, Any]:
    """The page asks for more: full-level detail of one token after the fact."""

    async def work(turn: Turn, route: ModelRoute) -> dict[str, Any]:
        asked: InspectFrame = parse(InspectFrame, frame)
        turn.usage.prompt_tokens = len(asked.ids)
        detail = await client.inspect(route, asked.ids)  # the worker checks each id against its vocabulary
        return {"type": "inspection", "step": asked.step, "detail": detail}

    return await _ask(visitor, "ws.inspect", frame.get("model"), work)


async def merges(visitor: Visitor, frame: dict[str, Any]) -> dict[str, Any]:
    """The BPE merges behind a word's tokens, from the model's own merge table."""

    async def work(turn: Turn, route: ModelRoute) -> dict[str, Any]:
        asked: MergesFrame = parse(MergesFrame, frame)
        steps = await client.merges(route, asked.text)
        turn.usage.prompt_tokens = sum(len(p.ids) for p in steps.pieces)
        return {"type": "merges", "text": asked.text, "pieces": steps.pieces, "tokenizer": steps.tokenizer}

    return await _ask(visitor, "ws.merges", frame.get("model"), work)


async def compare(visitor: Visitor, frame: dict[str, Any]) -> dict[str, Any]:
    """The same text read by two models: each side asked through the gateway as its own request (a frame the checks
    refuse is refused by the first, with its usage row, as any question's)."""
    models = frame.get("models")
    sides = []
    for index in range(2):

        async def work(turn: Turn, route: ModelRoute) -> dict[str, Any]:
            asked: CompareFrame = parse(CompareFrame, frame)
            view = await client.next_tokens(route, asked.text)
            turn.usage.prompt_tokens = len(view.ids)
            return {"type": "side", "model": route.id, "view": view}

        model = models[index] if isinstance(models, list) and index < len(models) else None
        side = await _ask(visitor, "ws.compare", model, work)
        if side["type"] == "error":
            return side
        sides.append({"model": side["model"], **wire.plain(side["view"])})
    return {"type": "comparison", "text": frame.get("text"), "sides": sides}


async def prompt_attention(visitor: Visitor, frame: dict[str, Any]) -> dict[str, Any]:
    """Every prompt position's attention at one layer, recomputed: the matrix the live trace has one row of."""

    async def work(turn: Turn, route: ModelRoute) -> dict[str, Any]:
        asked: PromptAttentionFrame = parse(PromptAttentionFrame, frame)
        turn.usage.prompt_tokens = len(asked.ids)
        # the worker checks the ids against its vocabulary and the layer against its depth
        attention = await client.prompt_attention(route, asked.ids, asked.layer)
        return {"type": "prompt_attention", "layer": asked.layer, "attention": attention}

    return await _ask(visitor, "ws.prompt_attention", frame.get("model"), work)


async def resample(visitor: Visitor, frame: dict[str, Any]) -> dict[str, Any]:
    """What if: one step drawn again with other sampling settings, on its real logits."""

    async def work(turn: Turn, route: ModelRoute) -> dict[str, Any]:
        asked: ResampleFrame = parse(ResampleFrame, frame)
        turn.usage.prompt_tokens = len(asked.prompt_ids) + len(asked.generated)
        event = await client.resample(route, asked.prompt_ids, asked.generated, asked.sampling(max_tokens=1))
        return {"type": "resampled", "step": asked.step, "event": event}

    return await _ask(visitor, "ws.resample", frame.get("model"), work)
