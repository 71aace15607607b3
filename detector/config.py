"""Settings: one object built by the CLI from the environment and passed down.

Environment variables use the prefix ``DETECTOR_`` and ``__`` for nesting, e.g.
``DETECTOR_DATABASE__URL=postgresql+psycopg://...`` or ``DETECTOR_CORRELATE__WINDOW_S=600``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from detector.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]


class DatabaseSettings(BaseModel):
    """Where the incident store lives (SQLAlchemy URL)."""

    url: str = "sqlite:///detector.db"


class CorrelateSettings(BaseModel):
    """Thresholds and windows of the cascade pattern (``correlate.pattern``), in event time."""

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
    forecast_window_s: float = Field(
        120.0, gt=0, description="recent pressure a survivor's next-victim trend is fitted on"
    )
    forecast_horizon_s: float = Field(
        300.0, gt=0, description="a survivor forecast to reach its ceiling later is not named"
    )


class KafkaSettings(BaseModel):
    """Where and how the live loop consumes (``DETECTOR_KAFKA__BOOTSTRAP_SERVERS`` ...)."""

    bootstrap_servers: str = "localhost:9092"
    topics: list[str] = Field(
        default_factory=lambda: ["k8s-logs", "k8s-events", "lb-logs", "gpu-metrics"],
        description="container logs, Kubernetes events, load-balancer logs, GPU metrics "
        "(detector produce puts each file on its topic by this order)",
    )
    partitions: int = Field(
        4,
        ge=1,
        le=10_000,
        description="partitions of a topic that run or produce creates "
        "when none of the topics exists yet (else the existing topics' count)",
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
    bootstrap_timeout_ms: int = Field(
        5000, gt=0, description="how long a client waits for the first broker answer at start"
    )
    rebuild_max_records: int = Field(
        100_000, gt=0, description="records re-read per partition when time lookup is unusable"
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: str) -> str:
        bad = [s for s in value.split(",") if not s.strip() or s.startswith(":")]
        if bad or not value:
            raise ValueError(f"bootstrap servers are host:port,... (got {value!r})")
        return value

    @field_validator("topics")
    @classmethod
    def _topics(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one topic")
        return [check_topic(t) for t in value]

    @field_validator("dead_letter_topic")
    @classmethod
    def _dead_letter_topic(cls, value: str) -> str:
        return check_topic(value)


TOPIC_MAX_CHARS = 249
TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def check_topic(name: str) -> str:
    """Return ``name`` if Kafka accepts it as a topic name; raise ValueError saying why not.

    Kafka's rule (``org.apache.kafka.common.internals.Topic.validate``): 1 to 249 characters
    of ASCII letters, digits, ``.``, ``_`` and ``-``, and not ``.`` or ``..``.
    """
    if not name:
        raise ValueError("a topic name cannot be empty")
    if name in (".", "..") or len(name) > TOPIC_MAX_CHARS or not set(name) <= TOPIC_CHARS:
        raise ValueError(
            f"{name[:60]!r} is not a Kafka topic name (1-{TOPIC_MAX_CHARS} of a-z A-Z 0-9 . _ -)"
        )
    return name


class NginxGatewaySettings(BaseModel):
    """A plain nginx in front of the model (``DETECTOR_CONTAINMENT__NGINX__CONF_PATH`` ...).

    When set, the ``enable_rate_limit`` step drives it (detector.actuators.nginx.limiter): the
    two include files are written, checked with ``nginx -t`` and reloaded. With
    ``admission_include`` (included in the same ``location``), the ``quarantine_requests`` step
    writes its admission rule there (``client_max_body_size``, 413 beyond).
    """

    conf_path: Path
    http_include: Path
    location_include: Path
    admission_include: Path | None = None
    prefix: Path | None = None
    pid_file: Path | None = None
    error_log: Path | None = None
    nginx_bin: str = "nginx"
    burst: int = Field(0, ge=0, description="requests over the rate let through at once")


def _check_workload_keys(value: dict[str, object]) -> None:
    """Raise ValueError unless every key is ``namespace/workload``."""
    bad = [k for k in value if k.count("/") != 1 or k.startswith("/") or k.endswith("/")]
    if bad:
        raise ValueError(f"keys must be namespace/workload: {bad}")


class KubernetesSettings(BaseModel):
    """The cluster the workloads run in (``DETECTOR_CONTAINMENT__KUBERNETES__KUBECONFIG`` ...).

    ``kubeconfig`` None: the in-cluster service account. Drives ``lower_batch_ceiling``
    (Deployment args or env, by engine), ``stagger_restarts`` (one pod per move, eviction or
    delete) and ``enable_rate_limit`` through ingress-nginx annotations or an Envoy Gateway
    BackendTrafficPolicy. The mappings are keyed by ``namespace/workload``; without an entry
    the Ingress and HTTPRoute are named like the workload and the Deployment's only container
    is the serving one. An Envoy Gateway local rate limit counts in each of
    ``envoy_gateway_replicas`` Envoy replicas, so the step's aggregate limit is divided by it.
    """

    kubeconfig: Path | None = Field(None, description="kubeconfig file (None: in-cluster)")
    context: str | None = Field(None, description="kubeconfig context (None: current)")
    request_timeout_s: float = Field(10.0, gt=0, description="timeout of each API call")
    field_manager: str = Field(
        "gpu-oom-cascade-detector", min_length=1, max_length=128, description="managedFields"
    )
    controller_configmap_namespace: str = "ingress-nginx"
    controller_configmap_name: str = "ingress-nginx-controller"
    restart_method: Literal["eviction", "delete"] = Field(
        "eviction", description="eviction respects PodDisruptionBudgets; delete does not"
    )
    grace_period_s: int | None = Field(None, ge=0, description="pod termination grace period")
    rollout: Literal["surge", "unavailable"] = Field(
        "surge", description="one extra pod first (surge) or one pod down first"
    )
    containers: dict[str, str] = Field(
        default_factory=dict, description="namespace/workload -> serving container name"
    )
    ingresses: dict[str, list[str]] = Field(
        default_factory=dict, description="namespace/workload -> Ingress names"
    )
    http_routes: dict[str, str] = Field(
        default_factory=dict, description="namespace/workload -> HTTPRoute (Envoy Gateway)"
    )
    envoy_gateway_replicas: int = Field(
        1, ge=1, description="Envoy proxy replicas: a local rate limit counts in each"
    )

    @field_validator("containers", "ingresses", "http_routes")
    @classmethod
    def _keyed(cls, value: dict[str, object]) -> dict[str, object]:
        _check_workload_keys(value)
        return value

    @model_validator(mode="after")
    def _context_needs_file(self) -> KubernetesSettings:
        if self.context is not None and self.kubeconfig is None:
            raise ValueError("kubernetes context needs a kubeconfig (in-cluster has none)")
        return self


class HttpAdminSettings(BaseModel):
    """How to call an HTTP admin API: timeout per attempt and retries of idempotent calls."""

    timeout_s: float = Field(5.0, gt=0, description="per attempt")
    retries: int = Field(2, ge=0, description="extra attempts of idempotent calls")


class KongSettings(HttpAdminSettings):
    """Kong's Admin API (``DETECTOR_CONTAINMENT__KONG__ADMIN_URL`` ...).

    One Admin API per Kong cluster: nodes sharing a database take the plugin from it. The
    ``rate-limiting`` plugin goes on the workload's entry of ``scopes_by_workload``, else on
    ``scopes`` (``services/NAME`` or ``routes/NAME``); with ``policy: local`` each of
    ``nodes`` counts alone, so the step's rate is divided among them.
    """

    admin_url: str
    admin_token: SecretStr | None = Field(None, description="sent as Kong-Admin-Token")
    scopes: list[str] = Field(default_factory=list)
    scopes_by_workload: dict[str, list[str]] = Field(default_factory=dict)
    nodes: int = Field(1, ge=1)
    policy: Literal["local", "cluster", "redis"] = "local"

    @field_validator("scopes_by_workload")
    @classmethod
    def _keyed(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        _check_workload_keys(dict(value))
        return value

    @model_validator(mode="after")
    def _scoped(self) -> KongSettings:
        every = [*self.scopes, *(s for v in self.scopes_by_workload.values() for s in v)]
        bad = [s for s in every if s.partition("/")[0] not in ("services", "routes")]
        bad += [s for s in every if not s.partition("/")[2]]
        if bad or not every:
            raise ValueError(f"kong scopes are services/NAME or routes/NAME, one at least: {bad}")
        return self


class EnvoySettings(HttpAdminSettings):
    """Envoy admin endpoints with a pre-configured local rate limit, switched by runtime keys.

    Every listed Envoy (one per replica) gets both keys at 100%; the token bucket comes with
    the filter config, not from the step. A local limit counts in each replica, so the plan
    says what each bucket may let through: the aggregate limit / the admin URLs listed.
    """

    admin_urls: list[str] = Field(min_length=1)
    enabled_key: str = "local_rate_limit_enabled"
    enforced_key: str = "local_rate_limit_enforced"
    admin_layer: str = "admin"


class TritonSettings(HttpAdminSettings):
    """Triton servers (explicit model control) whose model is reloaded with a lower batch.

    ``urls``: every replica; the model is ``models[namespace/workload]``, else ``model``;
    ``max_queue_size`` bounds the dynamic batcher's queue (None: left as it is).
    """

    urls: list[str] = Field(min_length=1)
    model: str | None = None
    models: dict[str, str] = Field(default_factory=dict)
    max_queue_size: int | None = Field(None, ge=0)
    load_timeout_s: float = Field(300.0, gt=0)

    @field_validator("models")
    @classmethod
    def _keyed(cls, value: dict[str, str]) -> dict[str, str]:
        _check_workload_keys(dict(value))
        return value

    @model_validator(mode="after")
    def _named(self) -> TritonSettings:
        if self.model is None and not self.models:
            raise ValueError("triton needs model or models")
        return self


class RayServeSettings(HttpAdminSettings):
    """The Ray dashboard (Serve REST API) whose deployment's max_ongoing_requests is lowered.

    The deployment is ``deployments[namespace/workload]`` (``APP/DEPLOYMENT``), else ``app``
    and ``deployment``.
    """

    url: str
    app: str | None = None
    deployment: str | None = None
    deployments: dict[str, str] = Field(default_factory=dict)
    deploy_timeout_s: float = Field(60.0, gt=0)

    @field_validator("deployments")
    @classmethod
    def _keyed(cls, value: dict[str, str]) -> dict[str, str]:
        _check_workload_keys(dict(value))
        bad = [v for v in value.values() if v.count("/") != 1 or v.startswith("/")]
        bad += [v for v in value.values() if v.endswith("/")]
        if bad:
            raise ValueError(f"deployments values must be APP/DEPLOYMENT: {bad}")
        return value

    @model_validator(mode="after")
    def _named(self) -> RayServeSettings:
        if (self.app is None) != (self.deployment is None):
            raise ValueError("rayserve needs app and deployment together")
        if self.app is None and not self.deployments:
            raise ValueError("rayserve needs app and deployment, or deployments")
        return self


RateLimitGateway = Literal["nginx", "ingress-nginx", "envoy-gateway", "kong", "envoy"]
BatchCeilingTarget = Literal["kubernetes", "triton", "rayserve"]
GATEWAY_SECTION: dict[str, str] = {
    "nginx": "nginx",
    "ingress-nginx": "kubernetes",
    "envoy-gateway": "kubernetes",
    "kong": "kong",
    "envoy": "envoy",
}
"""The containment setting each rate-limit gateway needs."""


class ContainmentSettings(BaseModel):
    """Who may approve steps, which workloads may be acted on, and the global kill switch.

    A workload is dry-run until armed: listed here as ``namespace/workload``, or armed with
    ``detector arm`` (a database flag; ``detector disarm`` overrides this list). ``kill_switch``
    holds every actuator call (apply, restart, lift, rollback); ``detector kill-switch on``
    does the same from the database. Approvers are the names allowed to approve or deny a step
    (``detector approve --as NAME``, or the owner of an API token). ``predictive``
    (``DETECTOR_CONTAINMENT__PREDICTIVE=true``): the gateway limit goes on at ``suspected``
    when the next-victim forecast says a survivor reaches its ceiling before a restarted pod
    can serve again (``restart_ready_s`` when the evidence does not tell;
    detector.runbooks.predictive); every rail of a step still holds.
    """

    armed_workloads: list[str] = Field(
        default_factory=list, description="namespace/workload entries that may act for real"
    )
    kill_switch: bool = Field(False, description="hold every actuator call")
    approvers: list[str] = Field(default_factory=list, description="approver allow-list")
    nginx: NginxGatewaySettings | None = Field(
        None, description="the plain nginx the enable_rate_limit step drives (None: dry-run)"
    )
    kubernetes: KubernetesSettings | None = None
    kong: KongSettings | None = None
    envoy: EnvoySettings | None = None
    triton: TritonSettings | None = None
    rayserve: RayServeSettings | None = None
    rate_limit_gateway: RateLimitGateway | None = Field(
        None, description="what enable_rate_limit drives (None: the one configured)"
    )
    batch_ceiling_target: BatchCeilingTarget | None = Field(
        None, description="what lower_batch_ceiling drives (None: the one configured)"
    )
    predictive: bool = Field(
        False,
        description="apply the gateway limit at `suspected` when a survivor is forecast to "
        "reach its ceiling before a restarted pod can serve again",
    )
    restart_ready_s: float = Field(
        130.0,
        gt=0,
        description="how long a restarted pod needs to serve again when the evidence shows "
        "neither a restart nor a model load: 120 s of load + the first CrashLoopBackOff "
        "back-off, 10 s",
    )

    @field_validator("armed_workloads")
    @classmethod
    def _namespaced(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if v.count("/") != 1 or v.startswith("/") or v.endswith("/")]
        if bad:
            raise ValueError(f"armed_workloads entries must be namespace/workload: {bad}")
        return value

    @model_validator(mode="after")
    def _targets(self) -> ContainmentSettings:
        self.rate_limit_driver()
        self.batch_ceiling_driver()
        return self

    def rate_limit_driver(self) -> RateLimitGateway | None:
        """Return the gateway ``enable_rate_limit`` drives, None when none is configured.

        Unset: the one of nginx, kong, envoy that is configured, else ingress-nginx when
        kubernetes is. Raises ValueError when the named gateway is not configured, or when
        several are and none is named.
        """
        wanted = self.rate_limit_gateway
        if wanted is not None:
            section = GATEWAY_SECTION[wanted]
            if getattr(self, section) is None:
                raise ValueError(
                    f"rate_limit_gateway {wanted!r} is not configured (set containment.{section})"
                )
            return wanted
        explicit: list[RateLimitGateway] = [
            g for g in ("nginx", "kong", "envoy") if getattr(self, g) is not None
        ]
        if len(explicit) > 1:
            raise ValueError(
                f"gateways {explicit} are configured: name the one enable_rate_limit drives "
                "in rate_limit_gateway"
            )
        if explicit:
            return explicit[0]
        return "ingress-nginx" if self.kubernetes is not None else None

    def batch_ceiling_driver(self) -> BatchCeilingTarget | None:
        """Return what ``lower_batch_ceiling`` drives, None when nothing is configured.

        Unset: triton or rayserve when one of them is configured, else kubernetes. Raises
        ValueError when the named target is not configured, or both triton and rayserve are.
        """
        wanted = self.batch_ceiling_target
        if wanted is not None:
            if getattr(self, wanted) is None:
                raise ValueError(
                    f"batch_ceiling_target {wanted!r} is not configured (set containment.{wanted})"
                )
            return wanted
        engines: list[BatchCeilingTarget] = [
            t for t in ("triton", "rayserve") if getattr(self, t) is not None
        ]
        if len(engines) > 1:
            raise ValueError(
                "triton and rayserve are both configured: name the one lower_batch_ceiling "
                "drives in batch_ceiling_target"
            )
        if engines:
            return engines[0]
        return "kubernetes" if self.kubernetes is not None else None


MIN_TOKEN_CHARS = 16  # shorter API tokens are refused: they can be guessed


class WebSettings(BaseModel):
    """The web face (``detector serve``): address, tokens, who may read and act.

    ``tokens`` maps an owner's name to their token, e.g.
    ``DETECTOR_WEB__TOKENS='{"alice": "<32 random characters>"}'``; the owner is the approver
    identity recorded on the timeline and must be on the approver allow-list. A token is used as
    a bearer token (the API) or at the login form (the pages). Behind an authenticating proxy
    (oauth2-proxy), ``trusted_proxy_header`` names the identity header, honoured only from
    ``trusted_proxies``. Reading needs an identity unless ``host`` is loopback or
    ``public_read`` is set.
    """

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    tokens: dict[str, SecretStr] = Field(default_factory=dict)
    base_url: str = Field(
        "", description="where people reach the web pages, e.g. https://detector.example.com"
    )
    public_read: bool = Field(False, description="anyone may read the pages and the JSON API")
    trusted_proxy_header: str = Field(
        "", description="identity header set by an authenticating proxy, e.g. X-Forwarded-Email"
    )
    trusted_proxies: list[str] = Field(
        default_factory=list, description="addresses/networks whose identity header is honoured"
    )
    session_secret: SecretStr | None = Field(
        None, description="signs login sessions and CSRF tokens (default: random per process)"
    )

    @field_validator("tokens")
    @classmethod
    def _long_enough(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        short = sorted(k for k, v in value.items() if len(v.get_secret_value()) < MIN_TOKEN_CHARS)
        if short:
            raise ValueError(f"tokens shorter than {MIN_TOKEN_CHARS} characters: {short}")
        return value


class SlackSettings(BaseModel):
    """Slack: the incident message, its thread and the Approve/Deny buttons.

    Notifications are on when ``bot_token`` and ``channel`` are set. ``channels`` sends a
    namespace's incidents to its own channel; ``mention`` (e.g. ``<!subteam^S0123>`` or
    ``<@U0123>``) is written into the reply that announces ``cascading``. Interactions arrive
    signed at ``POST /slack/interactions`` (``signing_secret``) or over Socket Mode
    (``app_token``, an ``xapp-`` token). ``api_url`` is the Web API base URL.
    """

    bot_token: SecretStr | None = None
    signing_secret: SecretStr | None = None
    app_token: SecretStr | None = None
    channel: str = Field("", description="the channel ID (C0123...): look-ups need the ID")
    channels: dict[str, str] = Field(default_factory=dict, description="namespace -> channel")
    mention: str = ""
    api_url: str = "https://slack.com/api/"
    coalesce_s: float = Field(
        15.0, ge=0, description="timeline entries this close in event time share one reply"
    )
    lease_s: float = Field(
        60.0, gt=0, description="a sender's hold on an incident's thread, renewed per delivery"
    )

    @field_validator("app_token")
    @classmethod
    def _app_level(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith("xapp-"):
            raise ValueError("Socket Mode needs an app-level token (xapp-...), not a bot token")
        return value

    @property
    def enabled(self) -> bool:
        """Return True when messages can be posted (a bot token and a channel are set)."""
        return self.bot_token is not None and bool(self.channel or self.channels)

    def channel_for(self, namespace: str) -> str:
        """Return the channel of a namespace's incidents (``channels``, else ``channel``)."""
        return self.channels.get(namespace, self.channel)


