"""`manage.py createapikey NAME`: create an API key and print it (the only time it is shown)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from webapp.keys.models import ApiKey


class Command(BaseCommand):
    help = "Create an API key; the key is printed once and stored only as a hash."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--owner", help="username of the key's owner")
        parser.add_argument("--expires-in-days", type=int)
        parser.add_argument("--models", help="comma-separated model ids this key may use (default: all)")
        parser.add_argument("--rpm", type=int, help="requests per minute (0: unlimited)")
        parser.add_argument("--tpm", type=int, help="tokens per minute (0: unlimited)")
        parser.add_argument("--concurrent", type=int, help="concurrent streams (0: unlimited)")
        parser.add_argument("--budget", type=int, help="tokens per budget period (0: unlimited)")
        parser.add_argument("--budget-period", choices=["day", "month"])
        parser.add_argument("--spend", type=float, help="US dollars per budget period, at the models' prices (0: none)")

    def handle(self, *args: Any, **opts: Any) -> None:
        fields: dict[str, Any] = {}
        if opts["owner"]:
            try:
                fields["owner"] = get_user_model().objects.get(username=opts["owner"])
            except get_user_model().DoesNotExist:
                raise CommandError(f"no user named {opts['owner']!r}") from None
        if opts["expires_in_days"] is not None:
            fields["expires_at"] = timezone.now() + timedelta(days=opts["expires_in_days"])
        if opts["models"]:
            fields["allowed_models"] = [m.strip() for m in opts["models"].split(",") if m.strip()]
        for option, field in [
            ("rpm", "requests_per_minute"),
            ("tpm", "tokens_per_minute"),
            ("concurrent", "concurrent_streams"),
            ("budget", "token_budget"),
            ("budget_period", "budget_period"),
            ("spend", "spend_budget"),
        ]:
            if opts[option] is not None:
                fields[field] = opts[option]
        key, raw = ApiKey.create_key(opts["name"], **fields)
        self.stderr.write(f"Created API key {key.prefix}… ({key.name}). It will not be shown again:")
        self.stdout.write(raw)
