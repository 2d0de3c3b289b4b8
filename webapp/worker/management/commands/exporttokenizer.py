"""`manage.py exporttokenizer FOLDER [--model ID]`: a served model's tokenizer in Hugging Face's format (see
`inference.hf_export`), for benchmark tools that count tokens with `transformers`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.hf_export import export_tokenizer
from inference.loader import default_model_path
from webapp.gateway.errors import GatewayError
from webapp.gateway.routing import resolve


class Command(BaseCommand):
    help = "Write a model's tokenizer.json, tokenizer_config.json and special_tokens_map.json into FOLDER."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("folder", type=Path)
        parser.add_argument("--model", default="default", help="a model id or alias (default: the default model)")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            route = resolve(opts["model"])
        except GatewayError as exc:
            raise CommandError(exc.message) from None
        for path in export_tokenizer(route.path or default_model_path(), opts["folder"]):
            self.stdout.write(str(path))
