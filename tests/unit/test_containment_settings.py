"""Containment and web settings: validated at load, carried into the flows."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from detector.config import ContainmentSettings, Settings, WebSettings
from detector.runbooks.flows import ContainmentFlows
from detector.runbooks.loader import default_runbook_path, load_runbook
from detector.runbooks.runner import DryRunActuator


def test_defaults_act_on_nothing() -> None:
    settings = Settings()
    assert settings.dry_run is True
    assert settings.containment.armed_workloads == []
    assert settings.containment.approvers == []
    assert settings.containment.kill_switch is False
    assert settings.web.tokens == {}


@pytest.mark.parametrize("bad", ["vllm", "/vllm", "llm/", "a/b/c"])
def test_armed_workloads_are_namespace_slash_workload(bad: str) -> None:
    with pytest.raises(ValidationError, match="namespace/workload"):
        ContainmentSettings(armed_workloads=[bad])


def test_tokens_must_be_long_and_stay_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="shorter than 16"):
        WebSettings(tokens={"alice": "short"})  # type: ignore[dict-item]
    monkeypatch.setenv("DETECTOR_WEB__TOKENS", '{"alice": "0123456789abcdef-long"}')
    monkeypatch.setenv("DETECTOR_CONTAINMENT__APPROVERS", '["alice"]')
    settings = Settings()
    assert settings.web.tokens["alice"].get_secret_value() == "0123456789abcdef-long"
    assert "0123456789abcdef" not in repr(settings)
    assert settings.containment.approvers == ["alice"]


def test_flows_from_settings_carry_arming_kill_switch_and_actuators() -> None:
    settings = Settings(
        dry_run=False,
        containment=ContainmentSettings(armed_workloads=["llm/m"], kill_switch=True),
    )
    actuator = DryRunActuator()
    flows = ContainmentFlows.from_settings(
        load_runbook(default_runbook_path()), settings, {"enable_rate_limit": actuator}
    )
    c = flows.containment
    assert (flows.dry_run, c.dry_run, c.kill_switch) == (False, False, True)
    assert c.armed_workloads == frozenset({"llm/m"})
    assert c.actuators == {"enable_rate_limit": actuator}
    assert ContainmentFlows(flows.runbook).containment.dry_run is True
