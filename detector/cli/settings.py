"""Build the one Settings object of a command from the environment and its options."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from detector.config import Settings
from detector.errors import ConfigError


def cli_settings(database_url: str | None, workloads: Path | None) -> Settings:
    """Build the settings from the environment and the command line; ConfigError if invalid."""
    try:
        settings = Settings()
    except ValidationError as exc:
        raise ConfigError(f"invalid DETECTOR_* setting: {exc}") from exc
    if database_url:
        settings.database.url = database_url
    if workloads:
        settings.workloads_file = workloads
    return settings
