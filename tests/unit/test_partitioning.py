"""The stages' partitioner puts every key where aiokafka's default partitioner (and Kafka's
Java client) does."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2

from runtime.partitioning import KeyPartitioner, murmur2


def test_murmur2_equals_aiokafka_s_for_keys_of_every_length() -> None:
    rng = random.Random(27)
    keys = [b"", b"a", b"ab", b"abc", b"abcd", b"tenant-a#0", "ü-call".encode()]
    keys += [rng.randbytes(rng.randrange(0, 90)) for _ in range(2000)]
    for key in keys:
        assert murmur2(key) == aiokafka_murmur2(key), key


def test_the_partition_of_a_key_is_the_default_partitioner_s() -> None:
    rng = random.Random(26)
    ours, theirs = KeyPartitioner(), DefaultPartitioner()
    for count in (1, 3, 12, 50):
        every = list(range(count))
        for _ in range(300):
            key = f"flood-{rng.getrandbits(40):x}-a-{rng.randrange(10**6)}".encode()
            assert ours(key, every, every) == theirs(key, every, every)
    assert ours(None, [0, 1, 2], [1]) == 1  # a keyless record: a random available one
