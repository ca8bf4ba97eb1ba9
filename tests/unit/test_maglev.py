"""Maglev consistent hashing: MurmurHash3, the per-backend permutations, and the
lookup table Cilium's pkg/maglev builds from them, with Cilium's defaults (M=16381,
the seed of --bpf-lb-maglev-hash-seed) and its backend names per release."""
from __future__ import annotations

import base64
import random

import pytest

import labkit.maglev as maglev
from labkit.errors import ConfigError
from labkit.maglev import (
    CILIUM_DEFAULT_HASH_SEED,
    DEFAULT_M,
    FLOW_HASH_SEED,
    LAB_DEFAULT_M,
    MURMUR_SEED,
    PRIMES,
    SMALL_M,
    backend_name,
    cilium_seed,
    disruption,
    flow_hash,
    flow_slot,
    jhash_3words,
    lookup_table,
    murmur3_x64_128,
    offset_skip,
    permutation,
    shares,
    slot_for,
)

FOX = b"The quick brown fox jumps over the lazy dog"
# MurmurHash3_x64_128 of bytes(range(n)), from the smhasher reference C code
# (src/MurmurHash3.cpp, compiled with gcc): (n, seed, h1, h2). Lengths cover an
# empty/partial/full first block, both halves of the tail, and a second block.
REFERENCE = [
    (1, 0, 0x4610ABE56EFF5CB5, 0x51622DAA78F83583),
    (7, 0, 0xBD4C6987CA4B0D68, 0x613ADDD4BD25C787),
    (8, 0, 0x47A7E1BDD68E2FC8, 0x60E6EE02EC31DCC7),
    (9, 0, 0xFBB4CB0F6E812D32, 0x78DE751D0200FFB9),
    (9, 42, 0x443643FAE0918397, 0xED5AC840FDF71DF6),
    (15, 0, 0x47231598FD4925E9, 0xCD846DEE88C67DE9),
    (16, 0, 0x444924B591903F30, 0xAB906456762FE845),
    (16, 0xFFFFFFFF, 0x75298E938AC005BF, 0x26873CD6ED1B3B1E),
    (17, 0, 0x5C76F40F9FE7C20E, 0xC15F026B9EDAA824),
    (17, 42, 0x8F08F89D332AA1FB, 0x592BB498CD19DF6C),
    (31, 0, 0x053DD3E1A32CD094, 0x9EE59AEFB4005490),
    (32, 0, 0xC66D9022B62F500F, 0x1C050A6E34C31151),
    (33, 0, 0x7D41281BFABA4612, 0x55AC8073A7D6A30B),
    (33, 42, 0xD693141F9E1DF25E, 0xAF456193EA9735C8),
    (33, 0xFFFFFFFF, 0x81AD0194E6FB8DE4, 0x57B4E3C32AD0F6F9),
]
FOUR = {f"198.18.{n}.11:8080": n for n in (1, 2, 3, 4)}
FIVE = {**FOUR, "198.18.5.11:8080": 5}


def table_of(backends, m=DEFAULT_M, **kw):
    """The table for ``backends`` at Cilium's default size unless told otherwise."""
    return lookup_table(backends, m, **kw)


# -- MurmurHash3 -------------------------------------------------------------------
def test_murmur_empty_input_hashes_to_zero():
    """The hash of no bytes with seed 0 is (0, 0), as in the reference."""
    assert murmur3_x64_128(b"") == (0, 0)


@pytest.mark.parametrize(
    "data, h1, h2",
    [(b"hello", 0xCBD8A7B341BD9B02, 0x5B1E906A48AE1D19), (FOX, 0xE34BBC7BBC071B6C, 0x7A433CA9C49A9347)],
)
def test_murmur_published_vectors(data, h1, h2):
    """Published x64_128 vectors for b"hello" and the quick brown fox (seed 0)."""
    assert murmur3_x64_128(data) == (h1, h2)


@pytest.mark.parametrize("n, seed, h1, h2", REFERENCE)
def test_murmur_matches_reference_c(n, seed, h1, h2):
    """Lengths 1..33 and several seeds agree with the smhasher reference C code."""
    assert murmur3_x64_128(bytes(range(n)), seed) == (h1, h2)


def test_murmur_accepts_bytearray_and_memoryview():
    """Any bytes-like input hashes like the equivalent bytes."""
    assert murmur3_x64_128(bytearray(FOX)) == murmur3_x64_128(memoryview(FOX)) == murmur3_x64_128(FOX)


