"""Answer the on-call engineer's three questions from an incident's evidence.

The questions: what were the batch size and maximum sequence length just before the OOM? Does
dynamic batching have hard ceilings on both batch size and queue wait? Is paged attention (or
another memory-managed KV cache) active in the serving engine?

Pure: reads an IncidentContext only. Each answer is a short factual sentence with the numbers
and the source position of the signal that answered it; an unanswered (or partly answered)
question says concretely what to check instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from detector.capacity.numbers import coerce_float, coerce_int
from detector.capacity.sizing import normalize_engine
from detector.correlate.context import IncidentContext
from detector.events.model import Signal, SignalKind, SourcePos

QUESTIONS: dict[str, str] = {
    "batch_and_seq_len": (
        "What were the batch size and maximum sequence length just before the OOM?"
    ),
    "batching_ceilings": (
        "Does dynamic batching have hard ceilings on both batch size and queue wait?"
    ),
    "paged_attention": (
        "Is paged attention or a memory-managed KV cache active in the serving engine?"
    ),
}

VLLM_UNBOUNDED_QUEUE_URL = "https://github.com/vllm-project/vllm/issues/18826"
VLLM_PAGED_ATTENTION_URL = "https://arxiv.org/abs/2309.06180"
TGI_PAGED_ATTENTION_URL = (
    "https://huggingface.co/docs/text-generation-inference/conceptual/paged_attention"
)
TGI_LAUNCHER_URL = "https://huggingface.co/docs/text-generation-inference/reference/launcher"
SGLANG_RADIX_ATTENTION_URL = "https://arxiv.org/abs/2312.07104"

SEQ_LEN_KEYS = ("max_model_len", "max_total_tokens", "context_length", "context_len")
BATCH_CEILING_KEYS = {
    "vllm": ("max_num_seqs", "max_num_batched_tokens"),
    "tgi": ("max_concurrent_requests", "max_batch_size", "max_batch_total_tokens"),
    "sglang": ("max_running_requests", "max_total_tokens", "chunked_prefill_size"),
}
QUEUE_CEILING_KEYS = (
    "max_waiting_queue_length",
    "max_num_queued_reqs",
    "max_queued_requests",
    "max_queue_wait_s",
    "queue_timeout_s",
)


@dataclass(frozen=True, slots=True)
class Answer:
    """One question with its answer (None when unanswered), evidence and what to check."""

    qkey: str
    question: str
    answer: str | None
    evidence: SourcePos | None
    to_check: str  # what to check when unanswered or partly answered; "" when complete


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine_config attrs of a workload merged in time order (latest value per key wins)."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, Signal] = field(default_factory=dict)  # the signal each value came from

    def get(self, key: str) -> Any:
        """Return the value of one attr, or None."""
        return self.values.get(key)


def engine_config(
    signals: Iterable[Signal], *, until: float | None = None, pod: str | None = None
) -> EngineConfig:
    """Merge ENGINE_CONFIG attrs at or before ``until`` (Unix s); ``pod``'s own values win."""
    chosen = [
        s
        for s in signals
        if s.kind is SignalKind.ENGINE_CONFIG and (until is None or s.time <= until)
    ]
    chosen.sort(key=lambda s: (pod is not None and s.pod == pod, s.time))
    values: dict[str, Any] = {}
    sources: dict[str, Signal] = {}
    for sig in chosen:
        for key, value in sig.attrs.items():
            if value is not None:
                values[key] = value
                sources[key] = sig
    return EngineConfig(values, sources)


def detect_engine(ctx: IncidentContext) -> tuple[str, Signal | None]:
    """Return (engine, the signal that named it), or ("unknown", None).

    Looks at the engine_config ``engine`` attr first, then the latest engine_pressure
    ``engine`` or gpu_oom / engine_dead ``framework`` naming a known engine.
    """
    config = engine_config(ctx.signals)
    engine = normalize_engine(config.get("engine"))
    if engine != "unknown":
        return engine, config.sources["engine"]
    for sig in reversed(ctx.signals):
        if sig.kind is SignalKind.ENGINE_PRESSURE:
            engine = normalize_engine(sig.attrs.get("engine"))
        elif sig.kind in (SignalKind.GPU_OOM, SignalKind.ENGINE_DEAD):
            engine = normalize_engine(sig.attrs.get("framework"))
        else:
            continue
        if engine != "unknown":
            return engine, sig
    return "unknown", None


def first_oom(ctx: IncidentContext) -> Signal | None:
    """Return the first GPU_OOM signal of the first victim (else of any pod), or None."""
    ooms = [s for s in ctx.signals if s.kind is SignalKind.GPU_OOM]
    if ctx.victims:
        own = [s for s in ooms if s.pod == ctx.victims[0]]
        ooms = own or ooms
    return min(ooms, key=lambda s: s.time, default=None)


