"""The arena planner: live buffers never share bytes, dead ones are reused, offsets are aligned."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_tune.runtime.memory_plan import BufferLifetime, MemoryPlan, align_up, check_plan, plan_memory


def test_chain_reuses_two_slots() -> None:
    # a -> b -> c -> d: each buffer is read only by the next step, so two slots suffice.
    buffers = [BufferLifetime(1000, i, i + 1) for i in range(4)]
    plan = plan_memory(buffers)
    check_plan(buffers, plan)
    assert plan.arena_bytes == 2 * align_up(1000)
    assert plan.naive_bytes == 4 * align_up(1000)
    assert plan.lower_bound_bytes == 2 * align_up(1000)
    assert plan.offsets[0] == plan.offsets[2] and plan.offsets[1] == plan.offsets[3]


def test_output_never_overlaps_its_own_input() -> None:
    # Written at step 1 while the input is last read at step 1: both are live at step 1.
    buffers = [BufferLifetime(256, 0, 1), BufferLifetime(256, 1, 2)]
    plan = plan_memory(buffers)
    assert plan.offsets[0] != plan.offsets[1]


def test_small_buffer_fills_gap_left_by_large_ones() -> None:
    big_a = BufferLifetime(4096, 0, 1)
    long_lived = BufferLifetime(4096, 0, 5)
    big_b = BufferLifetime(4096, 2, 3)
    small = BufferLifetime(100, 4, 5)
    buffers = [big_a, long_lived, big_b, small]
    plan = plan_memory(buffers)
    check_plan(buffers, plan)
    assert plan.arena_bytes == 2 * 4096
    assert plan.offsets[3] in (plan.offsets[0], plan.offsets[2])  # reuses the dead big slot


def test_best_fit_prefers_the_tightest_gap() -> None:
    # Between steps 2 and 3 two holes are free: one of 2048 bytes and one of 256 bytes; a 192-byte buffer
    # goes into the small one.
    buffers = [
        BufferLifetime(2048, 0, 1),  # dies: leaves the large hole
        BufferLifetime(1024, 0, 3),
        BufferLifetime(256, 0, 1),  # dies: leaves the small hole
        BufferLifetime(512, 0, 3),
        BufferLifetime(256, 0, 3),  # placed after the small hole, so that hole lies between live buffers
        BufferLifetime(192, 2, 3),
    ]
    plan = plan_memory(buffers)
    check_plan(buffers, plan)
    assert plan.offsets[5] == plan.offsets[2]


def test_alignment_and_zero_sized_buffers() -> None:
    buffers = [BufferLifetime(1, 0, 0), BufferLifetime(0, 0, 0), BufferLifetime(65, 0, 0)]
    plan = plan_memory(buffers, alignment=64)
    check_plan(buffers, plan)
    assert all(o % 64 == 0 for o in plan.offsets)
    assert plan.sizes == (64, 64, 128)
    assert plan.arena_bytes == 256


def test_empty_plan_and_bad_arguments() -> None:
    plan = plan_memory([])
    assert plan.arena_bytes == 0 and plan.saving == 0.0
    with pytest.raises(ValueError):
        plan_memory([], alignment=48)
    with pytest.raises(ValueError):
        BufferLifetime(10, 3, 2)
    with pytest.raises(ValueError):
        BufferLifetime(-1, 0, 0)


def test_json_round_trip() -> None:
    buffers = [BufferLifetime(100 * i + 1, i, i + 2) for i in range(6)]
    plan = plan_memory(buffers)
    assert MemoryPlan.from_json(plan.to_json()) == plan


def test_check_plan_catches_a_bad_plan() -> None:
    buffers = [BufferLifetime(64, 0, 1), BufferLifetime(64, 1, 2)]
    bad = MemoryPlan(offsets=(0, 0), sizes=(64, 64), arena_bytes=64, naive_bytes=128, lower_bound_bytes=128)
    with pytest.raises(AssertionError):
        check_plan(buffers, bad)


lifetimes = st.lists(
    st.tuples(st.integers(0, 5000), st.integers(0, 30), st.integers(0, 10)).map(
        lambda t: BufferLifetime(t[0], t[1], t[1] + t[2])
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(lifetimes)
def test_random_plans_are_valid_and_bounded(buffers: list[BufferLifetime]) -> None:
    plan = plan_memory(buffers)
    check_plan(buffers, plan)
    assert plan.lower_bound_bytes <= plan.arena_bytes <= plan.naive_bytes


def test_resnet_sized_plan_is_valid() -> None:
    buffers = [BufferLifetime(4 * 56 * 56 * (64 + i % 7), i, i + 1 + (i % 3 == 0) * 3) for i in range(600)]
    plan = plan_memory(buffers)
    check_plan(buffers, plan)
