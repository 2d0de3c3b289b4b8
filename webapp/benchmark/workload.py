"""What the benchmark sends and when: prompts of a given token length (or from a file), output lengths,
and arrival times (a fixed number of clients, or a request rate).

Synthetic prompts are built to an exact token count where the server can count for us (`/v1/tokenize`,
which Roundtrip serves and llama.cpp's `/tokenize` approximates); elsewhere they are built at about
one token per word. A dataset file is JSONL: `{"prompt": ...}` per line, or ShareGPT records
(`{"conversations": [{"from": "human", "value": ...}, ...]}`, the first human turn is used).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx

from webapp.benchmark.client import Endpoint

WORDS = [
    "time",
    "river",
    "light",
    "story",
    "city",
    "garden",
    "music",
    "ocean",
    "mountain",
    "window",
    "letter",
    "bridge",
    "morning",
    "winter",
    "signal",
    "harbor",
    "engine",
    "forest",
    "library",
    "market",
    "voice",
    "paper",
    "silver",
    "lantern",
    "journey",
]


@dataclass(frozen=True)
class Length:
    """A token count: fixed, or drawn uniformly from low..high (written `low:high`)."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str) -> Length:
        low, _, high = text.partition(":")
        lo, hi = int(low), int(high or low)
        if lo < 1 or hi < lo:
            raise ValueError(f"{text!r}: expected N or LOW:HIGH with 1 <= LOW <= HIGH")
        return cls(lo, hi)

    def draw(self, rng: random.Random) -> int:
        return self.low if self.low == self.high else rng.randint(self.low, self.high)


@dataclass(frozen=True)
class Item:
    prompt: str
    max_tokens: int


def synthetic_prompt(rng: random.Random, words: int, index: int) -> str:
    body = " ".join(rng.choice(WORDS) for _ in range(max(1, words - 6)))
    return f"Request {index}: continue this text. {body}"


async def exact_prompt(
    client: httpx.AsyncClient, endpoint: Endpoint, rng: random.Random, tokens: int, index: int
) -> str:
    """A prompt of exactly `tokens` tokens by the server's own tokenizer, when it has /v1/tokenize; else ~1 token per
    word."""
    text = synthetic_prompt(rng, tokens, index)
    try:
        for _ in range(4):  # words are mostly one token: adjust by the difference until it matches
            r = await client.post(
                f"{endpoint.url}/tokenize", json={"model": endpoint.model, "text": text}, headers=endpoint.headers
            )
            if r.status_code != 200:
                break
            count = int(r.json()["count"])
            if count == tokens:
                break
            words = text.split(" ")
            text = (
                " ".join(words[: len(words) - (count - tokens)])
                if count > tokens
                else text + " " + " ".join(rng.choice(WORDS) for _ in range(tokens - count))
            )
    except (httpx.HTTPError, KeyError, ValueError):
        pass
    return text


def dataset_prompts(path: Path) -> list[str]:
    prompts = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if "prompt" in record:
            prompts.append(str(record["prompt"]))
        elif "conversations" in record:
            human = next(
                (turn.get("value") for turn in record["conversations"] if turn.get("from") in ("human", "user")), None
            )
            if human:
                prompts.append(str(human))
    if not prompts:
        raise ValueError(f"{path}: no prompts found (expected JSONL with 'prompt' or ShareGPT 'conversations')")
    return prompts


async def build_items(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    count: int,
    prompt_tokens: Length,
    max_tokens: Length,
    seed: int,
    dataset: Path | None = None,
) -> list[Item]:
    rng = random.Random(seed)
    pool = dataset_prompts(dataset) if dataset else None
    items = []
    for i in range(count):
        prompt = rng.choice(pool) if pool else await exact_prompt(client, endpoint, rng, prompt_tokens.draw(rng), i)
        items.append(Item(prompt, max_tokens.draw(rng)))
    return items


def arrival_gaps(rate: float, burstiness: float, seed: int) -> Iterator[float]:
    """Seconds between requests at `rate` per second: gamma-distributed with shape `burstiness` (1 = Poisson;
    below 1 burstier, above 1 more regular), the mean always 1 / rate."""
    rng = random.Random(seed)
    while True:
        yield rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
