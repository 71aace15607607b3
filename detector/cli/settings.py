"""Build the one Settings object of a command from the environment and its options."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError
from pydantic_settings import SettingsError

from detector import db
from detector.config import Settings, validation_problems
from detector.errors import ConfigError, StoreError

ENV_PREFIX = "DETECTOR_"


def cli_settings(database_url: str | None, workloads: Path | None) -> Settings:
    """Build the settings from the environment and the command line; ConfigError if invalid."""
    try:
        settings = Settings()
    except ValidationError as exc:
        raise ConfigError(
            f"invalid DETECTOR_* setting: {validation_problems(exc, ENV_PREFIX)}"
        ) from exc
    except SettingsError as exc:  # a list or mapping variable that is not JSON
        raise ConfigError(
            f"invalid DETECTOR_* setting: {exc}; lists and mappings are JSON, "
            """e.g. DETECTOR_CONTAINMENT__APPROVERS='["alice"]'"""
        ) from exc
    if database_url:
        if "://" not in database_url:  # a file path: say how to write it as a URL
            raise ConfigError(
                f"--db takes a SQLAlchemy URL, not a path: sqlite:///{Path(database_url).resolve()}"
            )
        settings.database.url = database_url
    if workloads:
        settings.workloads_file = workloads
    try:
        db.check_url(settings.database.url)
    except StoreError as exc:
        raise ConfigError(str(exc)) from exc
    return settings
