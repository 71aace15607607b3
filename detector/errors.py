"""The exception tree of the detector, documented in one place.

DetectorError                      root of every error raised on purpose; ``reason`` + ``detail``
├── ConfigError                    settings or the YAML workload mapping are invalid
├── ParseError                     a record could not be decoded into signals
├── StoreError                     the incident store failed (database, migrations)
├── StreamError                    the Kafka broker or client failed (poll, commit, produce)
├── RunbookError                   a runbook definition or its rendering is invalid
├── ApprovalError                  a decision (approve, deny, arm, disarm, kill switch,
│                                  acknowledge, resolve, snooze) was refused
├── NotifyError                    Slack refused or could not be reached (``detector.notify.slack``)
├── PostmortemError                no such incident or verdict to export, or an unknown format
├── GpuError                       NVML failed (``detector.gpu.nvml``; reason: NVML's error name)
└── ActuatorError                  an actuator could not plan, apply, verify or revert a change
    │                              (``detector.actuators.base``; reasons: ``actuators.base.Reason``)
    ├── ActivationRefused          activation refused while the old configuration is still live
    └── HttpCallError              an admin API call failed (``detector.actuators.http``)

Every error is built the same way: ``SomeError(reason, detail="")``. ``reason`` is a short
machine-friendly code where the raiser has one (``malformed_json``, ``not_found`` ...; errors
raised with a single message carry that message as ``reason``); ``detail`` says the rest.
``str(error)`` is ``"reason: detail"``, or ``reason`` alone. Third-party exceptions are
translated at the adapter that meets them (``raise ... from exc``).
"""


class DetectorError(Exception):
    """Root of every error the detector raises on purpose."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class ConfigError(DetectorError):
    """Settings or the workload mapping file are invalid."""


class ParseError(DetectorError):
    """A record could not be turned into signals.

    ``reason``: ``malformed_json``, ``unknown_format``, ``missing_field`` ... (the dead letter's
    reason); ``detail``: what was wrong.
    """


class StoreError(DetectorError):
    """The incident store failed."""


class StreamError(DetectorError):
    """The Kafka broker or client failed: poll, commit, seek, produce or topic admin."""


class RunbookError(DetectorError):
    """A runbook definition is invalid or a parameter failed to render."""


class NotifyError(DetectorError):
    """A notification could not be delivered: ``reason`` is Slack's error code
    (``channel_not_found``, ``ratelimited`` ...) or ``unreachable``; the outbox keeps it."""


class PostmortemError(DetectorError):
    """The postmortem cannot be exported: no such incident or verdict, or an unknown format."""


class ApprovalError(DetectorError):
    """A decision was refused; nothing changed.

    ``reason``: ``not_found`` (no such incident, step or workload), ``forbidden`` (not on the
    approver allow-list), ``conflict`` (the step is not waiting for approval: not requested
    yet, or already approved, denied or expired; an incident already resolved or
    acknowledged), ``invalid`` (a lifecycle decision without what it needs: a resolve's reason,
    a snooze's minutes in range).
    """
