"""The scheduling cycle: the profile handler picks profiles until done; each profile runs its
filters, then its scorers (weighted sum of clamped scores), then its picker."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from heimdall_proxy.framework.log import V4, V5
from heimdall_proxy.framework.plugins import Filter, Picker, ProfileHandler, Scorer
from heimdall_proxy.framework.spans import SPANS_KEY, RequestSpans
from heimdall_proxy.framework.trace import TRACE_KEY, ScheduleTrace, ScorerTrace
from heimdall_proxy.framework.types import (
    AlignedScores,
    CandidateNames,
    CycleState,
    DefaultScores,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    SchedulingResult,
    ScoredEndpoints,
)

log = logging.getLogger(__name__)

#: Records one plugin call's duration in seconds.
Observe = Callable[[float], None]
#: Makes the Observe for (extension point, plugin type, plugin name).
TimerFactory = Callable[[str, str, str], Observe]


def _no_timer(_: float) -> None:
    return None


#: Seconds between two logged tracebacks of one failing scorer (a scorer that raises on every
#: request would otherwise write one per request).
SCORER_FAILURE_LOG_INTERVAL = 10.0
#: scorer name -> when its failure was last logged, and how many went unlogged since
_scorer_failures: dict[str, tuple[float, int]] = {}


def _scorer_failed(scorer: str, profile: str) -> None:
    """A scorer raised: the request is scheduled without its scores (as prepare-data plugins
    and producers fail open in the director), and the traceback is logged at most once per
    SCORER_FAILURE_LOG_INTERVAL per scorer, with the count of failures not logged since. A
    scorer only ranks pods that the filters already allowed, so dropping its opinion never
    sends a request where it must not go; failing the request turned one plugin's bug into a
    500 for every request (as a filter's debug field that could not be serialised did: filters
    still fail it, since a filter may be all that keeps a request off a pod it must not
    reach)."""
    now = time.monotonic()
    last, unlogged = _scorer_failures.get(scorer, (-SCORER_FAILURE_LOG_INTERVAL, 0))
    if now - last < SCORER_FAILURE_LOG_INTERVAL:
        _scorer_failures[scorer] = (last, unlogged + 1)
        return
    _scorer_failures[scorer] = (now, 0)
    log.exception(
        "scorer %r failed in profile %r; scheduling without its scores (%d more failures since "
        "the last report)",
        scorer,
        profile,
        unlogged,
    )


def no_timers(_point: str, _type: str, _name: str) -> Observe:
    return _no_timer


def _plugin_type(plugin: object) -> str:
    return str(getattr(plugin, "type", type(plugin).__name__))


def _plugin_name(plugin: object) -> str:
    return str(getattr(plugin, "name", _plugin_type(plugin)))


@dataclass(slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


def _add_dense(
    totals: list[float],
    weight: float,
    default: float,
    scores: Mapping[str, float],
    names: list[str],
) -> list[float]:
    """`totals` plus `weight` times each pod's score clamped to [0, 1] (NaN counts as 0;
    a pod missing from `scores` scores `default`). Nothing is added for a score <= 0, so the
    sums are the same floats, in the same order, as adding pod by pod."""
    values = map(scores.get, names, repeat(default))
    return [
        t + weight * (1.0 if v > 1.0 else v) if v > 0.0 else t
        for t, v in zip(totals, values, strict=True)
    ]


def _add_sparse(
    totals: list[float],
    weight: float,
    default: float,
    scores: Mapping[str, float],
    index: dict[str, int],
) -> list[float]:
    """`_add_dense` for a `scores` that names few pods: the pods it names get their own
    score, every other pod `default`, added once as a constant."""
    fixed = []
    for pod, v in scores.items():
        i = index.get(pod)
        if i is not None:
            t = totals[i]
            fixed.append((i, t + weight * (1.0 if v > 1.0 else v) if v > 0.0 else t))
    if default > 0.0:
        add = weight * (1.0 if default > 1.0 else default)
        totals = [t + add for t in totals]
    for i, t in fixed:
        totals[i] = t
    return totals


class _Sums:
    """A profile's running weighted sums. While every scorer so far named few pods, the pods
    never named share one sum (`base`) and only the named ones have their own (`own`, by
    position), so a scorer's default costs one addition, not one per pod; the first scorer
    that names most pods makes the list. Either way each pod's sum is the same floats added
    in the same order as pod by pod."""

    __slots__ = ("_n", "_totals", "base", "own")

    def __init__(self, n: int) -> None:
        self._n = n
        self.base = 0.0
        self.own: dict[int, float] = {}
        self._totals: list[float] | None = None

    def add_sparse(
        self, weight: float, default: float, scores: Mapping[str, float], index: dict[str, int]
    ) -> None:
        if self._totals is not None:
            self._totals = _add_sparse(self._totals, weight, default, scores, index)
            return
        own, base = self.own, self.base
        named: dict[int, float] = {}
        for pod, v in scores.items():
            i = index.get(pod)
            if i is not None:
                t = own.get(i, base)
                named[i] = t + weight * (1.0 if v > 1.0 else v) if v > 0.0 else t
        if default > 0.0:
            add = weight * (1.0 if default > 1.0 else default)
            for i, t in own.items():
                own[i] = t + add
            self.base = base + add
        own.update(named)  # named pods: their own score instead of the default

    def add_dense(
        self, weight: float, default: float, scores: Mapping[str, float], names: list[str]
    ) -> None:
        self._totals = _add_dense(self.list(), weight, default, scores, names)

    def add(
        self,
        weight: float,
        scores: Mapping[str, float],
        endpoints: list[Endpoint],
        known: CandidateNames,
    ) -> None:
        """Add a scorer's answer by name: a DefaultScores as its default plus the pods it
        names, any other Mapping pod by pod; sparsely when it names few pods."""
        table: Mapping[str, float]
        # most scorers answer a plain dict: tell it apart without the ABC check
        if (
            type(scores) is not dict
            and isinstance(scores, DefaultScores)
            and scores.endpoints is endpoints
        ):
            default, table = scores.default, scores.changed
        else:
            default, table = 0.0, scores
        names = known.names
        if len(table) * 4 < len(names) and (index := known.index()) is not None:
            self.add_sparse(weight, default, table, index)
        else:
            self.add_dense(weight, default, table, names)

    def add_aligned(self, weight: float, values: list[float] | np.ndarray) -> None:
        """`values[i]` is the score of the i-th candidate (clamped as `_add_dense` does)."""
        if isinstance(values, np.ndarray):
            # the same operations per pod (clamp, times weight, plus the sum; nothing added
            # for a score <= 0 or NaN), in one numpy pass instead of a loop over the pool
            if self._totals is None and not self.own:
                sums = np.full(self._n, self.base)
            else:
                sums = np.asarray(self.list(), dtype=float)
            added = sums + weight * np.minimum(values, 1.0)
            self._totals = np.where(values > 0.0, added, sums).tolist()
            return
        self._totals = [
            t + weight * (1.0 if v > 1.0 else v) if v > 0.0 else t
            for t, v in zip(self.list(), values, strict=True)
        ]

    def list(self) -> list[float]:
        """Every pod's sum, in candidate order."""
        if self._totals is None:
            totals = [self.base] * self._n
            for i, t in self.own.items():
                totals[i] = t
            self._totals = totals
        return self._totals