def utc(time_s: float) -> str:
    """Format Unix seconds as an ISO 8601 UTC timestamp (seconds precision)."""
    return datetime.fromtimestamp(time_s, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _num(value: Any) -> str:
    number = coerce_float(value)
    if number is None:
        return str(value)
    return f"{int(number):,}" if number.is_integer() else f"{number:g}"


def _first_key(config: EngineConfig, keys: Iterable[str]) -> str | None:
    return next((k for k in keys if config.get(k) is not None), None)


def _workload_ref(ctx: IncidentContext) -> str:
    kind = "statefulset" if ctx.workload_kind == "StatefulSet" else "deploy"
    return f"{kind}/{ctx.workload}"


def _logs_cmd(ctx: IncidentContext, pod: str | None, pattern: str) -> str:
    target = pod or _workload_ref(ctx)
    return f"kubectl logs {target} -n {ctx.namespace} --previous | grep -E '{pattern}'"


_BATCH_HINT = {
    "vllm": (
        "vLLM's periodic stats line 'Running: N reqs' (metric vllm:num_requests_running)",
        "Running:",
    ),
    "tgi": ("TGI's metric tgi_batch_current_size", "batch"),
    "sglang": ("SGLang's decode line '#running-req: N'", "#running-req"),
    "unknown": ("the engine's running-batch metric or stats line", "running|batch"),
}
_CONFIG_HINT = {
    "vllm": (
        "vLLM logs its non-default args at start",
        "non-default args|max_model_len|max_num_seqs",
    ),
    "tgi": ("TGI logs its Args at start", "max_total_tokens|max_concurrent_requests|max_batch"),
    "sglang": ("SGLang logs server_args at start", "server_args|context_len|max_running_requests"),
    "unknown": ("the engine's startup arguments", "max_model_len|max_num_seqs|max_total_tokens"),
}


def _batch_check(ctx: IncidentContext, engine: str, pod: str | None, when: str) -> str:
    what, pattern = _BATCH_HINT[engine]
    return f"running batch just before {when}: {what}; {_logs_cmd(ctx, pod, pattern)}"


def _config_check(ctx: IncidentContext, engine: str, pod: str | None) -> str:
    what, pattern = _CONFIG_HINT[engine]
    return f"{what}; {_logs_cmd(ctx, pod, pattern)}"


def _latest_pressure(ctx: IncidentContext, until: float | None, pod: str | None) -> Signal | None:
    found = [
        s
        for s in ctx.signals
        if s.kind is SignalKind.ENGINE_PRESSURE
        and s.attrs.get("requests_running") is not None
        and (until is None or s.time <= until)
    ]
    own = [s for s in found if s.pod == pod]
    return max(own or found, key=lambda s: s.time, default=None)


def _pressure_text(sig: Signal) -> str:
    text = f"{sig.pod or 'a pod'} was running {_num(sig.attrs['requests_running'])} requests"
    if sig.attrs.get("requests_waiting") is not None:
        text += f" with {_num(sig.attrs['requests_waiting'])} waiting"
    usage = coerce_float(sig.attrs.get("kv_cache_usage"))
    if usage is not None:
        text += f", KV cache {usage:.0%} used"
    return text + f" at {utc(sig.time)}"


def answer_batch_and_seq_len(ctx: IncidentContext) -> Answer:
    """Answer: batch size (requests running) and maximum sequence length just before the OOM."""
    engine, _ = detect_engine(ctx)
    oom = first_oom(ctx)
    until = oom.time if oom is not None else None
    pod = oom.pod if oom is not None else (ctx.victims[0] if ctx.victims else None)
    when = f"{pod}'s OOM at {utc(until)}" if until is not None and pod else "the OOM"
    pressure = _latest_pressure(ctx, until, pod)
    config = engine_config(ctx.signals, until=until, pod=pod)
    seq_key = _first_key(config, SEQ_LEN_KEYS)
    parts: list[str] = []
    checks: list[str] = []
    if pressure is not None:
        parts.append(_pressure_text(pressure))
    else:
        checks.append(_batch_check(ctx, engine, pod, when))
    if seq_key is not None:
        ceiling = _first_key(config, BATCH_CEILING_KEYS.get(engine, ()))
        text = f"maximum sequence length ({seq_key}) {_num(config.get(seq_key))} tokens"
        if ceiling is not None:
            text += f", batch ceiling {ceiling} {_num(config.get(ceiling))}"
        parts.append(text)
    else:
        checks.append(f"maximum sequence length: {_config_check(ctx, engine, pod)}")
    evidence = pressure or (config.sources[seq_key] if seq_key else None)
    return Answer(
        qkey="batch_and_seq_len",
        question=QUESTIONS["batch_and_seq_len"],
        answer=f"Before {when}: " + "; ".join(parts) + "." if parts else None,
        evidence=evidence.source if evidence is not None else None,
        to_check="; ".join(checks),
    )


def _queue_text(ctx: IncidentContext, engine: str, config: EngineConfig) -> tuple[str, str]:
    """Return (queue-wait sentence, what to check) for the batching_ceilings question."""
    key = _first_key(config, QUEUE_CEILING_KEYS)
    if key is not None:
        return f"Queue: {key} {_num(config.get(key))}.", ""
    gateway = (
        f"the gateway timeout bounds the wait: kubectl get ingress {ctx.workload} -n "
        f"{ctx.namespace} -o yaml | grep -E 'proxy-read-timeout' (ingress-nginx default 60 s)"
    )
    if engine == "vllm":
        text = (
            "Queue wait: no ceiling - vLLM's waiting queue is unbounded by default "
            f"({VLLM_UNBOUNDED_QUEUE_URL}), so only a gateway or client timeout bounds it."
        )
    elif engine == "tgi":
        text = (
            "Queue wait: no time ceiling - MAX_CONCURRENT_REQUESTS bounds queued plus running "
            f"requests by count and refuses the rest ({TGI_LAUNCHER_URL})."
        )
    elif engine == "sglang":
        text = "Queue wait: no ceiling in SGLang's startup arguments."
    else:
        return "", f"queue wait: the engine's queue limits, and {gateway}"
    return text, gateway


def answer_batching_ceilings(ctx: IncidentContext) -> Answer:
    """Answer: are there hard ceilings on batch size (engine config) and on queue wait?"""
    engine, _ = detect_engine(ctx)
    config = engine_config(ctx.signals)
    keys = BATCH_CEILING_KEYS.get(engine) or tuple(
        k for v in BATCH_CEILING_KEYS.values() for k in v
    )
    found = [k for k in keys if config.get(k) is not None]
    checks: list[str] = []
    if found:
        listed = ", ".join(f"{k} {_num(config.get(k))}" for k in found)
        batch = f"Batch size: hard ceilings {listed}."
    elif engine == "vllm":
        batch = (
            "Batch size: vLLM always caps it with max_num_seqs, but the value is not in the "
            "logs (default 256, or 1024 on GPUs of 70 GiB or more other than A100)."
        )
        checks.append(f"the batch ceiling: {_config_check(ctx, engine, None)}")
    else:
        batch = ""
        checks.append(f"the batch ceiling: {_config_check(ctx, engine, None)}")
    queue, queue_check = _queue_text(ctx, engine, config)
    if queue_check:
        checks.append(queue_check)
    text = " ".join(p for p in (batch, queue) if p)
    evidence = config.sources[found[0]] if found else None
    return Answer(
        qkey="batching_ceilings",
        question=QUESTIONS["batching_ceilings"],
        answer=text if batch else None,
        evidence=evidence.source if evidence is not None else None,
        to_check="; ".join(checks),
    )


def _explicit_paged(config: EngineConfig) -> bool | None:
    value = config.get("paged_attention")
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "on", "off"):
        return value.strip().lower() in ("true", "on")
    return None


