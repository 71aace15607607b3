"""Capture real GPU memory readings and real out-of-memory texts on a lent GPU machine.

Run it there from the repository root, with that machine's python3 (torch, jax, cupy,
onnxruntime and nvidia-ml-py, none of this project's other dependencies)::

    PYTHONPATH=. python3 bench/device/capture_gpu.py --out "$OUT" 2>&1 | tee "$OUT/capture.log"

1. Readings: ``nvidia-smi`` (table, ``--query-gpu`` CSV, ``--query-compute-apps``, ``-q -d
   MEMORY``) and ``detector.gpu.nvml`` (v2 and v1 memory, processes), idle and while a torch
   process holds ``--hold-gib``; checks that NVML, nvidia-smi and torch agree within
   ``--margin-mib``, and writes ``detector.gpu.sample`` lines next to nvidia-smi's own.
2. Out-of-memory errors, each in its own subprocess with ``--case-timeout-s``: PyTorch (default
   caching allocator, ``backend:cudaMallocAsync``, ``expandable_segments:True``), JAX
   (``XLA_PYTHON_CLIENT_PREALLOCATE=false``), CuPy, ONNX Runtime's CUDA EP (skipped without
   it). Each holds ``--hold-gib`` and then allocates ``--step-gib`` chunks until one fails, so
   the text reads like a worker that grew past the card; stderr is kept as a log shows it.

Plain device allocations only (cudaMalloc through each framework), never managed memory.
Writes ``captures.json`` (everything), ``oom_texts.txt`` and the nvidia-smi outputs under
``--out``; the JSON is rewritten after each step, so a run cut short still leaves its part.
Without a GPU every step records its error and the script still exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

MIB = 1 << 20
QUERY = "timestamp,index,uuid,memory.used,memory.total"
PACKAGES = (
    *("torch", "jax", "jaxlib", "jax-cuda13-plugin", "cupy-cuda13x", "cupy-cuda12x"),
    *("onnxruntime", "onnxruntime-gpu", "onnx", "nvidia-ml-py", "numpy"),
)
STDERR_KEEP = 24_000  # characters of a child's stderr kept (its end)

# Each case: (environment, child code). The child holds HOLD_GIB, then grows by STEP_GIB until
# an allocation fails; it prints "CAPTURE {json}" with the exception, then re-raises it so the
# interpreter prints the traceback to stderr exactly as a worker's log would show it.
_GROW = """
import json, os, sys
GIB = 1 << 30
HOLD, STEP = int(os.environ["HOLD_GIB"]), int(os.environ["STEP_GIB"])
info = {"alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
def report(exc, chunks_held):
    info.update(type=type(exc).__module__ + "." + type(exc).__qualname__, message=str(exc),
                chunks_held=chunks_held)
    print("CAPTURE " + json.dumps(info), flush=True)
"""
TORCH = (
    _GROW
    + """
import torch
info.update(framework="pytorch", version=torch.__version__, cuda=torch.version.cuda)
info["free_bytes"], info["total_bytes"] = torch.cuda.mem_get_info()
held = []
try:
    if HOLD:
        held.append(torch.empty(HOLD * GIB, dtype=torch.uint8, device="cuda"))
    while True:
        held.append(torch.empty(STEP * GIB, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError as exc:
    report(exc, len(held))
    raise
"""
)
JAX = (
    _GROW
    + """
import jax, jax.numpy as jnp
info.update(framework="jax", version=jax.__version__, devices=str(jax.devices()))
ROW = 1 << 18  # float32 per 1 MiB row: every dimension stays far below 2**31
held = []
try:
    if HOLD:
        held.append(jnp.zeros((HOLD * 1024, ROW), jnp.float32).block_until_ready())
    while True:
        held.append(jnp.zeros((STEP * 1024, ROW), jnp.float32).block_until_ready())
except Exception as exc:
    report(exc, len(held))
    raise
"""
)
CUPY = (
    _GROW
    + """
import cupy
info.update(framework="cupy", version=cupy.__version__)
held = []
try:
    if HOLD:
        held.append(cupy.empty(HOLD * GIB, dtype=cupy.uint8))
    while True:
        held.append(cupy.empty(STEP * GIB, dtype=cupy.uint8))
except cupy.cuda.memory.OutOfMemoryError as exc:
    report(exc, len(held))
    raise
"""
)
ONNXRUNTIME = (
    _GROW
    + """
import numpy as np, onnxruntime as ort
from onnx import TensorProto, helper
info.update(framework="onnxruntime", version=ort.__version__)
if "CUDAExecutionProvider" not in ort.get_available_providers():
    print("SKIP no CUDAExecutionProvider in " + str(ort.get_available_providers()), flush=True)
    sys.exit(0)
value = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0])
node = helper.make_node("ConstantOfShape", ["shape"], ["y"], value=value)
graph = helper.make_graph(
    [node], "oom", [helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
options = ort.SessionOptions()
options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
session = ort.InferenceSession(
    model.SerializeToString(), options, providers=["CUDAExecutionProvider"])
if session.get_providers()[0] != "CUDAExecutionProvider":  # never fill host RAM instead
    print("SKIP session on " + str(session.get_providers()), flush=True)
    sys.exit(0)
rows = (HOLD + 100) * 1024  # more than the card: one request, like a huge batch
try:
    session.run(None, {"shape": np.array([rows, 1 << 18], dtype=np.int64)})
except Exception as exc:
    report(exc, 0)
    raise
"""
)
HOLDER = """
import json, os, sys, torch
GIB = 1 << 30
x = torch.empty(int(os.environ["HOLD_GIB"]) * GIB, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print("READY " + json.dumps({"pid": os.getpid(), "torch": torch.__version__,
      "allocated_bytes": torch.cuda.memory_allocated(), "reserved_bytes":
      torch.cuda.memory_reserved(), "free_bytes": free, "total_bytes": total}), flush=True)
sys.stdin.read()
"""


def cases(hold_gib: int, step_gib: int, too_big_gib: int) -> dict[str, tuple[dict[str, str], str]]:
    """Return the OOM cases: name -> (extra environment, child code)."""
    grow = {"HOLD_GIB": str(hold_gib), "STEP_GIB": str(step_gib)}
    return {
        "pytorch_default": (grow, TORCH),
        "pytorch_default_one_request": ({"HOLD_GIB": "0", "STEP_GIB": str(too_big_gib)}, TORCH),
        "pytorch_cudamallocasync": (
            grow | {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
            TORCH,
        ),
        "pytorch_expandable_segments": (
            grow | {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
            TORCH,
        ),
        "jax": (grow | {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, JAX),
        "cupy": (grow, CUPY),
        "onnxruntime_cuda": (grow, ONNXRUNTIME),
    }


def run(cmd: list[str], timeout_s: float = 30.0) -> dict[str, Any]:
    """Run a command; return its rc, stdout and stderr (or the error that kept it from running)."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"cmd": cmd, "error": f"{type(exc).__name__}: {exc}"}
    return {"cmd": cmd, "rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def nvidia_smi() -> dict[str, Any]:
    """Record nvidia-smi's table, CSV query, compute apps and memory details."""
    return {
        "table": run(["nvidia-smi"]),
        "query_csv": run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv"]),
        "query_csv_nounits": run(
            ["nvidia-smi", f"--query-gpu={QUERY},memory.free", "--format=csv,noheader,nounits"]
        ),
        "compute_apps": run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"]),
        "q_memory": run(["nvidia-smi", "-q", "-d", "MEMORY"]),
    }


def adapter_readings() -> dict[str, Any]:
    """Read every GPU through ``detector.gpu.nvml`` (v2 and v1 memory) and format sample lines."""
    try:
        import pynvml

        from detector.gpu import nvml
        from detector.gpu.sample import csv_line
    except ImportError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    try:
        gpus = nvml.open_nvml()
    except nvml.GpuError as exc:
        return {"error": str(exc), "reason": exc.reason}
    try:
        now = time.time()
        readings = gpus.read_gpus()
        v1 = [gpus.memory(pynvml.nvmlDeviceGetHandleByIndex(r.index), v2=False) for r in readings]
        return {
            "driver": gpus.driver_version(),
            "pynvml": metadata.version("nvidia-ml-py"),
            "readings": [_reading(r) for r in readings],
            "v1_memory": [dict(zip(("used", "total", "free"), m[:3], strict=True)) for m in v1],
            "sample_lines": [csv_line(r, now) for r in readings],
            "sample_lines_node": [csv_line(r, now, "h200-node-1") for r in readings],
        }
    except nvml.GpuError as exc:
        return {"error": str(exc), "reason": exc.reason}
    finally:
        gpus.close()


def _reading(reading: Any) -> dict[str, Any]:
    out = {key: getattr(reading, key) for key in reading.__slots__ if key != "processes"}
    procs = reading.processes
    out["processes"] = None if procs is None else [[p.pid, p.used_bytes] for p in procs]
    return out


def hold_and_read(hold_gib: int, timeout_s: float) -> dict[str, Any]:
    """Hold ``hold_gib`` in a torch process and read NVML, nvidia-smi and torch meanwhile."""
    env = os.environ | {"HOLD_GIB": str(hold_gib)}
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    stdout = child.stdout
    if stdout is not None:
        threading.Thread(target=_pump, args=(stdout, lines), daemon=True).start()
    out: dict[str, Any] = {"hold_gib": hold_gib}
    try:
        ready = lines.get(timeout=timeout_s)
        if not ready.startswith("READY "):
            raise queue.Empty
        out["torch"] = json.loads(ready[6:])
        out["nvidia_smi"] = nvidia_smi()
        out["adapter"] = adapter_readings()
    except queue.Empty:
        out["error"] = "holder did not report READY"
    finally:
        _stop(child)
        out["holder_stderr"] = (child.stderr.read() if child.stderr else "")[-STDERR_KEEP:]
    return out


def _pump(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)
    lines.put("")  # end of output: the holder exited


def _stop(child: subprocess.Popen[str]) -> None:
    try:
        if child.stdin:
            child.stdin.close()
        child.wait(timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def agreement(held: dict[str, Any], margin_mib: int) -> dict[str, Any]:
    """Compare NVML (v2, v1), nvidia-smi and torch while the holder holds its memory."""
    try:
        reading = held["adapter"]["readings"][0]
        row = held["nvidia_smi"]["query_csv"]["stdout"].splitlines()[1].split(", ")
        torch_info = held["torch"]
    except (KeyError, IndexError, TypeError) as exc:
        return {"error": f"nothing to compare: {type(exc).__name__}: {exc}"}
    smi_used, smi_total = int(row[3].split()[0]), int(row[4].split()[0])
    holder = [p for p in reading["processes"] or [] if p[0] == torch_info["pid"]]
    numbers = {
        "nvml_v2_used_mib": reading["used_bytes"] / MIB,
        "nvml_v2_reserved_mib": (reading["reserved_bytes"] or 0) / MIB,
        "nvml_v1_used_mib": held["adapter"]["v1_memory"][0]["used"] / MIB,
        "nvml_total_mib": reading["total_bytes"] / MIB,
        "nvml_free_mib": reading["free_bytes"] / MIB,
        "smi_used_mib": smi_used,
        "smi_total_mib": smi_total,
        "torch_reserved_mib": torch_info["reserved_bytes"] / MIB,
        "torch_used_mib": (torch_info["total_bytes"] - torch_info["free_bytes"]) / MIB,
        "torch_total_mib": torch_info["total_bytes"] / MIB,
        "torch_free_mib": torch_info["free_bytes"] / MIB,
        "holder_process_mib": holder[0][1] / MIB if holder and holder[0][1] else None,
    }
    checks = {
        "smi_used_equals_nvml_v2_floor": smi_used == reading["used_bytes"] // MIB,
        "smi_within_margin_of_nvml_v2": abs(smi_used - numbers["nvml_v2_used_mib"]) <= margin_mib,
        "torch_within_margin_of_nvml_v2": abs(
            numbers["torch_used_mib"] - numbers["nvml_v2_used_mib"]
        )
        <= margin_mib,
        "torch_free_within_margin_of_nvml": abs(
            numbers["torch_free_mib"] - numbers["nvml_free_mib"]
        )
        <= margin_mib,
        "totals_agree": smi_total == reading["total_bytes"] // MIB,
        "holds_what_torch_reserved": numbers["nvml_v2_used_mib"] >= numbers["torch_reserved_mib"],
    }
    return {"numbers": numbers, "checks": checks}


def capture_case(name: str, env: dict[str, str], code: str, timeout_s: float) -> dict[str, Any]:
    """Run one OOM case in its own process group; keep its capture line and stderr."""
    started = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | env,
        start_new_session=True,
    )
    try:
        stdout, stderr = child.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        stdout, stderr = child.communicate()
        timed_out = True
    out: dict[str, Any] = {"case": name, "env": env, "rc": child.returncode}
    out |= {"timed_out": timed_out, "seconds": round(time.monotonic() - started, 1)}
    for line in stdout.splitlines():
        if line.startswith("CAPTURE "):
            out["capture"] = json.loads(line[8:])
        elif line.startswith("SKIP "):
            out["skipped"] = line[5:]
    out["stderr_tail"] = stderr[-STDERR_KEEP:]
    out["last_lines"] = [ln for ln in stderr.splitlines() if ln.strip()][-12:]
    return out


def environment() -> dict[str, Any]:
    """Record the machine: GPUs, driver, Python and the framework versions (not imported)."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {
        "date": datetime.now(tz=UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "packages": versions,
        "nvidia_smi_L": run(["nvidia-smi", "-L"]),
        "nvidia_smi_found": shutil.which("nvidia-smi") is not None,
    }


def main(argv: list[str] | None = None) -> int:
    """Capture everything into ``--out``; 0 unless the arguments are wrong."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "capture_out")))
    parser.add_argument("--hold-gib", type=int, default=100)
    parser.add_argument("--step-gib", type=int, default=8)
    parser.add_argument("--too-big-gib", type=int, default=200)
    parser.add_argument("--margin-mib", type=int, default=64)
    parser.add_argument("--case-timeout-s", type=float, default=75.0)
    parser.add_argument("--budget-s", type=float, default=280.0, help="skip cases after this")
    parser.add_argument("--cases", default="", help="comma-separated subset of the cases")
    args = parser.parse_args(argv)
    all_cases = cases(args.hold_gib, args.step_gib, args.too_big_gib)
    chosen = [c for c in args.cases.split(",") if c] or list(all_cases)
    if unknown := [c for c in chosen if c not in all_cases]:
        parser.error(f"unknown cases {unknown}; known: {list(all_cases)}")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result: dict[str, Any] = {"environment": environment()}
    _save(args.out, result)
    result["idle"] = {"nvidia_smi": nvidia_smi(), "adapter": _step(adapter_readings)}
    loop = ["timeout", "1.6", "nvidia-smi", f"--query-gpu={QUERY}", "--format=csv", "-lms", "500"]
    result["idle"]["nvidia_smi"]["loop"] = run(loop)  # does -l repeat the header?
    _save(args.out, result)
    result["holding"] = _step(hold_and_read, args.hold_gib, args.case_timeout_s)
    result["agreement"] = _step(agreement, result["holding"], args.margin_mib)
    print(json.dumps(result["agreement"], indent=1), flush=True)
    _save(args.out, result)
    result["ooms"] = []
    for name in chosen:
        if time.monotonic() - started > args.budget_s:
            result["ooms"].append({"case": name, "skipped": "budget spent"})
            continue
        env, code = all_cases[name]
        case = _step(capture_case, name, env, code, args.case_timeout_s)
        result["ooms"].append(case)
        print(f"== {name} rc={case.get('rc')} {case.get('seconds')} s", flush=True)
        print("\n".join(case.get("last_lines", [case.get("error", "")])[-4:]), flush=True)
        _save(args.out, result)
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)
    return 0


def _step(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run one step; a bug in it is recorded, and the other steps still run."""
    try:
        return fn(*args)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def _save(out: Path, result: dict[str, Any]) -> None:
    (out / "captures.json").write_text(json.dumps(result, indent=1, default=str))
    for state in ("idle", "holding"):
        smi = result.get(state, {}).get("nvidia_smi", {})
        for key, suffix in (("table", "txt"), ("query_csv", "csv")):
            text = smi.get(key, {}).get("stdout")
            if text:
                (out / f"nvidia_smi_{key}_{state}.{suffix}").write_text(text)
    texts = [
        f"===== {c['case']} rc={c.get('rc')} =====\n{c.get('stderr_tail', c.get('skipped', ''))}"
        for c in result.get("ooms", [])
    ]
    if texts:
        (out / "oom_texts.txt").write_text("\n".join(texts))


if __name__ == "__main__":
    sys.exit(main())
