"""What a saved benchmark result may hold, checked on save: one typed model of the page's runs, lanes and settings.

The page sends what it measured; anyone with the link sees it again and exports it, so a result is validated before
it is kept (the same hardened JSON reader as the API, then these models), and only the fields named here are kept.
Results kept before this check are read through `lanes_of`, which skips what does not fit.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_RUNS = 100  # the page's own limits: runs per lane, lanes, timings per run
MAX_LANES = 4
MAX_POINTS = 100_000
Milliseconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Text = Annotated[str, Field(max_length=100_000)]


class Kept(BaseModel):
    """Extra fields are dropped, not kept: a result holds only what the page draws and exports."""

    model_config = ConfigDict(extra="ignore")


class Run(Kept):
    status: int = 0
    error: Text = ""
    ttft_ms: Milliseconds | None = None
    e2e_ms: Milliseconds | None = None
    tokens: Annotated[int, Field(ge=0)] = 0
    chunks: list[Milliseconds] = Field(default_factory=list, max_length=MAX_POINTS)
    chunk_tokens: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=MAX_POINTS)
    itls: list[Milliseconds] = Field(default_factory=list, max_length=MAX_POINTS)
    text: Text = ""
    mean_itl_ms: Milliseconds | None = None
    tokens_per_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    server_ttft_ms: Milliseconds | None = None
    server_itl_ms: Milliseconds | None = None
    gateway_ms: Milliseconds | None = None  # the gateway's own time on the request (roundtrip_timings)
    gateway_chunk_ms: Milliseconds | None = None  # per chunk passed on from an upstream server
    upstream: Annotated[str, Field(max_length=200)] = ""  # the upstream server that answered, if any
    request_id: Annotated[str, Field(max_length=100)] = ""


class Lane(Kept):
    name: Annotated[str, Field(max_length=200)] = ""
    model: Annotated[str, Field(max_length=200)] = ""
    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] | None = None
    maxTokens: Annotated[int, Field(ge=1)] | None = None
    runs: list[Run] = Field(default_factory=list, max_length=MAX_RUNS)


class Settings(Kept):
    lanes: list[Lane] = Field(default_factory=list, max_length=MAX_LANES)
    prompt: Text = ""
    runs: Annotated[int, Field(ge=1, le=MAX_RUNS)] = 1
    concurrency: Annotated[int, Field(ge=1, le=16)] = 1


class Result(Kept):
    title: Annotated[str, Field(max_length=120)] = "benchmark"
    settings: Settings
    lanes: list[Lane] = Field(max_length=MAX_LANES)


def validate(data: dict[str, Any]) -> Result:
    """ValueError naming the first field that does not fit (`lanes[0].runs[2].ttft_ms: ...`)."""
    try:
        return Result.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".")
        raise ValueError(f"{where or 'the result'}: {error['msg']}") from None


def lanes_of(raw: Any) -> list[dict[str, Any]]:
    """A stored result's lanes, each as a valid Lane's fields; whatever does not fit is skipped."""
    lanes = []
    for lane in raw if isinstance(raw, list) else []:
        try:
            lanes.append(Lane.model_validate(lane).model_dump())
        except ValidationError:
            continue
    return lanes


def spreadsheet_safe(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: a string starting with =, +, -, @, a tab or a carriage return would run
    as a formula, so it gains a leading apostrophe (OWASP's advice); numbers stay numbers."""
    if isinstance(value, str) and value.startswith(("=", "+", "-", "@", "\t", "\r")):
        return "'" + value
    return value