_PAGED_TEXT = {
    "vllm": (
        f"Yes: vLLM always keeps the KV cache in PagedAttention blocks ({VLLM_PAGED_ATTENTION_URL})"
    ),
    "tgi": (
        "Yes for models on TGI's flash-attention path, which uses PagedAttention "
        f"({TGI_PAGED_ATTENTION_URL}); models without it use a contiguous cache"
    ),
    "sglang": (
        "Yes: SGLang keeps the KV cache in a paged token pool shared through RadixAttention "
        f"({SGLANG_RADIX_ATTENTION_URL})"
    ),
}


def answer_paged_attention(ctx: IncidentContext) -> Answer:
    """Answer: is paged attention / a memory-managed KV cache active in the serving engine?"""
    engine, engine_sig = detect_engine(ctx)
    config = engine_config(ctx.signals)
    explicit = _explicit_paged(config)
    pod = ctx.victims[0] if ctx.victims else None
    to_check = ""
    text: str | None
    evidence: Signal | None
    if explicit is False or (explicit is True and engine not in ("vllm", "sglang")):
        text = f"{'Yes' if explicit else 'No'}: the engine reports paged attention "
        text += "on" if explicit else "off"
        evidence = config.sources["paged_attention"]
    elif engine in _PAGED_TEXT:
        text, evidence = _PAGED_TEXT[engine], engine_sig
        if engine == "tgi":
            to_check = "which attention path the model runs on: " + _logs_cmd(
                ctx, pod, "flash|paged|attention"
            )
    else:
        text, evidence = None, None
        to_check = (
            f"which engine serves the model: kubectl get {_workload_ref(ctx)} -n "
            f"{ctx.namespace} -o jsonpath='{{.spec.template.spec.containers[*].image}}'; vLLM, "
            "TGI (flash models) and SGLang page the KV cache, a plain PyTorch/Transformers "
            "server does not"
        )
    kv = coerce_int(config.get("kv_cache_tokens"))
    if text is not None and kv is not None:
        text += f"; GPU KV cache {kv:,} tokens"
    return Answer(
        qkey="paged_attention",
        question=QUESTIONS["paged_attention"],
        answer=text + "." if text is not None else None,
        evidence=evidence.source if evidence is not None else None,
        to_check=to_check,
    )


def answer_questions(ctx: IncidentContext) -> list[Answer]:
    """Answer the three questions (module docstring), in order, from the incident's signals."""
    return [
        answer_batch_and_seq_len(ctx),
        answer_batching_ceilings(ctx),
        answer_paged_attention(ctx),
    ]
