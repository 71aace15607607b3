"""Serving-engine ``/metrics`` samples (vLLM, TGI, SGLang) -> ENGINE_PRESSURE attrs.

Engines that pre-reserve VRAM sit near 90% GPU memory when idle, so their pressure is read from
their own gauges:

- kv_cache_usage (0..1): vLLM ``vllm:gpu_cache_usage_perc`` (V0) / ``vllm:kv_cache_usage_perc``
  (V1), SGLang ``sglang:token_usage``;
- requests_waiting: ``vllm:num_requests_waiting``, TGI ``tgi_queue_size``,
  ``sglang:num_queue_reqs``;
- requests_running: ``vllm:num_requests_running``, TGI ``tgi_batch_current_size``,
  ``sglang:num_running_reqs``;
- requests_swapped: ``vllm:num_requests_swapped`` (V0);
- preemptions (a counter): ``vllm:num_preemptions_total``;
- batch_max_tokens: TGI ``tgi_batch_current_max_tokens``.

TGI exports no KV-cache ratio: ``batch_max_tokens`` (the tokens the running batch may reach)
over the ``max_batch_total_tokens`` TGI logs at warmup is its equivalent.
Sources: https://docs.vllm.ai/en/latest/usage/metrics.html ,
https://huggingface.co/docs/text-generation-inference/reference/metrics ,
https://docs.sglang.ai/references/production_metrics.html .
"""

from __future__ import annotations

import math
from typing import Any

# metric -> (engine, attr, is_count)
ENGINE_METRICS: dict[str, tuple[str, str, bool]] = {
    "vllm:gpu_cache_usage_perc": ("vllm", "kv_cache_usage", False),
    "vllm:kv_cache_usage_perc": ("vllm", "kv_cache_usage", False),
    "vllm:num_requests_waiting": ("vllm", "requests_waiting", True),
    "vllm:num_requests_running": ("vllm", "requests_running", True),
    "vllm:num_requests_swapped": ("vllm", "requests_swapped", True),
    "vllm:num_preemptions_total": ("vllm", "preemptions", True),
    "sglang:token_usage": ("sglang", "kv_cache_usage", False),
    "sglang:num_queue_reqs": ("sglang", "requests_waiting", True),
    "sglang:num_running_reqs": ("sglang", "requests_running", True),
    "tgi_queue_size": ("tgi", "requests_waiting", True),
    "tgi_batch_current_size": ("tgi", "requests_running", True),
    "tgi_batch_current_max_tokens": ("tgi", "batch_max_tokens", True),
}
_MODEL_LABELS = ("model_name", "model", "name")  # "engine" in vLLM V1 is a DP index, not this


def engine_pressure_attrs(name: str, labels: dict[str, str], value: float) -> dict[str, Any] | None:
    """Return the ENGINE_PRESSURE attrs of one engine metric sample; None for other metrics.

    attrs: engine ("vllm" | "tgi" | "sglang"), one of kv_cache_usage (float, 0..1),
    requests_waiting / requests_running / requests_swapped / preemptions / batch_max_tokens
    (ints), metric (the name) and model (the ``model_name``, ``model`` or ``name`` label).
    NaN (Prometheus' staleness marker), infinities and negative values say nothing (None).
    Format: https://docs.vllm.ai/en/latest/usage/metrics.html
    """
    mapped = ENGINE_METRICS.get(name)
    if mapped is None or not math.isfinite(value) or value < 0:
        return None
    engine, attr, is_count = mapped
    attrs: dict[str, Any] = {
        attr: int(value) if is_count else value,
        "engine": engine,
        "metric": name,
    }
    for key in _MODEL_LABELS:
        model = labels.get(key)
        if model:
            attrs["model"] = model
            break
    return attrs