class PagerDutySettings(BaseModel):
    """PagerDuty: page the on-call through the Events API v2, one alert per incident.

    On when ``routing_key`` (the integration key of an Events API v2 integration, a secret) is
    set: a trigger when an incident reaches ``trigger_stage``, a resolve when it is resolved,
    all with the incident's key as ``dedup_key``
    (https://developer.pagerduty.com/docs/events-API-v2/trigger-events/).
    ``events_url`` is the ``/v2/enqueue`` endpoint.
    """

    routing_key: SecretStr | None = None
    events_url: str = "https://events.pagerduty.com/v2/enqueue"
    trigger_stage: Literal["suspected", "cascading"] = Field(
        "cascading", description="the stage that pages"
    )
    timeout_s: float = Field(10.0, gt=0, description="per request")
    lease_s: float = Field(60.0, gt=0, description="a sender's hold on an event it is sending")

    @property
    def enabled(self) -> bool:
        """Return True when events can be sent (a routing key is set)."""
        return self.routing_key is not None and bool(self.routing_key.get_secret_value())


class GrafanaSettings(BaseModel):
    """Grafana: each stage change and applied or lifted step as an annotation on the
    dashboards the team watches (``POST /api/annotations``:
    https://grafana.com/docs/grafana/latest/developers/http_api/annotations/).

    On when ``url`` (Grafana's root, e.g. https://grafana.example.com) and ``token`` (a service
    account token with the annotations:write permission, sent as a bearer token) are set.
    ``tags`` go on every annotation beside the incident's own; ``dashboard_uid`` pins them to
    one dashboard (default: the organization's annotations, shown where a dashboard asks).
    """

    url: str = ""
    token: SecretStr | None = None
    tags: list[str] = Field(default_factory=lambda: ["gpu-oom-cascade"])
    dashboard_uid: str = ""
    timeout_s: float = Field(10.0, gt=0, description="per request")
    lease_s: float = Field(60.0, gt=0, description="a sender's hold on an event it is sending")

    @property
    def enabled(self) -> bool:
        """Return True when annotations can be posted (a URL and a token are set)."""
        return bool(self.url) and self.token is not None


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
    slack: SlackSettings = Field(default_factory=SlackSettings)
    pagerduty: PagerDutySettings = Field(default_factory=PagerDutySettings)
    grafana: GrafanaSettings = Field(default_factory=GrafanaSettings)


