"""Run by tests/webapp/test_instructor.py in instructor's own virtual environment (instructor pins an older jiter than
the openai SDK this project tests with): extract a nested object N times with instructor's default mode and N times
with its streamed `create_partial`, and print one JSON line of what happened."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import instructor
import openai
from pydantic import BaseModel


class Address(BaseModel):
    city: str
    country: str


class Person(BaseModel):
    name: str
    age: int
    address: Address


PROMPT = "Extract the person: Ada Lovelace, 36, lived in London, England."
PARALLEL = 4  # the test server's ROUNDTRIP_MAX_BATCH (tests/conftest.py)


def main(base_url: str, key: str, runs: int) -> None:
    client = instructor.from_openai(openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120))
    messages = [{"role": "user", "content": PROMPT}]

    def extract(seed: int, streamed: bool) -> tuple[str, Any]:
        """One extraction, whole or streamed: ("whole" or "partial", the object) or ("error", what went wrong)."""
        asked = {"model": "smollm2", "messages": messages, "max_retries": 0, "temperature": 0.7, "seed": seed}
        try:
            if not streamed:
                return "whole", client.chat.completions.create(response_model=Person, **asked).model_dump()  # type: ignore[arg-type]
            last = None
            for update in client.chat.completions.create_partial(response_model=Person, stream=True, **asked):  # type: ignore[arg-type]
                last = update  # each update is the object so far; the last one is whole
            return "partial", Person.model_validate(last.model_dump() if last is not None else {}).model_dump()
        except Exception as exc:  # reported, counted by the test
            return "error", f"{'create_partial' if streamed else 'create'}: {type(exc).__name__}: {exc}"[:300]

    found: dict[str, list[Any]] = {"whole": [], "partial": [], "error": []}
    # As many at once as the test server batches (ROUNDTRIP_MAX_BATCH): each is still its own request and answer,
    # and twenty answers of some fifty tokens take a third of the time they took one after another.
    with ThreadPoolExecutor(PARALLEL) as pool:
        asks = [(seed, streamed) for seed in range(runs) for streamed in (False, True)]
        for kind, value in pool.map(lambda ask: extract(*ask), asks):
            found[kind].append(value)
    print(
        json.dumps(
            {
                "whole": found["whole"],
                "partial": found["partial"],
                "errors": found["error"],
                "instructor": instructor.__version__,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
