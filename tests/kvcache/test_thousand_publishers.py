"""1,024 real ZMQ publishers (eight kvfleet processes of 128) followed by one subscriber:
every pod's block reaches the index, and the subscriber's descriptors stay within
`fd_budget` (one TCP connection per pod and a constant; a socket per pod took two)."""

from __future__ import annotations

import resource

import pytest

from bench.kv_fds import measure
from heimdall_proxy.cli.args import raise_open_files_limit
from heimdall_proxy.kvcache.subscriber import FD_CONSTANT, fd_budget

PODS = 1024


@pytest.mark.slow
async def test_a_thousand_publishers_fit_the_descriptor_budget() -> None:
    raise_open_files_limit()  # as the CLI does: 1,024 connections pass a soft limit of 1,024
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 2 * PODS:
        pytest.skip("the open files limit cannot be raised past 2,048")
    run = await measure(PODS, fleets=8, shared=True, batches=2, within=60.0)
    assert run.pods_with_block == PODS, run.failures
    assert run.ingest_batches == 2 * PODS
    assert run.fds_followed - run.fds_before <= PODS + FD_CONSTANT
    assert run.fds_peak - run.fds_before <= fd_budget(PODS)
