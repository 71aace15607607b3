"""Parse serving-engine startup and stats lines into ENGINE_CONFIG / ENGINE_PRESSURE attrs.

They answer the on-call questions: the batch and sequence-length ceilings in force, the KV-cache
size, whether a paged (managed) KV cache is active, and the queue and KV-cache pressure just
before an OOM. Formats and their sources:

- vLLM V1 ``non-default args: {...}`` (a Python dict repr) and V0 ``args: Namespace(...)``:
  https://github.com/vllm-project/vllm/pull/17803
- vLLM ``Initializing an LLM engine (v0.x.y) with config: model=..., max_seq_len=...``:
  https://github.com/vllm-project/vllm/issues/2418
- vLLM ``# GPU blocks: N, # CPU blocks: M``, ``GPU KV cache size: N tokens``, ``Maximum
  concurrency for N tokens per request: X.XXx``: https://github.com/vllm-project/vllm/pull/13596
- vLLM ``Available KV cache memory: X GiB``: https://github.com/vllm-project/vllm/issues/21348
- vLLM stats, V0 (``Running: N reqs, Swapped: N reqs, Pending: N reqs, GPU KV cache usage: X%``)
  and V1 (``Engine 000: ... Running: N reqs, Waiting: N reqs, GPU KV cache usage: X%``):
  https://github.com/vllm-project/vllm/issues/3094, https://github.com/vllm-project/vllm/pull/37307
- vLLM preemption warning (``total_num_cumulative_preemption=N``):
  https://github.com/GAIR-NLP/LIMO/issues/29
- TGI launcher ``Args { ..., max_concurrent_requests: 128, ... }`` and warmup ``Setting max
  batch total tokens to N``: https://github.com/huggingface/text-generation-inference/issues/832
- SGLang ``server_args=ServerArgs(...)``, ``max_total_num_tokens=N, ...`` and ``Decode batch.
  #running-req: N, ..., token usage: X, ..., #queue-req: N``:
  https://github.com/sgl-project/sglang/issues/1030,
  https://github.com/sgl-project/sglang/issues/29575, https://github.com/sgl-project/sglang/issues/1270
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from detector.events.classify import parse_size
from detector.events.model import SignalKind

Parsed = tuple[SignalKind, dict[str, Any]]
MAX_ARGS_CHARS = 16384  # a longer dict repr is not evaluated, only scanned by regex
MAX_NUMBER = 1e15  # larger values are garbage, not engine settings

_CONFIG, _PRESSURE = SignalKind.ENGINE_CONFIG, SignalKind.ENGINE_PRESSURE
_COUNT = r"(\d[\d,]{0,20})"  # "2,042,016"; bounded so int() never fails
_INT = r"(\d{1,15})"
_FLOAT = r"(\d{1,15}(?:\.\d{1,15})?)"

# Source key -> attr key; the same names in vLLM dicts, vLLM/SGLang "k=v" and TGI "k: v".
_VLLM_KEYS = {
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "max_model_len": "max_model_len",
    "max_seq_len": "max_model_len",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "enable_prefix_caching": "enable_prefix_caching",
}
_TGI_KEYS = {
    "max_concurrent_requests": "max_concurrent_requests",
    "max_batch_total_tokens": "max_batch_total_tokens",
    "max_batch_prefill_tokens": "max_batch_prefill_tokens",
    "max_input_tokens": "max_input_tokens",
    "max_input_length": "max_input_tokens",
    "max_total_tokens": "max_total_tokens",
    "max_waiting_tokens": "max_waiting_tokens",
    "cuda_memory_fraction": "cuda_memory_fraction",
}
_SGLANG_KEYS = {
    "max_running_requests": "max_running_requests",
    "mem_fraction_static": "mem_fraction_static",
    "context_length": "max_model_len",
    "context_len": "max_model_len",
    "chunked_prefill_size": "chunked_prefill_size",
    "max_prefill_tokens": "max_prefill_tokens",
    "max_total_tokens": "kv_cache_tokens",
    "max_total_num_tokens": "kv_cache_tokens",
}

_KV_EQ = re.compile(r"\b(\w+)=(?:Some\()?'?([\w.\-]+)")
_KV_COLON = re.compile(r"\b(\w+): (?:Some\()?([\w.\-]+)")
_DICT_ITEM = re.compile(r"'(\w+)': ([\w.\-]+)")
_BLOCKS = re.compile(r"# (?:GPU|cuda) blocks: " + _INT + "(?:, # CPU blocks: " + _INT + ")?", re.I)
_KV_TOKENS = re.compile(r"GPU KV cache size: " + _COUNT + " tokens")
_KV_MEMORY = re.compile(
    r"(?:Available KV cache memory: |reserved for KV Cache is |kv_cache_size=)"
    + _FLOAT
    + r"\s*([KMGT]i?B)",
    re.IGNORECASE,
)
_UTILIZATION = re.compile(r"gpu_memory_utilization[=( ]+" + _FLOAT)
_CONCURRENCY = re.compile(
    r"Maximum concurrency for " + _COUNT + " tokens per request: " + _FLOAT + "x"
)
_SGLANG_KV_ALLOC = re.compile(
    r"KV Cache is allocated\. #tokens: "
    + _INT
    + ", K size: "
    + _FLOAT
    + r" ([KMGT]i?B), V size: "
    + _FLOAT
)
_USAGE = re.compile(r"GPU KV cache usage: " + _FLOAT + "%")
_REQS = re.compile(r"\b(Running|Waiting|Pending|Swapped): " + _INT + " reqs")
_PREEMPTED = re.compile(r"total_num_cumulative_preemption=" + _INT)
_SG_RUNNING = re.compile(r"#running-req: " + _INT)
_SG_QUEUE = re.compile(r"#queue-req: " + _INT)
_SG_USAGE = re.compile(r"\btoken usage: " + _FLOAT)
_SG_RETRACT = re.compile(r"#retracted_reqs: " + _INT)
_TGI_TOTAL = re.compile(r"Setting max batch total tokens to " + _INT)
# Lower-case tokens at least one of which every line this module parses contains.
ENGINE_GATE_TOKENS = (
    "kv",
    "mem",
    "args",
    "llm engine",
    "blocks:",
    "concurrency",
    "preemption",
    "max batch total",
    "max_total",
    "running-req",
    "retract",
)
_REQ_KEYS = {
    "Running": "requests_running",
    "Waiting": "requests_waiting",
    "Pending": "requests_waiting",
    "Swapped": "requests_swapped",
}


def parse_engine_line(text: str) -> Parsed | None:
    """Parse one vLLM, TGI or SGLang log line into an engine config or pressure signal.

    Returns ``(SignalKind.ENGINE_CONFIG, attrs)`` or ``(SignalKind.ENGINE_PRESSURE, attrs)``
    or ``None``. Attr keys: ``engine`` ("vllm" | "tgi" | "sglang"), ceilings (max_num_seqs,
    max_num_batched_tokens, max_model_len, gpu_memory_utilization, max_concurrent_requests,
    max_batch_total_tokens, max_input_tokens, max_total_tokens, max_running_requests,
    mem_fraction_static), KV cache (kv_cache_bytes, kv_cache_tokens, gpu_blocks,
    max_concurrency, paged_attention) and pressure (kv_cache_usage in 0..1, requests_running,
    requests_waiting, requests_swapped, preemptions). Formats: see the module docstring.
    """
    for token, parser in _DISPATCH:
        if token in text:
            parsed = parser(text)
            if parsed is not None:
                return parsed
    return None


def _vllm_args(text: str) -> Parsed | None:
    body = text.split("non-default args: ", 1)[1].strip()
    values = _literal_dict(body)
    if values is None:
        values = dict(_DICT_ITEM.findall(body))
    return _config("vllm", _pick(values, _VLLM_KEYS), paged=True)


def _vllm_namespace(text: str) -> Parsed | None:
    return _config("vllm", _pick(dict(_KV_EQ.findall(text)), _VLLM_KEYS), paged=True)


def _vllm_kv(text: str) -> Parsed | None:
    attrs: dict[str, Any] = {}
    if blocks := _BLOCKS.search(text):
        attrs["gpu_blocks"] = int(blocks.group(1))
        if blocks.group(2):
            attrs["cpu_blocks"] = int(blocks.group(2))
    if tokens := _KV_TOKENS.search(text):
        attrs["kv_cache_tokens"] = _int(tokens.group(1))
    if memory := _KV_MEMORY.search(text):
        attrs["kv_cache_bytes"] = parse_size(memory.group(1), memory.group(2))
    if utilization := _UTILIZATION.search(text):
        attrs["gpu_memory_utilization"] = float(utilization.group(1))
    if concurrency := _CONCURRENCY.search(text):
        attrs["max_model_len"] = _int(concurrency.group(1))
        attrs["max_concurrency"] = float(concurrency.group(2))
    return _config("vllm", attrs, paged=True)


def _vllm_stats(text: str) -> Parsed | None:
    attrs: dict[str, Any] = {_REQ_KEYS[k]: int(v) for k, v in _REQS.findall(text)}
    if usage := _USAGE.search(text):
        attrs["kv_cache_usage"] = float(usage.group(1)) / 100
    return _pressure("vllm", attrs)


def _vllm_preempted(text: str) -> Parsed | None:
    match = _PREEMPTED.search(text)
    return _pressure("vllm", {"preemptions": int(match.group(1))} if match else {})


def _tgi_args(text: str) -> Parsed | None:
    return _config("tgi", _pick(dict(_KV_COLON.findall(text)), _TGI_KEYS), paged=False)


def _tgi_warmup(text: str) -> Parsed | None:
    match = _TGI_TOTAL.search(text)
    attrs = {"max_batch_total_tokens": int(match.group(1))} if match else {}
    return _config("tgi", attrs, paged=False)


def _sglang_args(text: str) -> Parsed | None:
    return _config("sglang", _pick(dict(_KV_EQ.findall(text)), _SGLANG_KEYS), paged=False)


def _sglang_pool(text: str) -> Parsed | None:
    attrs = _pick(dict(_KV_EQ.findall(text)), _SGLANG_KEYS)
    if alloc := _SGLANG_KV_ALLOC.search(text):
        tokens, k_size, unit, v_size = alloc.groups()
        attrs["kv_cache_tokens"] = int(tokens)
        attrs["kv_cache_bytes"] = parse_size(k_size, unit) + parse_size(v_size, unit)
    return _config("sglang", attrs, paged=True)


def _sglang_stats(text: str) -> Parsed | None:
    attrs: dict[str, Any] = {}
    for pattern, key in ((_SG_RUNNING, "requests_running"), (_SG_QUEUE, "requests_waiting")):
        if match := pattern.search(text):
            attrs[key] = int(match.group(1))
    if usage := _SG_USAGE.search(text):
        attrs["kv_cache_usage"] = float(usage.group(1))
    if retracted := _SG_RETRACT.search(text):
        attrs["preemptions"] = int(retracted.group(1))
    return _pressure("sglang", attrs)


def _literal_dict(body: str) -> dict[str, Any] | None:
    """Evaluate a bounded dict repr with ``ast.literal_eval``; ``None`` when it is not one."""
    if not body.startswith("{") or len(body) > MAX_ARGS_CHARS:
        return None
    try:
        value = ast.literal_eval(body)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _pick(values: Mapping[str, Any], keys: Mapping[str, str]) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for source_key, attr_key in keys.items():
        value = _scalar(values.get(source_key))
        if value is not None:
            attrs.setdefault(attr_key, value)
    return attrs


def _scalar(value: Any) -> int | float | bool | None:
    """Return a bool or a finite number below ``MAX_NUMBER``; ``None`` for anything else."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        number: int | float = value
    else:
        text = str(value).strip("'\"")
        if text in ("True", "true", "False", "false"):
            return text.lower() == "true"
        try:
            number = float(text.replace(",", ""))
        except ValueError:
            return None
        if number.is_integer() and "." not in text and "e" not in text.lower():
            number = int(number)
    return number if math.isfinite(number) and abs(number) < MAX_NUMBER else None


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _config(engine: str, attrs: dict[str, Any], *, paged: bool) -> Parsed | None:
    if not attrs:
        return None
    if paged:
        attrs["paged_attention"] = True
    return _CONFIG, {"engine": engine, **attrs}


