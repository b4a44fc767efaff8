"""Each pod's observed pace, from the streams the gateway relays: time to first chunk and time
per output token. The in-flight ledger learns it (inflight.py `pace`) from every stream that
ran to its end; outstanding-work-scorer counts down the work of requests that are not
streamed by it (they show no progress of their own until their answer arrives), and
finish-time-scorer prices the output tokens still to come on each pod with it."""

from __future__ import annotations

from dataclasses import dataclass

#: Weight of the newest sample in the moving averages: a pod's pace follows its batch size,
#: which changes within seconds, so a few recent streams count more than a long history.
ALPHA = 0.2


@dataclass(slots=True)
class Pace:
    """Moving averages of one pod's streams (None until one was observed)."""

    ttft: float | None = None
    tpot: float | None = None
    #: what the streams' tokens shared their steps with, averaged like `tpot` (None until a
    #: stream of two tokens or more ended): this gateway's streams decoding on the pod, and
    #: the uncached prompt tokens the pod prefilled between two of their tokens. Time per
    #: token rises with both, so a pod's speed is its `tpot` over what an engine model says
    #: of that batch (finish-time-scorer), not its `tpot` alone.
    running: float | None = None
    prefill_per_token: float | None = None
    #: the tokens in the sampled stream's context while it decoded (its prompt and half its
    #: output), averaged like `tpot`: each decoder reads its context every step, so a pod
    #: serving long conversations is slower per token without being a slower pod
    context: float | None = None

    def observe(
        self,
        ttft: float,
        tpot: float | None,
        running: float | None = None,
        prefill_per_token: float | None = None,
        context: float | None = None,
    ) -> None:
        self.ttft = _mix(self.ttft, ttft)
        if tpot is not None and tpot > 0.0:
            self.tpot = _mix(self.tpot, tpot)
            if running is not None:
                self.running = _mix(self.running, running)
            if prefill_per_token is not None:
                self.prefill_per_token = _mix(self.prefill_per_token, prefill_per_token)
            if context is not None:
                self.context = _mix(self.context, context)

    def tokens_done(self, elapsed: float) -> float | None:
        """Output tokens a request sent `elapsed` seconds ago has produced by this pace,
        negative while it would still be prefilling; None before both averages exist (then
        nothing is assumed)."""
        if self.ttft is None or self.tpot is None:
            return None
        return (elapsed - self.ttft) / self.tpot

    def tokens_left(self, total: float, elapsed: float) -> float | None:
        """Of a request's `total` output tokens, those still to come `elapsed` seconds after
        it was sent, by this pace, never below one (it has not answered, whatever the pace
        says); None while it would still be prefilling, or before the pace is known."""
        done = self.tokens_done(elapsed)
        if done is None or done < 0.0:
            return None
        return max(min(1.0, total), total - done)


def _mix(average: float | None, sample: float) -> float:
    return sample if average is None else average + ALPHA * (sample - average)
