"""`detector replay` with an armed workload and a configured nginx acts for real.

The settings come from the environment, as in production: ``DETECTOR_DRY_RUN=false``, the
cascade's workload armed, and ``DETECTOR_CONTAINMENT__NGINX__*`` naming the nginx that the test
started (the fixture of test_nginx_actuator.py). The replayed cascade's rate-limit step must
reach that nginx, which then queues a burst up to its size and answers 429 beyond it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from test_nginx_actuator import BURST_N, RunningNginx, burst, nginx

__all__ = ["nginx"]  # a fixture, used by name
CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade"


def _env(gw: RunningNginx) -> dict[str, str]:
    g = gw.gateway
    env = {
        "DETECTOR_DRY_RUN": "false",
        "DETECTOR_CONTAINMENT__ARMED_WORKLOADS": '["llm/vllm-llama"]',
        "DETECTOR_CONTAINMENT__NGINX__CONF_PATH": str(g.conf_path),
        "DETECTOR_CONTAINMENT__NGINX__HTTP_INCLUDE": str(g.http_include),
        "DETECTOR_CONTAINMENT__NGINX__LOCATION_INCLUDE": str(g.location_include),
        "DETECTOR_CONTAINMENT__NGINX__NGINX_BIN": g.nginx_bin,
    }
    for name, value in (("PREFIX", g.prefix), ("PID_FILE", g.pid_file), ("ERROR_LOG", g.error_log)):
        if value is not None:
            env[f"DETECTOR_CONTAINMENT__NGINX__{name}"] = str(value)
    return env


def test_an_armed_replay_makes_nginx_answer_429(nginx: RunningNginx, tmp_path: Path) -> None:
    before, _ = burst(nginx.port)
    assert before[200] == BURST_N
    args = [sys.executable, "-m", "detector", "replay", "--json"]
    args += ["--db", f"sqlite:///{tmp_path / 'store.db'}", str(CASCADE)]
    done = subprocess.run(
        args, env={**os.environ, **_env(nginx)}, capture_output=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    (incident,) = json.loads(done.stdout)["incidents"]
    rate = next(s for s in incident["steps"] if s["action"] == "enable_rate_limit")
    entries = [t["message"] for t in incident["timeline"] if "enable_rate_limit" in t["message"]]
    assert rate["status"] != "dry_run", entries
    # the limit was in force when the errors stopped: containment, not the pods alone, did it
    (contained,) = [
        t for t in incident["timeline"] if t["message"].startswith("stage -> contained")
    ]
    assert contained["detail"]["recovered_by"] == "containment", contained
    assert contained["message"].endswith("containment did it (step 3 enable_rate_limit applied)")
    # at once, as clients do: the limit queues what its burst holds (limit_req without nodelay,
    # served at the rate) and answers 429 beyond it; a sequential burst would only be slowed
    with ThreadPoolExecutor(BURST_N) as pool:
        after = Counter(pool.map(lambda _: burst(nginx.port, 1)[0].most_common(1)[0][0],
                                 range(BURST_N)))  # fmt: skip
    assert after[429] > 0 and after[200] > 0, (after, entries)
