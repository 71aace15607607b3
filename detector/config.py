"""Settings: one object built by the CLI from the environment and passed down.

Environment variables use the prefix ``DETECTOR_`` and ``__`` for nesting, e.g.
``DETECTOR_DATABASE__URL=postgresql+psycopg://...`` or ``DETECTOR_CORRELATE__WINDOW_S=600``.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from detector.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]


class DatabaseSettings(BaseModel):
    """Where the incident store lives (SQLAlchemy URL)."""

    url: str = "sqlite:///detector.db"


class CorrelateSettings(BaseModel):
    """Thresholds and windows of the cascade pattern (DESIGN.md section 4), in event time."""

    window_s: float = Field(300.0, gt=0, description="victims inside this window form a cascade")
    memory_ceiling: float = Field(0.95, gt=0, le=1, description="GPU memory used/total ceiling")
    kv_cache_ceiling: float = Field(0.95, gt=0, le=1, description="KV-cache usage ceiling")
    queue_depth_ceiling: float = Field(
        100.0, ge=0, description="requests waiting in one engine that count as pressure (0: off)"
    )
    error_rate_per_s: float = Field(1.0, ge=0, description="5xx (502/503/504) rate threshold")
    error_ratio: float = Field(0.1, ge=0, le=1, description="5xx share of requests threshold")
    rate_window_s: float = Field(30.0, gt=0, description="window the 5xx rate is measured over")
    sustain_s: float = Field(30.0, ge=0, description="how long 5xx must stay above threshold")
    contained_after_s: float = Field(60.0, gt=0, description="no new OOM and 5xx below: contained")
    quiet_s: float = Field(300.0, gt=0, description="contained this long: resolved")
    oom_dedupe_s: float = Field(30.0, ge=0, description="one pod's OOM lines this close: one death")
    max_evidence_per_kind: int = Field(50, gt=0, description="evidence kept per kind and incident")


class KafkaSettings(BaseModel):
    """Where and how the live loop consumes (``DETECTOR_KAFKA__BOOTSTRAP_SERVERS`` ...)."""

    bootstrap_servers: str = "localhost:9092"
    topics: list[str] = Field(
        default_factory=lambda: ["k8s-logs", "k8s-events", "lb-logs", "gpu-metrics"]
    )
    group_id: str = "gpu-oom-detector"
    dead_letter_topic: str = "detector-dead-letters"
    fetch_max_wait_ms: int = Field(50, ge=0, description="broker wait for a fetch to fill")
    session_timeout_ms: int = Field(6000, gt=0, description="consumer group session timeout")
    max_poll_interval_ms: int = Field(10000, gt=0, description="max time between two polls")
    max_poll_records: int = Field(500, gt=0, description="records per batch (one transaction)")
    poll_timeout_ms: int = Field(500, gt=0, description="how long one poll waits for records")
    backoff_max_s: float = Field(5.0, gt=0, description="cap of the retry back-off on failure")
    metrics_port: int = Field(
        0, ge=0, le=65535, description="port of the /metrics endpoint of detector run (0: off)"
    )
    reorder_max_records: int = Field(
        20_000, gt=0, description="records held back to align partitions in event time"
    )
    reorder_max_hold_s: float = Field(
        2.0, gt=0, description="longest wait without a release before held records go through"
    )
    rebuild_max_records: int = Field(
        100_000, gt=0, description="records re-read per partition when time lookup is unusable"
    )


class NginxGatewaySettings(BaseModel):
    """A plain nginx in front of the model (``DETECTOR_CONTAINMENT__NGINX__CONF_PATH`` ...).

    When set, the ``enable_rate_limit`` step drives it (detector.actuators.nginx): the two
    include files are written, checked with ``nginx -t`` and reloaded.
    """

    conf_path: Path
    http_include: Path
    location_include: Path
    prefix: Path | None = None
    pid_file: Path | None = None
    error_log: Path | None = None
    nginx_bin: str = "nginx"
    burst: int = Field(0, ge=0, description="requests over the rate let through at once")


class ContainmentSettings(BaseModel):
    """Who may approve steps, which workloads may be acted on, and the global kill switch.

    A workload is dry-run until armed: listed here as ``namespace/workload``, or armed with
    ``detector arm`` (a database flag; ``detector disarm`` overrides this list). ``kill_switch``
    holds every actuator call (apply, restart, lift, rollback); ``detector kill-switch on``
    does the same from the database. Approvers are the names allowed to approve or deny a step
    (``detector approve --as NAME``, or the owner of an API token).
    """

    armed_workloads: list[str] = Field(
        default_factory=list, description="namespace/workload entries that may act for real"
    )
    kill_switch: bool = Field(False, description="hold every actuator call")
    approvers: list[str] = Field(default_factory=list, description="approver allow-list")
    nginx: NginxGatewaySettings | None = Field(
        None, description="the plain nginx the enable_rate_limit step drives (None: dry-run)"
    )

    @field_validator("armed_workloads")
    @classmethod
    def _namespaced(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if v.count("/") != 1 or v.startswith("/") or v.endswith("/")]
        if bad:
            raise ValueError(f"armed_workloads entries must be namespace/workload: {bad}")
        return value


MIN_TOKEN_CHARS = 16  # shorter API tokens are refused: they can be guessed


class WebSettings(BaseModel):
    """The approvals HTTP endpoint (``detector serve``): address and bearer tokens.

    ``tokens`` maps an owner's name to their token, e.g.
    ``DETECTOR_WEB__TOKENS='{"alice": "<32 random characters>"}'``; the owner is the approver
    identity recorded on the timeline and must be on the approver allow-list.
    """

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    tokens: dict[str, SecretStr] = Field(default_factory=dict)

    @field_validator("tokens")
    @classmethod
    def _long_enough(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        short = sorted(k for k, v in value.items() if len(v.get_secret_value()) < MIN_TOKEN_CHARS)
        if short:
            raise ValueError(f"tokens shorter than {MIN_TOKEN_CHARS} characters: {short}")
        return value


class Settings(BaseSettings):
    """All settings of one detector process."""

    model_config = SettingsConfigDict(
        env_prefix="DETECTOR_", env_nested_delimiter="__", extra="ignore"
    )

    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    correlate: CorrelateSettings = Field(default_factory=CorrelateSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    cluster: str | None = None
    workloads_file: Path | None = None
    runbook_path: Path = REPO_ROOT / "runbooks" / "gpu-oom-cascade.yaml"
    dry_run: bool = True
    containment: ContainmentSettings = Field(default_factory=ContainmentSettings)
    web: WebSettings = Field(default_factory=WebSettings)


class UpstreamMapping(BaseModel):
    """Maps a load-balancer upstream name to the workload behind it."""

    namespace: str
    workload: str


class WorkloadMap(BaseModel):
    """The YAML workload mapping file: ``upstreams: {name: {namespace, workload}}``."""

    model_config = {"extra": "forbid"}

    upstreams: dict[str, UpstreamMapping] = Field(default_factory=dict)


def load_workload_map(path: Path | None) -> WorkloadMap:
    """Read the workload mapping YAML; an absent path gives an empty mapping.

    Raises ConfigError when the file is unreadable or does not match the schema.
    """
    if path is None:
        return WorkloadMap()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        return WorkloadMap.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise ConfigError(f"workload mapping {path}: {exc}") from exc
