"""The order in which Triton's core walks a request's inputs when it checks them.

Core keeps a request's inputs in a `std::unordered_map<std::string, Input>` and checks
them (batch size, data type, shape, byte size) in that map's iteration order, so when two
inputs are wrong, the one it names depends on libstdc++'s hash table. This replays
that table, as GCC's libstdc++ builds it, for the names inserted in request order: the
string hash (`std::_Hash_bytes`, a 64-bit MurmurHash2 variant), the prime bucket
counts, and where each insertion and rehash links its node. Checked against the real
container and against Triton 2.51's answers.
"""

from __future__ import annotations

from collections.abc import Sequence

_MASK = (1 << 64) - 1
_MUL = (0xC6A4A793 << 32) + 0x5BD1E995
_SEED = 0xC70F6907  # std::hash<std::string>'s seed

# _Prime_rehash_policy::_M_next_bkt: small requests from a table, the rest from its
# prime list (the part of it up to 4703 buckets; past that the request order stands).
_FAST_BUCKETS = (2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13)
# fmt: off
_PRIMES = (
    17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 103, 109, 113,
    127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257, 277, 293, 313, 337, 359,
    383, 409, 439, 467, 503, 541, 577, 619, 661, 709, 761, 823, 887, 953, 1031, 1109, 1193,
    1289, 1381, 1493, 1613, 1741, 1879, 2029, 2179, 2357, 2549, 2753, 2971, 3209, 3469, 3739,
    4027, 4349, 4703,
)
# fmt: on


def _shift_mix(value: int) -> int:
    return value ^ (value >> 47)


def string_hash(data: bytes) -> int:
    """std::hash<std::string> of libstdc++ on a 64-bit machine."""
    length = len(data)
    aligned = length & ~7
    value = (_SEED ^ (length * _MUL)) & _MASK
    for start in range(0, aligned, 8):
        word = int.from_bytes(data[start : start + 8], "little")
        value ^= (_shift_mix((word * _MUL) & _MASK) * _MUL) & _MASK
        value = (value * _MUL) & _MASK
    if length & 7:
        value ^= int.from_bytes(data[aligned:], "little")
        value = (value * _MUL) & _MASK
    return _shift_mix((_shift_mix(value) * _MUL) & _MASK)


def _next_bucket_count(wanted: int) -> int | None:
    if wanted < len(_FAST_BUCKETS):
        return _FAST_BUCKETS[wanted]
    for prime in _PRIMES:
        if prime >= wanted:
            return prime
    return None


def core_order(names: Sequence[str]) -> list[int]:
    """Positions of `names` (distinct, in request order) in the order Triton's core walks them."""
    head = -1  # the list's "before begin" node
    after: dict[int, int | None] = {head: None}  # each node's successor
    bucket_before: dict[int, int] = {}  # bucket -> the node before its first node
    codes = [string_hash(name.encode()) for name in names]
    buckets, resize_at = 1, 0

    def link_first(node: int, bucket: int, table: dict[int, int], count: int) -> None:
        """A node into an empty bucket goes to the front of the whole list."""
        after[node] = after[head]
        after[head] = node
        following = after[node]
        if following is not None:
            table[codes[following] % count] = node
        table[bucket] = head

    for position, code in enumerate(codes):
        if position + 1 > resize_at:  # _M_need_rehash
            least = max(position + 1, 0 if resize_at else 11)
            if least >= buckets:
                count = _next_bucket_count(max(least + 1, buckets * 2))
                if count is None:
                    return list(range(len(names)))
                table: dict[int, int] = {}
                node, after[head] = after[head], None
                while node is not None:  # _M_rehash_aux: relink every node into the new table
                    following = after[node]
                    bucket = codes[node] % count
                    if bucket in table:
                        after[node] = after[table[bucket]]
                        after[table[bucket]] = node
                    else:
                        link_first(node, bucket, table, count)
                    node = following
                buckets, resize_at, bucket_before = count, count, table
            else:
                resize_at = buckets
        bucket = code % buckets
        if bucket in bucket_before:  # _M_insert_bucket_begin
            after[position] = after[bucket_before[bucket]]
            after[bucket_before[bucket]] = position
        else:
            link_first(position, bucket, bucket_before, buckets)
    walk: list[int] = []
    node = after[head]
    while node is not None:
        walk.append(node)
        node = after[node]
    return walk
