"""The web app's per-process context, shared by every request (``request.app.state.web``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from detector.config import Settings
from detector.notify.delivery import Worker
from detector.notify.slack.notifier import Notifier
from detector.web.auth import Auth


@dataclass
class WebContext:
    """What every request needs: settings, the store's sessions, who is asking, the notifier."""

    settings: Settings
    auth: Auth
    make_session: Callable[[], Session] | None = None
    notifier: Notifier | None = None
    workers: list[Worker] = field(default_factory=list)  # PagerDuty, Grafana

    def session(self) -> Session:
        """Open a store session; the store is opened at startup."""
        assert self.make_session is not None, "the app has not started"
        return self.make_session()

    def changed(self) -> None:
        """Tell the senders (Slack, PagerDuty) that a decision added to the outbox."""
        if self.notifier is not None:
            self.notifier.wake()
        for worker in self.workers:
            worker.wake()
