"""Settings from the environment: a bound that can be lifted with `off`, and loud failures for nonsense."""

from __future__ import annotations

import pytest

from webapp.env import ImproperlyConfiguredEnv, env_float_or_off


def test_it_reads_a_number_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STRETCH", raising=False)
    assert env_float_or_off("STRETCH", 1.75, minimum=1.0) == 1.75
    monkeypatch.setenv("STRETCH", "2.5")
    assert env_float_or_off("STRETCH", 1.75, minimum=1.0) == 2.5
    monkeypatch.setenv("STRETCH", " OFF ")
    assert env_float_or_off("STRETCH", 1.75, minimum=1.0) is None


@pytest.mark.parametrize("raw", ["fast", "0.5", "nan"])
def test_it_refuses_what_is_not_a_number_at_least_the_minimum(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("STRETCH", raw)
    with pytest.raises(ImproperlyConfiguredEnv, match="STRETCH"):
        env_float_or_off("STRETCH", 1.75, minimum=1.0)
