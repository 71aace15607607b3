"""``detector ceilings``: safe batch ceilings for a model on a GPU, computed, not guessed.

Inputs: the model's Hugging Face config.json (a multimodal config's ``text_config`` first, then
the top level), GPU memory, utilization and tensor parallel; optionally the engine's startup log
(``--engine-log``), whose figures replace the estimates. The calculation is the one the
lower-batch-ceiling runbook step uses (detector.capacity.ceilings.compute, on
detector.capacity.sizing); this module reads the files and prints.

``--json`` prints the document of ``detector.capacity.ceilings.compute`` (sizes in bytes in
``*_bytes`` keys, token counts in ``*_tokens`` and ``max_*`` keys, where each figure came from
in ``*_source`` keys). Exit status: 0; 1 when not even one request of the maximum length fits;
2 for bad input, with a message and no traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from detector.capacity.ceilings import EngineLog, Request, compute
from detector.capacity.model_config import ModelShape, parse_model_config
from detector.capacity.sizing import GIB, KNOWN_ENGINES
from detector.cli.exits import fail, interruptible
from detector.errors import ConfigError
from detector.events.classify import parse_size
from detector.events.engine_lines import parse_engine_line
from detector.events.model import SignalKind

MAX_LOG_LINE_CHARS = 1 << 16  # longer engine-log lines are cut here
_SIZE = r"(\d{1,9}(?:\.\d{1,6})?)\s?([KMGT]i?B)"
# Weights of one GPU: vLLM V0 "Loading model weights took X GB", V1 "Model loading took X GiB
# and Y seconds", the profiler's "model weights take X GiB; ..." (vllm-project/vllm#11251);
# SGLang "Load weight end. type=..., avail mem=X GB, mem usage=Y GB" (both print GiB as GB).
_WEIGHTS_LINE = re.compile(
    r"(?:model weights take |Loading model weights took |Model loading took |"
    r"Load weight end\.[^\n]{0,300}?mem usage=)" + _SIZE,
    re.IGNORECASE,
)
_RESERVE_PART = re.compile(r"(?:non_torch_memory|activation peak memory) takes " + _SIZE)


def load_model_config(path: Path) -> ModelShape:
    """Read and parse a config.json file; ConfigError when it cannot be read or parsed."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read --model-config {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--model-config {path} is not JSON: {exc}") from exc
    return parse_model_config(doc, str(path))


def read_engine_log(path: Path) -> EngineLog:
    """Read an engine log: engine_config attrs (detector.events.engine_lines), weights, reserve.

    The reserve is vLLM's profiled non-torch memory plus activation peak (both per GPU). The
    latest value of each figure wins. ConfigError when the file cannot be read.
    """
    evidence: dict[str, Any] = {}
    weights = reserve = None
    try:
        with path.open(encoding="utf-8", errors="replace") as lines:
            for raw in lines:
                text = raw[:MAX_LOG_LINE_CHARS]
                parsed = parse_engine_line(text)
                if parsed is not None and parsed[0] is SignalKind.ENGINE_CONFIG:
                    evidence.update(parsed[1])
                if match := _WEIGHTS_LINE.search(text):
                    weights = parse_size(*match.groups())
                parts = _RESERVE_PART.findall(text)
                if len(parts) == 2:
                    reserve = sum(parse_size(number, unit) for number, unit in parts)
    except OSError as exc:
        raise ConfigError(f"cannot read --engine-log {path}: {exc.strerror or exc}") from exc
    return EngineLog(evidence, weights, reserve)


def parse_size_arg(text: str, what: str) -> int:
    """Return bytes for a size such as ``80GiB``, ``80GB`` (GB = GiB here) or ``85899345920``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGTP]i?B?|B|bytes)?\s*", text, re.IGNORECASE)
    if match is None:
        raise ConfigError(f"{what}: not a size: {text!r} (e.g. 80GiB)")
    return parse_size(match.group(1), match.group(2))


def parse_count_arg(text: str, what: str) -> int:
    """Return a count such as ``8030261248``, ``8.03B``, ``72.7B`` or ``560M`` as an int."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMBT]?)\s*", text, re.IGNORECASE)
    if match is None:
        raise ConfigError(f"{what}: not a count: {text!r} (e.g. 8.03B)")
    scale = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}[match.group(2).lower()]
    return round(float(match.group(1)) * scale)


def _gpu_bytes(text: str) -> int:
    """Return ``--gpu-memory`` in bytes; ConfigError under 1 GiB (a missing unit, surely)."""
    size = parse_size_arg(text, "--gpu-memory")
    if size < GIB:
        raise ConfigError(f"--gpu-memory: {text!r} is under 1 GiB; give a unit, e.g. 80GiB")
    return size


def _gib(size: float) -> str:
    return f"{size / GIB:.2f} GiB"


def _flags(engine: str, settings: Mapping[str, float]) -> str:
    values = {key: f"{v:g}" if isinstance(v, float) else str(v) for key, v in settings.items()}
    if engine == "tgi":  # the launcher's environment variables
        return " ".join(f"{key.upper()}={value}" for key, value in values.items())
    return " ".join(f"--{key.replace('_', '-')} {value}" for key, value in values.items())


