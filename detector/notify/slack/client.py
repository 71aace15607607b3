"""The Slack Web API client of the detector: ``slack_sdk.WebClient`` with retry handlers.

Rate limits (HTTP 429 with ``Retry-After``: https://api.slack.com/apis/rate-limits), server
errors and connection errors are retried with backoff by the SDK's own handlers; what still
fails surfaces as ``slack_sdk.errors.SlackApiError`` / ``SlackClientError`` to the sender,
which keeps the message in the outbox and tries again later.
"""

from __future__ import annotations

from slack_sdk import WebClient
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)

from detector.config import SlackSettings
from detector.errors import ConfigError

TIMEOUT_S = 10


def web_client(settings: SlackSettings) -> WebClient:
    """Return a Web API client for the bot token at ``settings.api_url``; raises ConfigError."""
    if settings.bot_token is None:
        raise ConfigError("Slack is not configured: set DETECTOR_SLACK__BOT_TOKEN")
    return WebClient(
        token=settings.bot_token.get_secret_value(),
        base_url=settings.api_url,
        timeout=TIMEOUT_S,
        retry_handlers=[
            RateLimitErrorRetryHandler(max_retry_count=5),
            ServerErrorRetryHandler(max_retry_count=3),
            ConnectionErrorRetryHandler(max_retry_count=3),
        ],
    )