def _pressure(engine: str, attrs: dict[str, Any]) -> Parsed | None:
    return (_PRESSURE, {"engine": engine, **attrs}) if attrs else None


# Substring that selects a parser; checked in order, the first parser that yields wins.
_DISPATCH: tuple[tuple[str, Callable[[str], Parsed | None]], ...] = (
    ("KV cache usage: ", _vllm_stats),
    ("#running-req: ", _sglang_stats),
    ("#retracted_reqs: ", _sglang_stats),
    ("non-default args: ", _vllm_args),
    ("args: Namespace(", _vllm_namespace),
    ("LLM engine", _vllm_namespace),
    (" blocks: ", _vllm_kv),
    ("KV cache size: ", _vllm_kv),
    ("Maximum concurrency for ", _vllm_kv),
    ("Available KV cache memory: ", _vllm_kv),
    ("reserved for KV Cache is ", _vllm_kv),
    ("kv_cache_size=", _vllm_kv),
    ("x gpu_memory_utilization (", _vllm_kv),
    ("total_num_cumulative_preemption=", _vllm_preempted),
    ("Args {", _tgi_args),
    ("Setting max batch total tokens to ", _tgi_warmup),
    ("ServerArgs(", _sglang_args),
    ("max_total_num_tokens=", _sglang_pool),
    ("KV Cache is allocated. ", _sglang_pool),
)
