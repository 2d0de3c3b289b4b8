"""`manage.py exporttokenizer FOLDER [--model ID]`: a served model's tokenizer in Hugging Face's format (see
`inference.hf_export`), for benchmark tools that count tokens with `transformers`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.hf_export import export_tokenizer
from inference.loader import default_model_path
from webapp.catalog import by_name, configured_models


class Command(BaseCommand):
    help = "Write a model's tokenizer.json, tokenizer_config.json and special_tokens_map.json into FOLDER."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("folder", type=Path)
        parser.add_argument("--model", default="default", help="a model id or alias (default: the default model)")

    def handle(self, *args: Any, **opts: Any) -> None:
        route = by_name().get(opts["model"])
        if route is None:
            known = ", ".join(r.id for r in configured_models())
            raise CommandError(f"The model {opts['model']!r} does not exist. Available models: {known}.")
        for path in export_tokenizer(route.path or default_model_path(), opts["folder"]):
            self.stdout.write(str(path))
