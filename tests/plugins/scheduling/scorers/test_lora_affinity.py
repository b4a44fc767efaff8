"""lora-affinity-scorer: running 1.0, room 0.8, waiting only 0.6, else 0."""

from __future__ import annotations

from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.types import CycleState, DefaultScores
from heimdall_proxy.plugins.scheduling.scorers.lora_affinity import LoraAffinityScorer
from tests.helpers import ep
from tests.plugins.helpers import req


def test_adapter_states() -> None:
    pods = [
        ep("running", lora_running=("sql",), max_lora=1),
        ep("room", lora_running=("chat",), max_lora=2),
        ep("waiting", lora_running=("chat",), lora_waiting=("sql",), max_lora=2),
        ep("full", lora_running=("chat", "code"), max_lora=2),
        ep("no-lora", max_lora=0),
    ]
    scorer = LoraAffinityScorer("l", NoParams(), None)  # type: ignore[arg-type]
    got = scorer.score(CycleState(), req(model="sql"), pods)
    assert got == {"running": 1.0, "room": 0.8, "waiting": 0.6, "full": 0.0, "no-lora": 0.0}


def test_running_beats_room_even_when_waiting_too() -> None:
    scorer = LoraAffinityScorer("l", NoParams(), None)  # type: ignore[arg-type]
    pod = ep("p", lora_running=("sql",), lora_waiting=("sql",), max_lora=4)
    assert scorer.score(CycleState(), req(model="sql"), [pod]) == {"p": 1.0}


def test_pods_without_adapters_score_room_without_being_listed() -> None:
    """A pod with no adapter and room for one scores 0.8 (the DefaultScores default); one
    without LoRA support (max_lora 0) scores 0.0 and is listed."""
    pods = [ep("idle", max_lora=4), ep("no-lora", max_lora=0), ep("busy", lora_running=("x",))]
    scorer = LoraAffinityScorer("l", NoParams(), None)  # type: ignore[arg-type]
    got = scorer.score(CycleState(), req(model="sql"), pods)
    assert got == {"idle": 0.8, "no-lora": 0.0, "busy": 0.0}
    assert isinstance(got, DefaultScores) and set(got.changed) == {"no-lora", "busy"}