class UpstreamMapping(BaseModel):
    """Maps a load-balancer upstream name to the workload behind it.

    ``namespace`` is a Kubernetes namespace (an RFC 1123 label), ``workload`` the name of its
    Deployment or other controller (an RFC 1123 subdomain):
    https://kubernetes.io/docs/concepts/overview/working-with-objects/names/
    """

    namespace: str
    workload: str

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if len(value) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value):
            raise ValueError(
                f"{value[:70]!r} is not a namespace name (1-63 of a-z 0-9 -, e.g. llm)"
            )
        return value

    @field_validator("workload")
    @classmethod
    def _workload(cls, value: str) -> str:
        if len(value) > 253 or not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", value):
            raise ValueError(
                f"{value[:70]!r} is not a workload name (1-253 of a-z 0-9 - ., e.g. vllm-llama)"
            )
        return value


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
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"workload mapping {path}: {exc}") from exc
    except ValidationError as exc:
        raise ConfigError(f"workload mapping {path}: {validation_problems(exc)}") from exc


def validation_problems(exc: ValidationError, env_prefix: str = "") -> str:
    """Return the problems of ``exc`` in one line as ``field: message; ...``, never the values.

    With ``env_prefix`` (``DETECTOR_``) a field is named as its environment variable
    (``DETECTOR_CORRELATE__WINDOW_S``), else by its dotted path. A value may be a secret (a web
    token): pydantic's own message quotes the input.
    """

    def name(loc: tuple[int | str, ...]) -> str:
        if env_prefix and loc:
            return env_prefix + "__".join(str(p) for p in loc).upper()
        return ".".join(str(p) for p in loc) or "settings"

    return "; ".join(
        f"{name(err['loc'])}: {err['msg'].removeprefix('Value error, ')}"
        for err in exc.errors(include_input=False, include_url=False)
    )
