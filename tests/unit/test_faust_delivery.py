"""In-order delivery after a seek (streams/faust_patches.py, hole 3, faust-streaming 0.15.3): a
record fetched before the last seek is dropped and the partition sought back once, never taken
as proof that the offsets before it do not exist; a hole still there after the seek back is
accepted only when the broker's log starts past it."""

from __future__ import annotations

from faust.types import TP

from streams.faust_patches import Admission, InOrderDelivery

AUTHORIZED = TP("t.calls.authorized", 2)
DECIDED = TP("t.approvals.decided", 2)


def test_before_any_seek_the_first_record_sets_the_order() -> None:
    delivery = InOrderDelivery()
    delivery.next_fetch()
    assert [delivery.admit(AUTHORIZED, o) for o in (5, 6, 7)] == [Admission.DELIVER] * 3
    assert delivery.admit(AUTHORIZED, 9) is Admission.RESEEK


def test_a_stale_record_after_a_seek_is_dropped_and_the_partition_sought_back_once() -> None:
    delivery = InOrderDelivery()
    delivery.sought(AUTHORIZED, 26)
    delivery.next_fetch()
    # The rest of a batch fetched before the seek: the first asks for a seek back, the others
    # of the same fetch are dropped without another seek.
    assert delivery.admit(AUTHORIZED, 59) is Admission.RESEEK
    assert delivery.admit(AUTHORIZED, 60) is Admission.DROP
    assert delivery.expected[AUTHORIZED] == 26
    # The next fetch starts at the committed offset, in order.
    delivery.next_fetch()
    assert [delivery.admit(AUTHORIZED, o) for o in range(26, 62)] == [Admission.DELIVER] * 36
    assert delivery.expected[AUTHORIZED] == 62


def test_a_record_delivered_since_the_last_seek_is_not_delivered_again() -> None:
    delivery = InOrderDelivery()
    delivery.sought(AUTHORIZED, 10)
    delivery.next_fetch()
    assert delivery.admit(AUTHORIZED, 10) is Admission.DELIVER
    assert delivery.admit(AUTHORIZED, 10) is Admission.DROP
    assert delivery.admit(AUTHORIZED, 11) is Admission.DELIVER


def test_a_hole_still_there_after_the_seek_back_is_accepted_when_the_broker_says_so() -> None:
    delivery = InOrderDelivery()
    delivery.sought(AUTHORIZED, 3)
    delivery.next_fetch()
    assert delivery.admit(AUTHORIZED, 500) is Admission.RESEEK
    delivery.next_fetch()  # fetched after the seek back: the broker is asked
    assert delivery.admit(AUTHORIZED, 500) is Admission.VERIFY
    assert delivery.admit(AUTHORIZED, 501) is Admission.DROP  # the rest of that fetch
    # Offsets 3..499 are gone (retention): the log starts at 500.
    assert delivery.hole(AUTHORIZED, 500, log_start=500) is Admission.DELIVER
    assert delivery.admit(AUTHORIZED, 501) is Admission.DELIVER


def test_a_record_still_ahead_after_a_seek_back_is_never_a_hole_while_its_offsets_exist() -> None:
    """CI lost an approval decision this way (issue 26): a stale record in a later fetch was
    taken as proof of a hole, the records before it skipped and the commit stuck there."""
    delivery = InOrderDelivery()
    delivery.sought(DECIDED, 0)
    delivery.next_fetch()
    assert delivery.admit(DECIDED, 3) is Admission.RESEEK
    delivery.next_fetch()
    assert delivery.admit(DECIDED, 3) is Admission.VERIFY
    assert delivery.hole(DECIDED, 3, log_start=0) is Admission.RESEEK
    assert delivery.expected[DECIDED] == 0
    delivery.next_fetch()
    assert [delivery.admit(DECIDED, o) for o in range(4)] == [Admission.DELIVER] * 4


def test_partitions_are_independent_and_a_revoke_forgets_a_partition() -> None:
    delivery = InOrderDelivery()
    delivery.sought(AUTHORIZED, 4)
    delivery.sought(DECIDED, 7)
    delivery.next_fetch()
    assert delivery.admit(DECIDED, 7) is Admission.DELIVER
    assert delivery.admit(AUTHORIZED, 8) is Admission.RESEEK
    delivery.revoked({AUTHORIZED})
    assert AUTHORIZED not in delivery.expected
    assert delivery.admit(AUTHORIZED, 8) is Admission.DELIVER  # unknown again: accepted
    assert delivery.admit(DECIDED, 9) is Admission.RESEEK


def test_a_never_committed_partition_accepts_its_first_record() -> None:
    delivery = InOrderDelivery()
    delivery.sought(AUTHORIZED, None)  # rewound to its beginning, whose offset is unknown
    delivery.next_fetch()
    assert delivery.admit(AUTHORIZED, 1200) is Admission.DELIVER
    assert delivery.admit(AUTHORIZED, 1202) is Admission.RESEEK
