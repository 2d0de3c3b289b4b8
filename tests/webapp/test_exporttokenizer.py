"""`manage.py exporttokenizer`: a served model's tokenizer files, by id or alias; an unknown model is an error."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command


def test_it_writes_the_default_models_tokenizer_files(tmp_path: Path) -> None:
    out = StringIO()
    call_command("exporttokenizer", str(tmp_path / "tok"), "--model", "smollm2", stdout=out)
    assert [Path(line).name for line in out.getvalue().split()] == [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ]
    assert (tmp_path / "tok" / "tokenizer.json").stat().st_size > 1_000_000


def test_an_unknown_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="does not exist"):
        call_command("exporttokenizer", str(tmp_path), "--model", "nope")
