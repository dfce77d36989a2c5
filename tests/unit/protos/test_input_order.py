"""The order in which Triton's core walks a request's inputs: libstdc++'s unordered_map
replayed. The expected orders were read from the real container (GCC's libstdc++, the
names emplaced in request order); the first three also from Triton 2.51's answers."""

from __future__ import annotations

import pytest

from protos.input_order import core_order, string_hash

CASES = [
    "INPUT0 INPUT1 | INPUT1 INPUT0",
    "INPUT0 INPUT1 INPUT2 | INPUT2 INPUT1 INPUT0",
    "a INPUT_b x1 weights mask ids attention_mask token_type_ids"
    " | attention_mask weights token_type_ids ids x1 mask INPUT_b a",
    # past 13 names the table grows (29 buckets, then 59): rehashes relink the nodes
    " ".join(f"in_{i}" for i in range(20))
    + " | in_18 in_17 in_15 in_13 in_0 in_4 in_6 in_2 in_5 in_7 in_3 in_9 in_8 in_12 in_19 in_14 in_1 in_10"
    " in_16 in_11",
    " ".join(f"t{i}" for i in range(40))
    + " | t39 t37 t36 t35 t34 t31 t30 t11 t8 t12 t33 t29 t24 t9 t5 t6 t4 t2 t15 t1 t27 t10 t7 t38 t13 t16 t0"
    " t25 t32 t14 t17 t3 t26 t28 t18 t22 t23 t20 t19 t21",
]


@pytest.mark.parametrize("case", CASES)
def test_the_walk_is_the_containers(case: str) -> None:
    given, walked = (part.split() for part in case.split(" | "))
    assert [given[i] for i in core_order(given)] == walked


def test_the_walk_depends_on_the_request_order() -> None:
    assert [["b", "a"][i] for i in core_order(["b", "a"])] != [["a", "b"][i] for i in core_order(["a", "b"])]


def test_string_hash_is_libstdcxx() -> None:
    # std::hash<std::string> values on a 64-bit libstdc++
    assert string_hash(b"") == 6142509188972423790
    assert string_hash(b"attention_mask") == 10602345453166258175
    assert string_hash(b"INPUT0") % 13 == 2 and string_hash(b"INPUT1") % 13 == 1
