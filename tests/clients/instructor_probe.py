"""Run by tests/webapp/test_instructor.py in instructor's own virtual environment (instructor pins an older jiter than
the openai SDK this project tests with): extract a nested object N times with instructor's default mode and N times
with its streamed `create_partial`, and print one JSON line of what happened."""

from __future__ import annotations

import json
import sys

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


def main(base_url: str, key: str, runs: int) -> None:
    client = instructor.from_openai(openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120))
    messages = [{"role": "user", "content": PROMPT}]
    whole, partial, errors = [], [], []
    for seed in range(runs):
        asked = {"model": "smollm2", "messages": messages, "max_retries": 0, "temperature": 0.7, "seed": seed}
        try:
            whole.append(client.chat.completions.create(response_model=Person, **asked).model_dump())  # type: ignore[arg-type]
        except Exception as exc:  # reported, counted by the test
            errors.append(f"create: {type(exc).__name__}: {exc}"[:300])
        try:
            last = None
            for update in client.chat.completions.create_partial(response_model=Person, stream=True, **asked):  # type: ignore[arg-type]
                last = update  # each update is the object so far; the last one is whole
            partial.append(Person.model_validate(last.model_dump() if last is not None else {}).model_dump())
        except Exception as exc:
            errors.append(f"create_partial: {type(exc).__name__}: {exc}"[:300])
    print(json.dumps({"whole": whole, "partial": partial, "errors": errors, "instructor": instructor.__version__}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