@pytest.mark.parametrize(
    "data, seed, match",
    [("hello", 0, "murmur3 data: expected bytes, got str"), (b"x", -1, "murmur3 seed"), (b"x", 2**32, "murmur3 seed")],
)
def test_murmur_rejects_bad_input(data, seed, match):
    """Text instead of bytes, or a seed outside 32 bits, is a ConfigError."""
    with pytest.raises(ConfigError, match=match):
        murmur3_x64_128(data, seed)


def test_cilium_seed_takes_first_four_bytes_big_endian():
    """Cilium's default hash seed gives Murmur seed 0x24b7ef82 (bytes 24 b7 ef 82)."""
    assert cilium_seed(CILIUM_DEFAULT_HASH_SEED) == 0x24B7EF82


@pytest.mark.parametrize("seed, match", [("not base64!", "expected base64"), ("AAAA", "expected 12 bytes.*got 3")])
def test_cilium_seed_rejects_bad_seed(seed, match):
    """A seed that is not base64 of exactly 12 bytes is a ConfigError."""
    with pytest.raises(ConfigError, match=match):
        cilium_seed(seed)


# -- permutations ------------------------------------------------------------------
@pytest.mark.parametrize("m", [7, 13, *PRIMES[:6]])
def test_permutation_visits_every_slot_once(m):
    """For a prime M, every backend's preference order is a permutation of range(M)."""
    for name in ("198.18.1.11:8080", "198.18.2.11:80", "10.0.0.1:53", "x"):
        perm = permutation(name, m)
        assert len(perm) == m
        assert sorted(perm) == list(range(m))


def test_permutation_rows_follow_offset_and_skip():
    """Row j is (offset + j * skip) % M, with offset = h1 % M and skip = h2 % (M - 1) + 1."""
    name, m, seed = "198.18.2.11:8080", 251, 99
    h1, h2 = murmur3_x64_128(name.encode(), seed)
    offset, skip = offset_skip(name, m, seed)
    assert (offset, skip) == (h1 % m, h2 % (m - 1) + 1)
    assert 0 <= offset < m and 1 <= skip < m
    assert permutation(name, m, seed)[:3] == [offset, (offset + skip) % m, (offset + 2 * skip) % m]


def test_seed_changes_the_permutation():
    """Another seed gives a backend another preference order."""
    assert permutation("198.18.2.11:8080", 251, 0) != permutation("198.18.2.11:8080", 251, 1)


@pytest.mark.parametrize("m", [1, 250, 16383, "251", True])
def test_permutation_rejects_non_prime_size(m):
    """A table size that is not a prime is a ConfigError naming the size."""
    with pytest.raises(ConfigError, match=r"Maglev table size: expected a prime .*got"):
        permutation("198.18.2.11:8080", m)


