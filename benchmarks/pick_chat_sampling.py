"""How the chat page's sampling default was chosen: candidate settings tried on the model itself, answers scored.

    python benchmarks/pick_chat_sampling.py [--seeds 3] [--max-tokens 512]

Starts `manage.py serve` (SmolLM2-135M-Instruct), asks a mix of everyday chat questions (facts, lists, a recipe,
code, an explanation, a story, advice) under each candidate setting, several seeds each, up to `--max-tokens`
tokens, and scores the answers on what a chatter notices first in a small model:

- ended: the share of answers that reached the end-of-turn token (the rest ran to the limit, usually looping);
- repeated: the share of word 4-grams in an answer that already occurred earlier in it (loops and stutter);
- distinct: across seeds, how different the answers to one question are (1 - their mean word-set overlap):
  0 is one answer every time, as greedy gives;
- right: for the questions with one right answer (a capital, a count, why the sky is blue), the share of answers
  that say it ("8" counts as "eight");
- words: the mean answer length.

It prints a table per setting and the answers of the first seed, to read. The page's default is the setting
with the most answers that end, the least repetition and the facts still right; greedy stays one click away
(`docs/page.md`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx2 as httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from benchmarks.bench_serving import roundtrip_server  # noqa: E402

QUESTIONS = [
    "What's the capital of India?",
    "Give me three tips for sleeping better.",
    "How do I make pancakes? List the ingredients and the steps.",
    "Write a Python function that checks whether a number is prime.",
    "Explain what a black hole is to a ten-year-old.",
    "Write a short story about a cat who learns to fly.",
    "What are the pros and cons of working from home?",
    "Why is the sky blue?",
    "What's the capital of France?",
    "How many legs does a spider have?",
]
# Questions with one right answer: an answer is right when it says this (case aside).
FACTS = {
    "What's the capital of India?": "new delhi",
    "What's the capital of France?": "paris",
    "How many legs does a spider have?": "eight",
    "Why is the sky blue?": "scatter",
}
CANDIDATES: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0},
    "greedy rep1.1": {"temperature": 0, "repetition_penalty": 1.1},
    "t0.2 top_p0.9": {"temperature": 0.2, "top_p": 0.9},
    "t0.2 top_p0.9 rep1.1": {"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.1},
    "t0.3 top_p0.9 rep1.1": {"temperature": 0.3, "top_p": 0.9, "repetition_penalty": 1.1},
    "t0.6 top_p0.9 rep1.1": {"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.1},
    "t0.8 top_k40 top_p0.95 min_p0.05": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05},
    "t1.0": {"temperature": 1.0},
}
SYSTEM = "You are a helpful assistant."


def repeated_share(text: str) -> float:
    words = text.split()
    grams = [tuple(words[i : i + 4]) for i in range(len(words) - 3)]
    seen: set[tuple[str, ...]] = set()
    repeats = 0
    for gram in grams:
        repeats += gram in seen
        seen.add(gram)
    return repeats / len(grams) if grams else 0.0


def right(question: str, answer: str) -> bool:
    text = answer.lower().replace(" 8 ", " eight ")
    return FACTS[question] in text


def distinct(answers: list[str]) -> float:
    """1 - the mean Jaccard overlap of the answers' word sets, over every pair."""
    sets = [set(a.lower().split()) for a in answers]
    pairs = list(itertools.combinations(sets, 2))
    if not pairs:
        return 0.0
    return 1 - statistics.mean(len(a & b) / max(len(a | b), 1) for a, b in pairs)


async def ask(
    client: httpx.AsyncClient,
    url: str,
    key: str,
    question: str,
    params: dict[str, Any],
    seed: int,
    max_tokens: int,
    gate: asyncio.Semaphore,
) -> dict[str, Any]:
    body = {
        "model": "smollm2",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "seed": seed,
        **params,
    }
    async with gate:
        r = await client.post(f"{url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return {"text": choice["message"]["content"], "ended": choice["finish_reason"] == "stop"}


async def trial(
    url: str, key: str, settings: list[str], seeds: int, max_tokens: int
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    gate = asyncio.Semaphore(4)
    async with httpx.AsyncClient(timeout=600) as client:
        jobs = {
            (name, q, s): ask(client, url, key, q, params, 1000 + s, max_tokens, gate)
            for name, params in CANDIDATES.items()
            if name in settings
            for q in QUESTIONS
            for s in range(seeds)
        }
        done = await asyncio.gather(*jobs.values())
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for (name, q, _), answer in zip(jobs, done):
        out.setdefault(name, {}).setdefault(q, []).append(answer)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--show", action="store_true", help="print every setting's first-seed answers")
    parser.add_argument("--settings", help="only these candidates (comma-separated names from the table)")
    args = parser.parse_args()
    os.environ["ROUNDTRIP_ANONYMOUS_LIMITS"] = "{}"
    chosen = args.settings.split(",") if args.settings else list(CANDIDATES)
    with (
        tempfile.TemporaryDirectory(prefix="roundtrip-sampling-") as tmp,
        roundtrip_server(Path(tmp), [4], "") as target,
    ):
        results = asyncio.run(trial(target.url, target.key, chosen, args.seeds, args.max_tokens))
    print(f"\n{len(QUESTIONS)} questions x {args.seeds} seeds, up to {args.max_tokens} tokens, SmolLM2-135M-Instruct")
    print(f"{'setting':<36}{'ended':>8}{'repeated':>10}{'distinct':>10}{'right':>8}{'words':>8}")
    for name, by_question in results.items():
        answers = [a for group in by_question.values() for a in group]
        ended = sum(a["ended"] for a in answers) / len(answers)
        repeated = statistics.mean(repeated_share(a["text"]) for a in answers)
        spread = statistics.mean(distinct([a["text"] for a in group]) for group in by_question.values())
        words = statistics.mean(len(a["text"].split()) for a in answers)
        facts = [right(q, a["text"]) for q, group in by_question.items() if q in FACTS for a in group]
        print(f"{name:<36}{ended:>7.0%}{repeated:>10.1%}{spread:>10.2f}{sum(facts) / len(facts):>8.0%}{words:>8.0f}")
    if args.show:
        for name, by_question in results.items():
            print(f"\n=== {name}")
            for question, group in by_question.items():
                print(f"--- {question}\n{group[0]['text'][:600]}")


if __name__ == "__main__":
    main()