def render_text(doc: Mapping[str, Any]) -> str:
    """Return the human-readable report of a ``compute`` document."""
    length, per_token = doc["max_model_len"], doc["kv_bytes_per_token"]
    estimate = " - an estimate" if doc["weights_estimated"] else ""
    lines = [
        f"Model      {doc['model']}: {doc['layers']} layers, {doc['kv_heads']} KV heads x "
        f"{doc['head_dim']} head dim, {doc['dtype']} (KV cache {doc['kv_cache_dtype']})",
        f"KV cache   {per_token:,} bytes per token ({per_token / 1024:g} KiB), "
        f"{_gib(per_token * length)} per {length:,}-token request ({doc['max_model_len_source']})",
        f"GPU        {_gib(doc['gpu_memory_bytes'])} x {doc['utilization']:g} "
        f"({doc['utilization_source']}), tensor parallel {doc['tensor_parallel']}: "
        f"{doc['kv_bytes_per_token_per_gpu']:,} KV bytes per token per GPU",
        f"Weights    {_gib(doc['weights_bytes_per_gpu'])} per GPU{estimate} "
        f"({doc['weights_source']})",
        f"Reserve    {_gib(doc['activation_reserve_bytes'])} per GPU "
        f"({doc['activation_reserve_source']})",
        f"KV budget  {_gib(doc['kv_budget_bytes'])} per GPU = {doc['kv_cache_tokens']:,} tokens = "
        f"{doc['sequences_at_max_model_len']:g} requests of {length:,} tokens "
        f"({doc['kv_cache_source']})",
        f"Basis      {doc['basis']}",
        "",
    ]
    if not doc["fits"]:
        return "\n".join([*lines, _no_fit(doc)])
    lines.append(f"Safe ceilings for requests of up to {length:,} tokens:")
    lines += [f"  {engine:<7} {_flags(engine, s)}" for engine, s in doc["engines"].items()]
    if "gateway" in doc:
        lines.append(f"Gateway    {doc['gateway']['basis']}")
    if "runbook_step" in doc:
        lines.append(f"Runbook    lower_batch_ceiling: {doc['runbook_step']['basis']}")
    return "\n".join(lines)


def _no_fit(doc: Mapping[str, Any]) -> str:
    if doc["kv_budget_bytes"] == 0:
        usable = doc["gpu_memory_bytes"] * doc["utilization"]
        need = doc["weights_bytes_per_gpu"] + doc["activation_reserve_bytes"]
        why = f"weights and reserve ({_gib(need)} per GPU) leave nothing of {_gib(usable)};"
    else:
        why = (
            f"the KV cache holds {doc['kv_cache_tokens']:,} tokens, less than one "
            f"{doc['max_model_len']:,}-token request; lower --max-len,"
        )
    return f"Does not fit: {why} raise --tensor-parallel, quantize, or use a larger GPU"


def _given(parse: Callable[[str, str], int], text: str | None, what: str) -> int | None:
    return None if text is None else parse(text, what)


_ENGINE_HELP = "print this engine's parameters only: " + ", ".join(KNOWN_ENGINES)


@interruptible
def ceilings_cmd(
    model_config: Annotated[Path, typer.Option(help="the model's Hugging Face config.json")],
    gpu_memory: Annotated[str, typer.Option(help="memory of one GPU, e.g. 80GiB (GB = GiB)")],
    utilization: Annotated[
        float | None,
        typer.Option(help="engine memory fraction (default: the log's, else 0.9)"),
    ] = None,
    tensor_parallel: Annotated[int, typer.Option(min=1, help="GPUs per replica")] = 1,
    max_len: Annotated[
        int | None,
        typer.Option(min=1, help="tokens per request (default: the log's, else the model's)"),
    ] = None,
    engine: Annotated[str | None, typer.Option(help=_ENGINE_HELP)] = None,
    engine_log: Annotated[
        Path | None,
        typer.Option(help="the engine's startup log (same model, GPU, tensor parallel)"),
    ] = None,
    weights_bytes: Annotated[
        str | None, typer.Option(help="weights of the whole model, e.g. 16.06GB")
    ] = None,
    params: Annotated[str | None, typer.Option(help="parameter count, e.g. 8.03B")] = None,
    activation_reserve: Annotated[
        str | None, typer.Option(help="memory kept per GPU for activations (default: 4GiB)")
    ] = None,
    dtype: Annotated[str | None, typer.Option(help="weights dtype (default: config's)")] = None,
    kv_cache_dtype: Annotated[str, typer.Option(help="auto (the weights'), fp8, ...")] = "auto",
    replicas_left: Annotated[
        int | None, typer.Option(min=0, help="healthy replicas: adds the gateway limit")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Compute safe batch ceilings (vLLM, TGI, SGLang) for a model on a GPU."""
    try:
        if engine is not None and engine not in KNOWN_ENGINES:
            raise ConfigError(f"--engine must be one of {', '.join(KNOWN_ENGINES)}")
        request = Request(
            shape=load_model_config(model_config),
            gpu_bytes=_gpu_bytes(gpu_memory),
            utilization=utilization,
            tensor_parallel=tensor_parallel,
            max_len=max_len,
            engine=engine,
            weights_bytes=_given(parse_size_arg, weights_bytes, "--weights-bytes"),
            params=_given(parse_count_arg, params, "--params"),
            reserve_bytes=_given(parse_size_arg, activation_reserve, "--activation-reserve"),
            dtype=dtype,
            kv_cache_dtype=kv_cache_dtype,
            replicas_left=replicas_left,
            log=read_engine_log(engine_log) if engine_log else None,
        )
        doc = compute(request)
    except ConfigError as exc:
        fail(str(exc))
    typer.echo(json.dumps(doc, indent=2) if as_json else render_text(doc))
    if not doc["fits"]:
        if as_json:
            typer.echo(_no_fit(doc), err=True)
        raise typer.Exit(1)
