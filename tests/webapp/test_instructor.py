"""instructor on a live server: its default mode (a forced function call) and its streamed `create_partial` extract a
nested object 10 times in 10 each, sampled, so each run is a different answer. instructor runs in its own virtual
environment (`tests/clients/instructor_probe.py`; `make test` builds it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from webapp.api.structured import MAX_STRING

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "instructor" / "bin" / "python"
RUNS = 10


def test_instructor_extracts_a_nested_object_ten_times_in_ten_whole_and_streamed(
    site_server: Any, make_key: Any
) -> None:
    if not PYTHON.exists():
        pytest.skip("instructor's environment is missing: `make test` builds .venv/instructor")
    probe = ROOT / "tests" / "clients" / "instructor_probe.py"
    done = subprocess.run(
        [str(PYTHON), str(probe), site_server.api, make_key(), str(RUNS)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["errors"] == [] and result["instructor"] == "1.17.0"
    assert len(result["whole"]) == len(result["partial"]) == RUNS
    for person in result["whole"] + result["partial"]:
        assert set(person) == {"name", "age", "address"} and set(person["address"]) == {"city", "country"}
        assert isinstance(person["age"], int) and 0 < len(person["name"]) <= MAX_STRING
