"""The scheduling cycle: filters, weighted clamped scoring, pickers, the profile-handler loop."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import pytest

from heimdall_proxy.framework.log import V5
from heimdall_proxy.framework.plugins import SchedulerProfileView
from heimdall_proxy.framework.scheduler import (
    Scheduler,
    SchedulerProfile,
    WeightedScorer,
)
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    SchedulingError,
    SchedulingResult,
    ScoredEndpoint,
)
from heimdall_proxy.plugins.scheduling.profiles.single import SingleProfileHandler
from tests.helpers import ep


def req() -> InferenceRequest:
    return InferenceRequest(
        api="completions", path="/v1/completions", model="m", body=b"{}", data={}, headers={}
    )


class FixedScorer:
    """Returns canned scores; records what it was given."""

    type = "fixed-scorer"

    def __init__(self, name: str, scores: Mapping[str, float]) -> None:
        self.name = name
        self.scores = dict(scores)
        self.seen: list[list[str]] = []

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        self.seen.append([e.name for e in endpoints])
        return self.scores


class DropFilter:
    """Removes the named endpoints; records its input and writes its call order on state."""

    type = "drop-filter"

    def __init__(self, name: str, drop: set[str]) -> None:
        self.name = name
        self.drop = drop
        self.seen: list[list[str]] = []

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        self.seen.append([e.name for e in endpoints])
        state.setdefault("order", []).append(self.name)
        return [e for e in endpoints if e.name not in self.drop]


class RecordingPicker:
    """Picks the first scored endpoint; keeps the scored list for inspection."""

    type = "recording-picker"

    def __init__(self, name: str = "picker", ranked: bool = False) -> None:
        self.name = name
        self.ranked = ranked
        self.scored: list[ScoredEndpoint] = []

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: list[ScoredEndpoint]
    ) -> ProfileResult:
        self.scored = list(scored)
        ranked = [s.endpoint for s in scored] if self.ranked else []
        return ProfileResult(targets=[scored[0].endpoint], ranked=ranked)

    def totals(self) -> dict[str, float]:
        return {s.endpoint.name: s.score for s in self.scored}


def run_profile(
    endpoints: list[Endpoint],
    scorers: list[WeightedScorer],
    filters: list[DropFilter] | None = None,
    picker: RecordingPicker | None = None,
) -> tuple[ProfileResult | None, RecordingPicker]:
    picker = picker or RecordingPicker()
    profile = SchedulerProfile("p", list(filters or []), scorers, picker)
    return profile.run(CycleState(), req(), endpoints), picker


# -- scoring ------------------------------------------------------------------------------


def test_weighted_sum_of_scores() -> None:
    a, b, c = ep("a"), ep("b"), ep("c")
    s1 = FixedScorer("s1", {"a": 0.5, "b": 1.0, "c": 0.0})
    s2 = FixedScorer("s2", {"a": 1.0, "b": 0.25, "c": 0.5})
    _, picker = run_profile([a, b, c], [WeightedScorer(s1, 2.0), WeightedScorer(s2, 3.0)])
    totals = picker.totals()
    assert totals == pytest.approx({"a": 2 * 0.5 + 3 * 1.0, "b": 2 * 1.0 + 3 * 0.25, "c": 1.5})
    # Scored list keeps the post-filter order.
    assert [s.endpoint for s in picker.scored] == [a, b, c]


def test_scores_are_clamped_and_nan_counts_as_zero() -> None:
    names = ["over", "under", "nan", "inf", "neginf", "half", "missing"]
    endpoints = [ep(n) for n in names]
    scorer = FixedScorer(
        "s",
        {
            "over": 7.0,
            "under": -3.0,
            "nan": math.nan,
            "inf": math.inf,
            "neginf": -math.inf,
            "half": 0.5,
            "unknown-pod": 1.0,
        },
    )
    _, picker = run_profile(endpoints, [WeightedScorer(scorer, 2.0)])
    assert picker.totals() == {
        "over": 2.0,
        "under": 0.0,
        "nan": 0.0,
        "inf": 2.0,
        "neginf": 0.0,
        "half": 1.0,
        "missing": 0.0,
    }


def test_weight_zero_ignores_scorer_and_default_without_scorers_is_zero() -> None:
    a, b = ep("a"), ep("b")
    _, picker = run_profile([a, b], [WeightedScorer(FixedScorer("s", {"a": 1.0}), 0.0)])
    assert picker.totals() == {"a": 0.0, "b": 0.0}
    _, picker = run_profile([a, b], [])
    assert picker.totals() == {"a": 0.0, "b": 0.0}


def test_scorers_see_only_filtered_endpoints() -> None:
    a, b, c = ep("a"), ep("b"), ep("c")
    scorer = FixedScorer("s", {"a": 1.0, "b": 1.0, "c": 1.0})
    flt = DropFilter("f", {"b"})
    result, picker = run_profile([a, b, c], [WeightedScorer(scorer, 1.0)], [flt])
    assert scorer.seen == [["a", "c"]]
    assert [s.endpoint.name for s in picker.scored] == ["a", "c"]
    assert result is not None
    assert result.targets == [a]


# -- filters ------------------------------------------------------------------------------


def test_filters_run_in_order_each_on_the_previous_output() -> None:
    a, b, c, d = ep("a"), ep("b"), ep("c"), ep("d")
    f1, f2, f3 = DropFilter("f1", {"a"}), DropFilter("f2", {"c"}), DropFilter("f3", set())
    state = CycleState()
    picker = RecordingPicker()
    profile = SchedulerProfile("p", [f1, f2, f3], [], picker)
    result = profile.run(state, req(), [a, b, c, d])
    assert state["order"] == ["f1", "f2", "f3"]
    assert f1.seen == [["a", "b", "c", "d"]]
    assert f2.seen == [["b", "c", "d"]]
    assert f3.seen == [["b", "d"]]
    assert result is not None
    assert result.targets == [b]


def test_filter_leaving_nothing_ends_profile_with_none() -> None:
    a, b = ep("a"), ep("b")
    f1, f2 = DropFilter("f1", {"a", "b"}), DropFilter("f2", set())
    scorer = FixedScorer("s", {})
    picker = RecordingPicker()
    result, _ = run_profile([a, b], [WeightedScorer(scorer, 1.0)], [f1, f2], picker)
    assert result is None
    assert f2.seen == []  # later filters are not run
    assert scorer.seen == []
    assert picker.scored == []


# -- ranked / fallback order --------------------------------------------------------------


def test_ranked_defaults_to_score_order_when_picker_leaves_it_empty() -> None:
    a, b, c = ep("a"), ep("b"), ep("c")
    scorer = FixedScorer("s", {"a": 0.1, "b": 0.9, "c": 0.5})
    result, _ = run_profile([a, b, c], [WeightedScorer(scorer, 1.0)])
    assert result is not None
    assert result.targets == [a]
    assert result.ranked == [b, c, a]


def test_ranked_from_picker_is_kept() -> None:
    a, b = ep("a"), ep("b")
    scorer = FixedScorer("s", {"a": 0.0, "b": 1.0})
    result, _ = run_profile(
        [a, b], [WeightedScorer(scorer, 1.0)], picker=RecordingPicker(ranked=True)
    )
    assert result is not None
    assert result.ranked == [a, b]


def test_fallback_order_is_picked_first_then_the_ranked_rest() -> None:
    a, b, c, d = ep("a"), ep("b"), ep("c"), ep("d")
    result = SchedulingResult(
        {"x": ProfileResult(targets=[c, a], ranked=[a, b, c, d])}, primary_profile="x"
    )
    assert result.fallback_order() == [c, a, b, d]
    assert result.primary.targets == [c, a]


def test_primary_missing_raises_lookup_error() -> None:
    result = SchedulingResult({"x": None}, primary_profile="x")
    with pytest.raises(LookupError, match="'x'"):
        _ = result.primary


# -- the scheduler loop -------------------------------------------------------------------


def single_handler() -> SingleProfileHandler:
    return SingleProfileHandler("single-profile-handler", None, None)  # type: ignore[arg-type]


def test_scheduler_with_single_profile_handler() -> None:
    a, b = ep("a"), ep("b")
    scorer = FixedScorer("s", {"a": 0.2, "b": 0.8})
    profile = SchedulerProfile("default", [], [WeightedScorer(scorer, 1.0)], RecordingPicker())
    sched = Scheduler(single_handler(), {"default": profile})
    result = sched.schedule(CycleState(), req(), [b, a])
    assert result.primary_profile == "default"
    assert result.primary.targets == [b]
    assert result.fallback_order() == [b, a]
    assert scorer.seen == [["b", "a"]]  # ran exactly once


def test_scheduler_raises_scheduling_error_when_filters_leave_nothing() -> None:
    profile = SchedulerProfile("only", [DropFilter("f", {"a"})], [], RecordingPicker())
    sched = Scheduler(single_handler(), {"only": profile})
    with pytest.raises(SchedulingError, match="'only'"):
        sched.schedule(CycleState(), req(), [ep("a")])


class TwoStepHandler:
    """Runs "first", then "second" (or `repeat` again when set), then stops."""

    type = "two-step-handler"
    name = "two-step"

    def __init__(self, repeat: str | None = None) -> None:
        self.repeat = repeat
        self.calls: list[list[str]] = []

    def validate_profiles(self, profiles: Mapping[str, SchedulerProfileView]) -> None:
        """Works with any profiles."""

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        self.calls.append(sorted(results))
        if not results:
            return ["first"]
        if len(results) == 1:
            return [self.repeat or "second"]
        return []

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: dict[str, ProfileResult | None],
    ) -> SchedulingResult:
        return SchedulingResult(results, "second")


def test_scheduler_loop_runs_profiles_in_handler_order() -> None:
    a, b = ep("a"), ep("b")
    first = SchedulerProfile("first", [DropFilter("fa", {"b"})], [], RecordingPicker())
    second = SchedulerProfile("second", [DropFilter("fb", {"a"})], [], RecordingPicker())
    handler = TwoStepHandler()
    state = CycleState()
    result = Scheduler(handler, {"first": first, "second": second}).schedule(state, req(), [a, b])
    assert handler.calls == [[], ["first"], ["first", "second"]]
    assert state["order"] == ["fa", "fb"]
    first_result = result.profile_results["first"]
    assert first_result is not None
    assert first_result.targets == [a]
    assert result.primary.targets == [b]


def test_profile_picked_twice_is_a_runtime_error() -> None:
    first = SchedulerProfile("first", [], [], RecordingPicker())
    sched = Scheduler(TwoStepHandler(repeat="first"), {"first": first})
    with pytest.raises(RuntimeError, match=r"'two-step'.*'first' twice"):
        sched.schedule(CycleState(), req(), [ep("a")])


# -- timers and logging -------------------------------------------------------------------


def test_timers_are_made_per_plugin_and_observed_per_call() -> None:
    made: list[tuple[str, str, str]] = []
    observed: dict[tuple[str, str, str], list[float]] = {}

    def timers(point: str, plugin_type: str, plugin_name: str):  # type: ignore[no-untyped-def]
        key = (point, plugin_type, plugin_name)
        made.append(key)
        observed[key] = []
        return observed[key].append

    flt = DropFilter("keep-all", set())
    s1, s2 = FixedScorer("s1", {"a": 1.0}), FixedScorer("s2", {"a": 0.5})
    picker = RecordingPicker("pk")
    handler = single_handler()
    profile = SchedulerProfile(
        "default", [flt], [WeightedScorer(s1, 1.0), WeightedScorer(s2, 1.0)], picker, timers
    )
    sched = Scheduler(handler, {"default": profile}, timers)
    assert made == [
        ("Filter", "drop-filter", "keep-all"),
        ("Scorer", "fixed-scorer", "s1"),
        ("Scorer", "fixed-scorer", "s2"),
        ("Picker", "recording-picker", "pk"),
        ("ProfileHandler", "single-profile-handler", "single-profile-handler"),
    ]
    for _ in range(3):
        sched.schedule(CycleState(), req(), [ep("a"), ep("b")])
    counts = {k: len(v) for k, v in observed.items()}
    assert counts == {
        ("Filter", "drop-filter", "keep-all"): 3,
        ("Scorer", "fixed-scorer", "s1"): 3,
        ("Scorer", "fixed-scorer", "s2"): 3,
        ("Picker", "recording-picker", "pk"): 3,
        # pick_profiles is called twice per cycle: once to start, once to finish
        ("ProfileHandler", "single-profile-handler", "single-profile-handler"): 6,
    }
    assert all(d >= 0.0 for durations in observed.values() for d in durations)


def test_timer_names_default_to_class_name_without_type_attribute() -> None:
    made: list[tuple[str, str, str]] = []

    def timers(point: str, plugin_type: str, plugin_name: str):  # type: ignore[no-untyped-def]
        made.append((point, plugin_type, plugin_name))
        return lambda _d: None

    class Bare:
        def pick(self, state, request, scored):  # type: ignore[no-untyped-def]
            return ProfileResult([scored[0].endpoint])

    SchedulerProfile("p", [], [], Bare(), timers)
    assert made == [("Picker", "Bare", "Bare")]


def test_verbose_logging_path(caplog: pytest.LogCaptureFixture) -> None:
    a, b = ep("a"), ep("b")
    scorer = FixedScorer("s", {"a": 0.3, "b": 0.6})
    with caplog.at_level(V5, logger="heimdall_proxy.framework.scheduler"):
        result, _ = run_profile([a, b], [WeightedScorer(scorer, 1.0)], [DropFilter("f", set())])
    assert result is not None
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "Running filter",
        "Running scorer",
        "Scores",
        "Running picker",
        "Picked endpoints",
    ]
    scores = next(r for r in caplog.records if r.getMessage() == "Scores")
    assert scores.scores == {"a": 0.3, "b": 0.6}  # type: ignore[attr-defined]
    assert caplog.records[-1].targets == ["a"]  # type: ignore[attr-defined]


def test_quiet_by_default(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="heimdall_proxy.framework.scheduler"):
        run_profile([ep("a")], [], [DropFilter("f", set())])
    assert caplog.records == []


class RaisingScorer:
    type = "raising-scorer"

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        self.calls += 1
        raise TypeError("a bug in this scorer")


def test_a_scorer_that_raises_is_left_out_and_logged_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import heimdall_proxy.framework.scheduler as scheduler

    monkeypatch.setattr(scheduler, "_scorer_failures", {})
    a, b = ep("a"), ep("b")
    broken = RaisingScorer("broken")
    good = FixedScorer("good", {"a": 0.2, "b": 0.9})
    scorers = [WeightedScorer(broken, 5.0), WeightedScorer(good, 1.0)]
    with caplog.at_level(logging.ERROR, logger="heimdall_proxy.framework.scheduler"):
        for _ in range(3):
            result, picker = run_profile([a, b], scorers)
            assert result is not None
            assert picker.totals() == pytest.approx({"a": 0.2, "b": 0.9})  # the others' sum
    assert broken.calls == 3
    failures = [r for r in caplog.records if "scorer 'broken' failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None
    clock = scheduler.time.monotonic() + scheduler.SCORER_FAILURE_LOG_INTERVAL + 1.0
    monkeypatch.setattr(scheduler.time, "monotonic", lambda: clock)
    with caplog.at_level(logging.ERROR, logger="heimdall_proxy.framework.scheduler"):
        run_profile([a, b], scorers)
    failures = [r for r in caplog.records if "scorer 'broken' failed" in r.getMessage()]
    assert len(failures) == 2
    assert "2 more failures since the last report" in failures[1].getMessage()