# -- the lookup table --------------------------------------------------------------
def test_table_uses_only_given_ids_and_balances():
    """M=16381, N=4: only the given ids appear, each within ±1% of M/N slots (in fact M//N or M//N+1)."""
    table = table_of(FOUR)
    assert len(table) == DEFAULT_M
    assert set(table) == set(FOUR.values())
    for bid in FOUR.values():
        count = table.count(bid)
        assert abs(count - DEFAULT_M / 4) <= 0.01 * DEFAULT_M
        assert count in (DEFAULT_M // 4, DEFAULT_M // 4 + 1)
    assert sum(shares(table).values()) == pytest.approx(1.0)


def test_defaults_are_ciliums():
    """Without m and seed, a table has Cilium's 16381 slots (a lab's default too) and Cilium's Murmur seed."""
    from labkit.config import DatapathConfig

    assert len(lookup_table(FOUR)) == LAB_DEFAULT_M == DEFAULT_M == DatapathConfig().maglev_table_size == 16381
    assert lookup_table(FOUR) == lookup_table(FOUR, 16381, 0x24B7EF82) != lookup_table(FOUR, 16381, 0)
    assert MURMUR_SEED == cilium_seed() and offset_skip("x", 251) == offset_skip("x", 251, 0x24B7EF82)
    assert len(lookup_table(FOUR, SMALL_M)) == 251


def _cilium_test_name(i: int) -> str:
    """pkg/maglev's mkAddr(i) (IPv4 address = i big-endian, port i % 65535, TCP) as BackendInfo.setHashString
    writes it: "[" + addr + ":" + port + "/" + protocol + ",State:active]"."""
    ip = ".".join(str(b) for b in i.to_bytes(4, "big"))
    return f"[{ip}:{i % 65535}/TCP,State:active]"


def _run_length(ids: list[int]) -> str:
    """pkg/maglev's runLengthEncodeIDs: "<id>(<count>)," runs."""
    runs, current, count = [], ids[0], 1
    for i in ids[1:]:
        if i == current:
            count += 1
        else:
            runs.append(f"{current}({count})")
            current, count = i, 1
    return ",".join(runs + [f"{current}({count})"])


def test_table_matches_ciliums_reproducible_test():
    """Cilium's own TestReproducible (pkg/maglev/maglev_test.go): M=251, HashSeed DefaultHashSeed, backends
    mkAddr(1, 3, 4, 5) with weights 2/13/111/10 and ids 0-3 give exactly this run-length-encoded table. It pins
    MurmurHash3, the seed's first four bytes, the fill and the weights, and the 1.18+ name format at once.
    (Backend ids are shifted by one here: labkit's table uses 0 for a free slot.)"""
    expected = ("2(5),3(1),2(3),1(1),2(2),0(1),2(1),3(1),2(1),3(1),2(1),1(1),2(7),1(1),2(14),3(1),2(1),"
                "1(2),2(12),3(1),2(3),1(1),2(4),3(1),2(8),3(1),2(2),1(1),2(16),1(2),2(3),3(1),2(11),1(2),2(4),3(1),2(3),"
                "1(1),2(4),3(1),2(1),0(1),1(1),2(8),1(1),2(7),1(1),2(4),3(1),2(1),3(1),2(9),1(2),2(5),1(1),2(7),3(1),2(1),"
                "3(1),1(1),2(8),1(1),2(4),0(1),2(1),1(1),2(5),3(1),2(3),1(1),2(4),3(1),2(3),1(1),2(12),0(1),3(1),2(3),3(1),"
                "2(4),3(1),2(2),1(1),2(7)")
    backends = [(1, 2, 0), (3, 13, 1), (4, 111, 2), (5, 10, 3)]  # (mkAddr n, weight, id)
    names = {_cilium_test_name(n): bid + 1 for n, _, bid in backends}
    weights = {_cilium_test_name(n): w for n, w, _ in backends}
    table = lookup_table(names, 251, cilium_seed(CILIUM_DEFAULT_HASH_SEED), weights)
    assert _run_length([bid - 1 for bid in table]) == expected
    assert [_cilium_test_name(n) for n, _, _ in backends][0] == backend_name("0.0.0.1", 1, "TCP", "1.20")


@pytest.mark.parametrize("cilium, name", [("1.16", "198.18.2.11:8080"), ("1.20", "[198.18.2.11:8080/TCP,State:active]")])
def test_backend_name_per_release(cilium, name):
    """v1.16 hashes Backend.String() = "ip:port" (pkg/service), 1.18+ BackendInfo.hashString (pkg/maglev)."""
    assert backend_name("198.18.2.11", 8080, "tcp", cilium) == name
    with pytest.raises(ConfigError, match="Cilium release"):
        backend_name("198.18.2.11", 8080, "TCP", "1.17")


@pytest.mark.parametrize("m", PRIMES[:5])
def test_table_fills_every_slot_for_every_size(m):
    """Every slot of every accepted size holds a backend id."""
    assert set(lookup_table(FIVE, m)) == set(FIVE.values())


def test_table_is_deterministic_and_order_independent():
    """Same input gives the same table; dict or list, in any order, gives the same table."""
    pairs = list(FOUR.items())
    shuffled = pairs[:]
    random.Random(3).shuffle(shuffled)
    assert shuffled != pairs
    reference = table_of(FOUR)
    assert table_of(FOUR) == reference
    assert table_of(pairs) == table_of(shuffled) == table_of(dict(reversed(pairs))) == reference


def test_table_depends_on_names_not_ids():
    """Renumbering the backends renumbers the table, slot for slot."""
    renumbered = {name: bid + 100 for name, bid in FOUR.items()}
    assert table_of(renumbered) == [bid + 100 for bid in table_of(FOUR)]


def test_seed_changes_the_table():
    """Another seed spreads the same backends over other slots."""
    assert table_of(FOUR, seed=1) != table_of(FOUR, seed=0)


def test_removing_a_backend_moves_few_other_slots():
    """Removing 1 of 4 backends: its slots go to the others, and < 3% of the others' slots move."""
    before = table_of(FOUR)
    gone = FOUR["198.18.3.11:8080"]
    after = table_of({name: bid for name, bid in FOUR.items() if bid != gone})
    assert gone not in after
    moved_other = sum(1 for b, a in zip(before, after) if b != gone and b != a)
    assert moved_other / DEFAULT_M < 0.03
    assert disruption(before, after) == pytest.approx(before.count(gone) / DEFAULT_M + moved_other / DEFAULT_M)


def test_adding_a_backend_moves_few_other_slots():
    """Adding a 5th backend: it takes about M/5 slots, and < 3% of slots move between the old four."""
    before, after = table_of(FOUR), table_of(FIVE)
    assert after.count(5) in (DEFAULT_M // 5, DEFAULT_M // 5 + 1)
    moved_between_old = sum(1 for b, a in zip(before, after) if a != 5 and b != a)
    assert moved_between_old / DEFAULT_M < 0.03


def test_single_backend_owns_every_slot():
    """One backend fills the whole table."""
    assert lookup_table({"198.18.1.11:8080": 9}, SMALL_M) == [9] * SMALL_M


@pytest.mark.parametrize(
    "backends, kw, match",
    [
        ({}, {}, r"at least one backend, got none"),
        ([], {}, r"at least one backend, got none"),
        ({"a:1": 1}, {"m": 250}, r"table size: expected one of 251, .*131071, got 250"),
        ({"a:1": 1}, {"m": 7}, r"got 7"),
        ({"a:1": 1}, {"m": True}, r"got True"),
        ({"a:1": 0}, {}, r"backend 'a:1': expected an id from 1 to 2\^32-1, got 0"),
        ({"a:1": -3}, {}, r"got -3"),
        ({"a:1": 2**32}, {}, r"got 4294967296"),
        ({"a:1": "1"}, {}, r"got '1'"),
        ({"a:1": True}, {}, r"got True"),
        ({"a:1": 1, "b:1": 1}, {}, r"backend 'b:1': expected a unique id, got 1"),
        ([("a:1", 1), ("a:1", 2)], {}, r"backend 'a:1': expected unique names, got it twice"),
        ({"": 1}, {}, r"backend name: expected a non-empty 'ip:port' string, got ''"),
        ([(5, 1)], {}, r"backend name: .*got 5"),
        (["a:1"], {}, r"expected \(name, id\) pairs, got 'a:1'"),
        ({"a:1"}, {}, r"expected a dict or list of \(name, id\), got set"),
        ({"a:1": 1, "b:1": 2}, {"weights": {"a:1": 1}}, r"weights: .*missing \['b:1'\], unknown \[\]"),
        ({"a:1": 1}, {"weights": {"a:1": 1, "z:9": 1}}, r"missing \[\], unknown \['z:9'\]"),
        ({"a:1": 1}, {"weights": {"a:1": -1}}, r"weight of 'a:1': expected an integer from 0 to 65535, got -1"),
        ({"a:1": 1}, {"weights": {"a:1": 65536}}, r"got 65536"),
        ({"a:1": 1}, {"weights": {"a:1": 1.5}}, r"got 1.5"),
        ({"a:1": 1, "b:1": 2}, {"weights": {"a:1": 0, "b:1": 0}}, r"expected a backend with weight > 0, got all 0"),
        ({"a:1": 1}, {"weights": [("a:1", 1)]}, r"weights: expected a dict of name -> weight, got list"),
    ],
)
def test_invalid_input_raises_config_error(backends, kw, match):
    """Bad sizes, ids, names and weights are ConfigErrors that say what was expected and what came."""
    with pytest.raises(ConfigError, match=match) as info:
        lookup_table(backends, **kw)
    assert isinstance(info.value, ValueError)


# -- weights -----------------------------------------------------------------------
def test_weight_zero_gets_no_slots():
    """A weight-0 backend gets no slots: the table is the one without it."""
    weights = {name: 100 for name in FOUR} | {"198.18.2.11:8080": 0}
    table = table_of(FOUR, weights=weights)
    assert 2 not in table
    assert table == table_of({name: bid for name, bid in FOUR.items() if bid != 2})


def test_double_weight_gets_about_twice_the_slots():
    """Weight 200 against 100 (Cilium's default weight) gets about twice the slots."""
    backends = {"198.18.1.11:8080": 1, "198.18.2.11:8080": 2}
    table = table_of(backends, weights={"198.18.1.11:8080": 200, "198.18.2.11:8080": 100})
    assert table.count(1) / table.count(2) == pytest.approx(2.0, rel=0.01)


def test_equal_weights_give_the_unweighted_table():
    """Equal weights of any size fill the table exactly like no weights."""
    assert table_of(FOUR, weights={name: 100 for name in FOUR}) == table_of(FOUR)


def test_small_weights_are_ignored_like_cilium():
    """Cilium weighs only when sum(weights) // N > 1: weights 2 and 1 on two backends count as equal."""
    backends = {"198.18.1.11:8080": 1, "198.18.2.11:8080": 2}
    assert table_of(backends, weights={"198.18.1.11:8080": 2, "198.18.2.11:8080": 1}) == table_of(backends)


def test_weighted_counts_match_ciliums_own_test():
    """Cilium's TestWeightedBackendWithRemoval: weights 2/13/111/10 at M=1021 give 16/98/832/75 slots."""
    backends = {"one": 1, "three": 2, "two": 3, "tzwe": 4}
    weights = {"one": 2, "three": 13, "two": 111, "tzwe": 10}
    seed = cilium_seed()
    before = lookup_table(backends, 1021, seed, weights)
    assert [before.count(bid) for bid in (1, 2, 3, 4)] == [16, 98, 832, 75]
    del backends["one"], weights["one"]
    after = lookup_table(backends, 1021, seed, weights)
    changed = sum(1 for b, a in zip(before, after) if b != 1 and b != a)
    assert changed / 1021 < 0.01


# -- reading tables ----------------------------------------------------------------
def test_disruption_counts_changed_slots():
    """disruption is the fraction of slots whose id differs; equal tables give 0."""
    assert disruption([1, 2, 3, 4], [1, 2, 3, 4]) == 0.0
    assert disruption([1, 2, 3, 4], [2, 2, 3, 1]) == 0.5


@pytest.mark.parametrize("old, new", [([1, 2], [1]), ([], [])])
def test_disruption_rejects_mismatched_tables(old, new):
    """Tables of different sizes, or empty ones, are a ConfigError."""
    with pytest.raises(ConfigError, match="two non-empty tables of one size"):
        disruption(old, new)


def test_shares_sum_to_one_by_id():
    """shares maps each id to its fraction of the slots, sorted by id."""
    assert shares([3, 1, 3, 3]) == {1: 0.25, 3: 0.75}
    with pytest.raises(ConfigError, match="non-empty table"):
        shares([])


def test_slot_for_is_hash_mod_m():
    """A flow hash picks slot hash % M, and the table entry there is its backend."""
    table = lookup_table(FOUR, SMALL_M)
    assert slot_for(2**32 - 1, SMALL_M) == (2**32 - 1) % 251
    assert table[slot_for(123456, len(table))] in FOUR.values()


@pytest.mark.parametrize("value, m, match", [(-1, 251, "flow hash"), ("7", 251, "flow hash"), (7, 0, "table size")])
def test_slot_for_rejects_bad_input(value, m, match):
    """A negative or non-integer hash, or a size below 1, is a ConfigError."""
    with pytest.raises(ConfigError, match=match):
        slot_for(value, m)


def test_jhash_matches_the_c_code():
    """jhash_3words gives what bpf/lib/hash.h gives (values from hash.h compiled with gcc on the dev machine)."""
    assert jhash_3words(1, 2, 3, 0) == 0xA46158F5
    assert jhash_3words(0x6433A8C6, 0x12345678, 6, 1910299206) == 0x74294461


def test_flow_hash_inputs():
    """The flow hash reads source address, both ports and protocol, each changing the slot; the seed is
    LB_FLOW_HASH_SEED, bytes 4-7 of Cilium's default Maglev seed."""
    base = flow_hash("198.51.100.100", 40000, 80, 6)
    assert len({base, flow_hash("198.51.100.101", 40000, 80, 6), flow_hash("198.51.100.100", 40001, 80, 6),
                flow_hash("198.51.100.100", 40000, 81, 6), flow_hash("198.51.100.100", 40000, 80, 17)}) == 5
    assert FLOW_HASH_SEED == int.from_bytes(base64.b64decode(CILIUM_DEFAULT_HASH_SEED)[4:8], "big")
    slots = {flow_slot("198.51.100.100", p, 53, 17, SMALL_M) for p in range(20000, 22000)}
    assert len(slots) > 240  # 2,000 ports spread over nearly all 251 slots
