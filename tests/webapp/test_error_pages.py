"""With the defaults, no page ever shows Django's debug output: missing URLs and failing views get plain errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client, override_settings
from django.urls import path
from servers import ROOT, server_env

from webapp import urls as site_urls

pytestmark = pytest.mark.live  # reads the settings in fresh processes


def _boom(request: object) -> None:
    raise RuntimeError("SECRET_SETTING_VALUE in a traceback")


urlpatterns = [*site_urls.urlpatterns, path("boom", _boom), path("v1/boom", _boom)]
handler404 = site_urls.handler404
handler500 = site_urls.handler500


def test_debug_is_off_by_default_and_the_secret_key_is_generated_once(tmp_path: Path) -> None:
    """Read in a fresh process with no ROUNDTRIP_* settings (pytest-django forces DEBUG off in this one)."""
    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'webapp.settings'; django.setup();"
        "from django.conf import settings; print(settings.DEBUG, settings.SECRET_KEY)"
    )
    env = {**server_env(), "ROUNDTRIP_SECRET_KEY_FILE": str(tmp_path / "key")}
    runs = [
        subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        for _ in range(2)
    ]
    assert runs[0][0] == "False" and len(runs[0][1]) > 40 and runs[0] == runs[1]
    assert (tmp_path / "key").stat().st_mode & 0o777 == 0o600


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=__name__)
def test_a_missing_url_and_a_failing_view_show_no_traceback() -> None:
    client = Client(raise_request_exception=False)
    page = client.get("/no/such/page")
    assert page.status_code == 404 and b"Traceback" not in page.content and b"URLconf" not in page.content
    api = client.get("/v1/no-such-endpoint")
    assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"
    for url in ("/boom", "/v1/boom"):
        failed = client.get(url)
        assert (
            failed.status_code == 500
            and b"SECRET_SETTING_VALUE" not in failed.content
            and b"Traceback" not in failed.content
        )
    assert client.get("/v1/boom").json()["error"]["type"] == "server_error"


def test_the_production_setting_passes_djangos_deploy_check() -> None:
    env = {**server_env(), "ROUNDTRIP_PRODUCTION": "1", "ROUNDTRIP_ALLOWED_HOSTS": "chat.example.org"}
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr + done.stdout


@pytest.mark.django_db
def test_every_page_carries_a_content_security_policy_without_inline_script() -> None:
    policy = Client().get("/health")["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]
