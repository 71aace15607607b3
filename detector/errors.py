"""The exception tree of the detector, documented in one place.

DetectorError
├── ConfigError          settings or YAML mapping invalid
├── ParseError           a record could not be decoded into signals (carries ``reason``)
├── StoreError           the incident store failed (database, migrations)
├── StreamError          the Kafka broker or client failed (consume, commit, produce)
├── RunbookError         a runbook definition or its rendering is invalid
├── GpuError             NVML failed (detector.gpu.nvml; carries NVML's error name)
├── ActuatorError        an actuator could not plan or apply a change (detector.actuators.base)
└── ApprovalError        an approval or decision was refused (detector.runbooks.approvals)
"""


class DetectorError(Exception):
    """Root of every error the detector raises on purpose."""


class ConfigError(DetectorError):
    """Settings or the workload mapping file are invalid."""


class ParseError(DetectorError):
    """A record could not be turned into signals.

    ``reason`` is a short machine-friendly code (``malformed_json``, ``unknown_format``,
    ``missing_field`` ...); the message gives the detail.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class StoreError(DetectorError):
    """The incident store failed."""


class StreamError(DetectorError):
    """The Kafka broker or client failed: poll, commit, seek, produce or topic admin."""


class RunbookError(DetectorError):
    """A runbook definition is invalid or a parameter failed to render."""
