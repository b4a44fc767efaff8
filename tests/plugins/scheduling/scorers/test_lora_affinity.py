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


def test_a_base_model_request_scores_the_same_everywhere() -> None:
    """The pods' /v1/models cards say which model is the base (no parent): a request for it
    needs no adapter slot, so neither a pod whose slots are full nor one without LoRA
    support scores lower (scored as an adapter, every base-model request went to the one
    pod with no adapter loaded)."""
    cards = {
        "base": {"id": "base", "parent": None},
        "sql": {"id": "sql", "parent": "base"},
    }
    pods = [
        ep("full", lora_running=("sql",), max_lora=1),
        ep("idle", max_lora=1),
        ep("no-lora", max_lora=0),
    ]
    for pod in pods:
        pod.model_cards = cards
    scorer = LoraAffinityScorer("l", NoParams(), None)  # type: ignore[arg-type]
    assert scorer.score(CycleState(), req(model="base"), pods) == dict.fromkeys(
        ("full", "idle", "no-lora"), 0.8
    )
    # the adapter is scored by its slots, as before
    got = scorer.score(CycleState(), req(model="sql"), pods)
    assert got == {"full": 1.0, "idle": 0.8, "no-lora": 0.0}
    # without cards (models from the config), as the reference scores
    for pod in pods:
        pod.model_cards = {"base": {"id": "base", "object": "model"}}
    assert scorer.score(CycleState(), req(model="base"), pods)["full"] == 0.0
