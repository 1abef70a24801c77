"""Secrets are never shown: names that hold one, and passwords inside URLs."""

from __future__ import annotations

import pytest

from pipeline import Settings
from pipeline._redact import REDACTED, redact


def test_a_registry_url_with_credentials_shows_no_password_in_the_settings_repr() -> None:
    # SchemaRegistryClient takes its basic auth from the URL's userinfo by default.
    settings = Settings(schema_registry={"url": "https://svc:hunter2@registry.example:8081"})
    for shown in (repr(settings), str(settings), repr(settings.schema_registry)):
        assert "hunter2" not in shown
        assert f"https://svc:{REDACTED}@registry.example:8081" in shown


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (
            "http://u:p%40ss@h:8081,http://v:w@k",
            f"http://u:{REDACTED}@h:8081,http://v:{REDACTED}@k",
        ),
        ("https://registry:8081", "https://registry:8081"),
        ("https://token@registry", "https://token@registry"),
        ("user@example.com", "user@example.com"),
    ],
)
def test_only_the_password_of_a_url_is_redacted(value: str, shown: str) -> None:
    assert redact(value, "url") == shown
    assert redact({"url": value}) == {"url": shown}