class SchedulerProfile:
    """A named pipeline of filters -> scorers -> picker."""

    __slots__ = ("_filters", "_picker", "_picker_timer", "_scorers", "name")

    def __init__(
        self,
        name: str,
        filters: list[Filter],
        scorers: list[WeightedScorer],
        picker: Picker,
        timers: TimerFactory = no_timers,
    ) -> None:
        self.name = name
        self._filters = [
            (f, _plugin_name(f), timers("Filter", _plugin_type(f), _plugin_name(f)))
            for f in filters
        ]
        self._scorers = [
            (
                s.scorer,
                s.weight,
                _plugin_name(s.scorer),
                timers("Scorer", _plugin_type(s.scorer), _plugin_name(s.scorer)),
            )
            for s in scorers
        ]
        self._picker = picker
        self._picker_timer = timers("Picker", _plugin_type(picker), _plugin_name(picker))

    @property
    def filters(self) -> list[Filter]:
        return [f for f, _, _ in self._filters]

    @property
    def scorers(self) -> list[WeightedScorer]:
        return [WeightedScorer(s, w) for s, w, _, _ in self._scorers]

    @property
    def picker(self) -> Picker:
        return self._picker

    def run(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> ProfileResult | None:
        """Run the profile over `endpoints`; None when the filters leave nothing."""
        verbose = log.isEnabledFor(V4)
        perf = time.perf_counter
        rid = request.request_id
        trace: ScheduleTrace | None = state.get(TRACE_KEY)
        pt = trace.begin(self.name, [e.name for e in endpoints]) if trace is not None else None
        for flt, name, observe in self._filters:
            if verbose:
                log.log(
                    V4,
                    "Running filter",
                    extra={"filter": name, "profile": self.name, "request_id": rid},
                )
            t0 = perf()
            endpoints = flt.filter(state, request, endpoints)
            observe(perf() - t0)
            if pt is not None:
                pt.filters.append((name, [e.name for e in endpoints]))
            if not endpoints:
                if verbose:
                    log.log(
                        V4,
                        "Filter left no endpoints",
                        extra={"filter": name, "profile": self.name, "request_id": rid},
                    )
                return None

        known = CandidateNames.of(endpoints)
        names = known.names
        sums = _Sums(len(endpoints))
        for scorer, weight, name, observe in self._scorers:
            if verbose:
                log.log(
                    V4,
                    "Running scorer",
                    extra={"scorer": name, "profile": self.name, "request_id": rid},
                )
            t0 = perf()
            try:
                scores = scorer.score(state, request, endpoints)
            except Exception:
                observe(perf() - t0)
                _scorer_failed(name, self.name)
                continue
            observe(perf() - t0)
            if pt is not None:
                raw = {e.name: float(scores.get(e.name, 0.0)) for e in endpoints}
                pt.scorers.append(ScorerTrace(name, weight, raw))
            if type(scores) is AlignedScores and scores.endpoints is endpoints:
                sums.add_aligned(weight, scores.ordered)
            else:
                sums.add(weight, scores, endpoints, known)
            if verbose and log.isEnabledFor(V5):
                log.log(
                    V5, "Scores", extra={"scorer": name, "scores": dict(scores), "request_id": rid}
                )

        totals = sums.list()
        scored = ScoredEndpoints(endpoints, totals)
        if verbose:
            log.log(
                V4,
                "Running picker",
                extra={
                    "picker": _plugin_name(self._picker),
                    "profile": self.name,
                    "request_id": rid,
                },
            )
        t0 = perf()
        result = self._picker.pick(state, request, scored)
        self._picker_timer(perf() - t0)
        if not result.has_ranking():
            order = sorted(range(len(totals)), key=lambda i: -totals[i])
            result.ranked = [endpoints[i] for i in order]
        if pt is not None:
            pt.totals = dict(zip(names, totals, strict=True))
            pt.picked = [e.name for e in result.targets]
            pt.ranked = [e.name for e in result.ranked]
        if verbose:
            log.log(
                V4,
                "Picked endpoints",
                extra={
                    "profile": self.name,
                    "targets": [e.name for e in result.targets],
                    "request_id": rid,
                },
            )
        return result


class Scheduler:
    """Runs the profile-handler loop for a request over its candidate endpoints."""

    __slots__ = ("_timer", "handler", "profiles")

    def __init__(
        self,
        handler: ProfileHandler,
        profiles: Mapping[str, SchedulerProfile],
        timers: TimerFactory = no_timers,
    ) -> None:
        self.handler = handler
        self.profiles = dict(profiles)
        self._timer = timers("ProfileHandler", _plugin_type(handler), _plugin_name(handler))

    def schedule(
        self, state: CycleState, request: InferenceRequest, candidates: list[Endpoint]
    ) -> SchedulingResult:
        """Raises SchedulingError when no endpoint can serve the request."""
        results: dict[str, ProfileResult | None] = {}
        handler = self.handler
        spans: RequestSpans | None = state.get(SPANS_KEY)
        while True:
            t0 = time.perf_counter()
            names = handler.pick_profiles(state, request, self.profiles, results)
            self._timer(time.perf_counter() - t0)
            if not names:
                break
            for name in names:
                if name in results:
                    raise RuntimeError(
                        f"profile handler {_plugin_name(handler)!r} picked profile {name!r} twice"
                    )
                if spans is None:
                    results[name] = self.profiles[name].run(state, request, candidates)
                else:
                    with spans.phase(f"schedule {name}", **{"heimdall.profile": name}) as span:
                        result = self.profiles[name].run(state, request, candidates)
                        if result is not None:
                            span.set_attribute("heimdall.picked", [e.name for e in result.targets])
                        results[name] = result
        return handler.process_results(state, request, results)
