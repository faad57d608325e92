# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""camera_sync.ApproximateSync chooses sets as message_filters' ApproximateTimeSynchronizer.

The cases walk through the policy's steps (nearest candidates first, the product order, the
strict spread bound, the queue limit, frames leaving the queues); the property test checks its
invariants on random streams.
"""

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from orin_llm_node.ros.camera_sync import ApproximateSync

MS = 1_000_000


def stamps(found):
    return None if found is None else [s for s, _ in found]


def test_two_cameras_pair_in_input_order():
    sync = ApproximateSync(2, 10, 50 * MS)
    assert sync.add(1, 100 * MS, 'wrist@100') is None          # nothing from camera 0 yet
    found = sync.add(0, 110 * MS, 'front@110')
    assert found == ((110 * MS, 'front@110'), (100 * MS, 'wrist@100'))
    assert sync.queues == [{}, {}], 'a set leaves the queues'


def test_the_nearest_candidate_wins():
    sync = ApproximateSync(2, 10, 50 * MS)
    for t in (0, 30, 60):
        assert sync.add(0, t * MS, t) is None
    assert stamps(sync.add(1, 35 * MS, 'b')) == [30 * MS, 35 * MS]
    assert sorted(sync.queues[0]) == [0, 60 * MS], 'the others stay queued'


def test_candidates_beyond_slop_mean_no_set():
    sync = ApproximateSync(2, 10, 50 * MS)
    sync.add(0, 0, 'a')
    assert sync.add(1, 51 * MS, 'b') is None
    assert sync.add(1, 50 * MS, 'c') is None         # a candidate, but spread 50 is not < 50
    assert stamps(sync.add(1, 49 * MS, 'd')) == [0, 49 * MS]


def test_spread_must_be_strictly_below_slop():
    sync = ApproximateSync(3, 10, 45 * MS)
    sync.add(0, 0, 'a')
    sync.add(1, 45 * MS, 'b')
    assert sync.add(2, 20 * MS, 'c') is None         # spread 45 == slop: no set
    sync = ApproximateSync(3, 10, 50 * MS)
    sync.add(0, 0, 'a')
    sync.add(1, 45 * MS, 'b')
    assert stamps(sync.add(2, 20 * MS, 'c')) == [0, 45 * MS, 20 * MS]


def test_combinations_are_tried_nearest_first():
    # Camera 2 arrives at 50; camera 0's candidates nearest first, camera 1's only one: the
    # first combination of their product that spans less than the slop is the set.
    sync = ApproximateSync(3, 10, 39 * MS)
    for t in (20, 45, 60):
        sync.add(0, t * MS, t)
    sync.add(1, 15 * MS, 'b15')
    # for 50: camera 0 nearest first 45 (5), 60 (10), 20 (30); camera 1: 15 (35).
    # (45, 15, 50): spread 35 < 39 -> the first combination already fits.
    assert stamps(sync.add(2, 50 * MS, 'c')) == [45 * MS, 15 * MS, 50 * MS]
    sync = ApproximateSync(3, 10, 36 * MS)
    for t in (20, 52, 60):
        sync.add(0, t * MS, t)
    sync.add(1, 18 * MS, 'b18')
    # for 50: camera 0: 52 (2), 60 (10), 20 (30); camera 1: 18 (32).
    # (52, 18, 50) spread 34 < 36 fits first; with 60 it would be 42.
    assert stamps(sync.add(2, 50 * MS, 'c')) == [52 * MS, 18 * MS, 50 * MS]
    sync = ApproximateSync(3, 10, 33 * MS)
    for t in (20, 52, 60):
        sync.add(0, t * MS, t)
    sync.add(1, 18 * MS, 'b18')
    # spread 34 and 42 fail; (20, 18, 50) spans 32 < 33: the third combination.
    assert stamps(sync.add(2, 50 * MS, 'c')) == [20 * MS, 18 * MS, 50 * MS]


def test_queue_keeps_the_newest_and_one_entry_per_stamp():
    sync = ApproximateSync(2, 3, 10 * MS)
    for t in range(5):
        sync.add(0, t * 100 * MS, f'a{t}')
    assert sorted(sync.queues[0]) == [200 * MS, 300 * MS, 400 * MS]
    sync.add(0, 400 * MS, 'again')                  # the reliable twin of the same frame
    assert sync.queues[0][400 * MS] == 'again' and len(sync.queues[0]) == 3
    assert sync.add(1, 5 * MS, 'b') is None, 'the frame it would pair with was dropped'


def test_one_camera_is_its_own_set_and_bad_arguments_are_refused():
    sync = ApproximateSync(1, 10, 1)
    assert sync.add(0, 7, 'x') == ((7, 'x'),)
    for args in ((0, 1, 1), (1, 0, 1), (2, 1, 0)):
        with pytest.raises(ValueError):
            ApproximateSync(*args)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 400)), max_size=60),
       st.integers(1, 60), st.integers(1, 5))
def test_every_set_is_within_slop_and_uses_each_frame_once(arrivals, slop, queue):
    sync = ApproximateSync(3, queue, slop)
    used = set()
    for n, (cam, t) in enumerate(arrivals):
        found = sync.add(cam, t, (cam, t, n))
        if found is None:
            continue
        assert [item[0] for _, item in found] == [0, 1, 2], 'one frame per camera, in order'
        assert max(s for s, _ in found) - min(s for s, _ in found) < slop
        assert any(item[2] == n for _, item in found), 'the arriving frame is in its set'
        for _, item in found:
            assert item[2] not in used
            used.add(item[2])
