"""Kafka's default partitioning (murmur2 of the key, as the Java client and aiokafka's
``DefaultPartitioner`` compute it), at a third of aiokafka's pure-Python cost: the key's
4-byte words are read in one ``struct`` call instead of byte by byte. The stages partition
every record they publish (batched sends), a flood's refusals included, so this is on the
path of every refused call (docs/operations.md, "Fair admission"). Same partition for every
key: tests/unit/test_partitioning.py compares them."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from aiokafka.partitioner import DefaultPartitioner

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """MurmurHash2 of ``data`` (org.apache.kafka.common.utils.Utils.murmur2)."""
    length = len(data)
    h = _SEED ^ length
    words = length // 4
    if words:
        for word in struct.unpack_from(f"<{words}I", data):
            k = (word * _M) & _MASK
            k ^= k >> 24
            k = (k * _M) & _MASK
            h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail:
        base = length - tail
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h ^= data[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


class KeyPartitioner(DefaultPartitioner):  # type: ignore[misc]
    """aiokafka's default partitioner with :func:`murmur2` (a keyless record still goes to a
    random partition, as there)."""

    def __call__(
        self, key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]
    ) -> int:
        if key is None:
            return int(super().__call__(key, all_partitions, available))
        return all_partitions[(murmur2(key) & 0x7FFFFFFF) % len(all_partitions)]
