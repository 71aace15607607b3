"""End to end through the CLI: `python -m detector ceilings` on real model configs.

The expected numbers are hand-computed in tests/unit/test_ceilings.py; configs and their
sources: tests/unit/fixtures/model_configs/.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "unit" / "fixtures" / "model_configs"
REQUIRED_KEYS = {
    "kv_bytes_per_token",
    "weights_bytes",
    "kv_budget_bytes",
    "max_num_seqs",
    "max_num_batched_tokens",
}


def ceilings(*args: str) -> tuple[int, str, str]:
    """Run ``python -m detector ceilings ARGS``; return exit code, stdout and stderr."""
    cmd = [sys.executable, "-m", "detector", "ceilings", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    return proc.returncode, proc.stdout, proc.stderr


def as_json(*args: str) -> dict[str, Any]:
    code, out, err = ceilings(*args, "--json")
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_design_worked_example_as_text() -> None:
    code, out, err = ceilings(
        "--model-config",
        str(CONFIGS / "llama-3.1-8b.json"),
        "--gpu-memory",
        "80GiB",
        "--utilization",
        "0.9",
        "--max-len",
        "32768",
    )
    assert code == 0, err
    assert "131,072 bytes per token (128 KiB), 4.00 GiB per 32,768-token request" in out
    assert "13.26 requests of 32,768 tokens" in out
    assert "an estimate" in out
    assert "--max-num-seqs 13 --max-num-batched-tokens 8192 --max-model-len 32768" in out
    assert "MAX_CONCURRENT_REQUESTS=13 MAX_BATCH_TOTAL_TOKENS=434512" in out
    assert "--max-running-requests 13 --max-total-tokens 434512" in out


def test_json_for_the_three_models() -> None:
    llama = as_json(
        "--model-config",
        str(CONFIGS / "llama-3.1-8b.json"),
        "--gpu-memory",
        "80GiB",
        "--max-len",
        "32768",
    )
    assert llama.keys() >= REQUIRED_KEYS
    assert (llama["kv_bytes_per_token"], llama["weights_bytes"]) == (131_072, 16_060_522_496)
    assert (llama["kv_budget_bytes"], llama["max_num_seqs"]) == (56_953_921_536, 13)
    assert llama["max_num_batched_tokens"] == 8192
    qwen = as_json(
        "--model-config",
        str(CONFIGS / "qwen2.5-72b-instruct.json"),
        "--gpu-memory",
        "80GiB",
        "--tensor-parallel",
        "4",
        "--engine",
        "vllm",
    )
    assert (qwen["kv_bytes_per_token_per_gpu"], qwen["max_num_seqs"]) == (81_920, 13)
    assert qwen["weights_bytes"] == 145_412_407_296
    assert qwen["engines"] == {
        "vllm": {
            "max_num_seqs": 13,
            "max_num_batched_tokens": 8192,
            "max_model_len": 32_768,
            "gpu_memory_utilization": 0.9,
        }
    }
    mixtral = as_json(
        "--model-config",
        str(CONFIGS / "mixtral-8x7b-instruct-v0.1.json"),
        "--gpu-memory",
        "80GB",
        "--tensor-parallel",
        "2",
        "--replicas-left",
        "3",
    )
    assert (mixtral["kv_cache_tokens"], mixtral["max_num_seqs"]) == (401_472, 12)
    assert mixtral["gateway"]["limit_connections"] == 36


def test_engine_log_calibrates(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(
        "INFO 08-12 10:00:22 [gpu_model_runner.py:2007] Model loading took 14.9889 GiB and "
        "4.61 seconds\n"
        "INFO 08-12 10:00:36 [kv_cache_utils.py:849] GPU KV cache size: 443,024 tokens\n"
    )
    doc = as_json(
        "--model-config",
        str(CONFIGS / "llama-3.1-8b.json"),
        "--gpu-memory",
        "80GiB",
        "--max-len",
        "32768",
        "--engine-log",
        str(log),
    )
    assert doc["from_engine_log"] == ["weights_bytes", "kv_cache_tokens"]
    assert (doc["kv_cache_tokens"], doc["max_num_seqs"]) == (443_024, 13)
    assert doc["runbook_step"]["param"] == "max_num_seqs"


def test_a_model_that_does_not_fit_exits_1() -> None:
    code, out, _ = ceilings(
        "--model-config",
        str(CONFIGS / "mixtral-8x7b-instruct-v0.1.json"),
        "--gpu-memory",
        "80GiB",
    )
    assert code == 1
    assert "Does not fit: weights and reserve (90.99 GiB per GPU)" in out


def test_bad_config_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    config = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    del config["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = ceilings("--model-config", str(path), "--gpu-memory", "80GiB")
    assert code == 2
    assert out == ""
    assert "error:" in err and "num_hidden_layers missing" in err
    assert "Traceback" not in err


def test_bad_arguments_exit_2() -> None:
    config = str(CONFIGS / "llama-3.1-8b.json")
    for args in (
        ("--gpu-memory", "eighty"),
        ("--gpu-memory", "80GiB", "--engine", "triton"),
        ("--gpu-memory", "80GiB", "--tensor-parallel", "3"),
    ):
        code, _, err = ceilings("--model-config", config, *args)
        assert code == 2, args
        assert "error:" in err and "Traceback" not in err
