"""Maglev consistent hashing: how Cilium (pkg/maglev) turns a service's backends
into a lookup table of M slots, so that every node sends a flow to the same
backend and a backend change moves as few flows as possible.

The idea, in three steps:

1. Each backend gets its own *preference order* over the M slots: hash its name
   with MurmurHash3 into ``offset`` and ``skip`` and visit ``offset``,
   ``offset + skip``, ``offset + 2*skip``, ... (mod M). M is prime, so that walk
   touches every slot exactly once.
2. The backends, sorted by name, take turns (round robin): on its turn a backend
   claims the first slot of its preference order that nobody holds yet. After M
   turns the table is full, and each backend holds M/N slots, give or take one.
3. A new flow picks ``slot = hash(flow) % M`` and goes to the backend stored
   there (:func:`slot_for`). The table depends only on the backend *names*, so
   every node computes the same one; when a backend goes away, its slots are
   handed out again and the other backends keep almost all of theirs.

    >>> backends = {"198.18.2.11:8080": 1, "198.18.2.12:8080": 2, "198.18.3.11:8080": 3}
    >>> table = lookup_table(backends, SMALL_M)      # 251 slots, to print; a lab's default is 16381
    >>> len(table), sorted(shares(table))
    (251, [1, 2, 3])
    >>> sorted(table.count(i) for i in (1, 2, 3))    # 251 = 84 + 84 + 83
    [83, 84, 84]
    >>> del backends["198.18.3.11:8080"]
    >>> after = lookup_table(backends, SMALL_M)
    >>> moved = [s for s in range(251) if table[s] != after[s]]
    >>> len(moved), sum(table[s] == 3 for s in moved)  # backend 3's 83 slots, and no other
    (83, 83)

What labkit takes from Cilium as it is: the table size (``DEFAULT_M`` = 16381,
``--bpf-lb-maglev-table-size``, also a lab's default), the Murmur seed (the first
four bytes of ``--bpf-lb-maglev-hash-seed``'s default, :data:`MURMUR_SEED`, what
every function here uses unless told otherwise), the weights, and the name each
backend is hashed by, which depends on the release (:func:`backend_name`):
``198.18.2.11:8080`` on v1.16, ``[198.18.2.11:8080/TCP,State:active]`` on 1.18+.
The agent (:mod:`labkit.agent.services`) builds every table this way, so a table
computed here equals the one in the node's ``cilium_lb4_maglev``. Backend ids
are the ids of ``cilium_lb4_backends_v3``; names, not ids, decide the table,
which is why all nodes agree.
"""
from __future__ import annotations

import base64
import binascii
from typing import Iterable

from labkit.addr import be32
from labkit.errors import ConfigError
from labkit.release import profile

__all__ = [
    "murmur3_x64_128",
    "PRIMES",
    "DEFAULT_M",
    "LAB_DEFAULT_M",
    "SMALL_M",
    "CILIUM_DEFAULT_HASH_SEED",
    "MURMUR_SEED",
    "cilium_seed",
    "backend_name",
    "offset_skip",
    "permutation",
    "lookup_table",
    "disruption",
    "shares",
    "slot_for",
    "FLOW_HASH_SEED",
    "jhash_3words",
    "flow_hash",
    "flow_slot",
]

#: The table sizes Cilium accepts for ``--bpf-lb-maglev-table-size`` (all prime).
#: Cilium recommends M larger than 100 × the number of backends.
PRIMES = (251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071)
#: Cilium's default table size (``--bpf-lb-maglev-table-size``).
DEFAULT_M = 16381
#: A lab's default table size (``DatapathConfig.maglev_table_size``): Cilium's.
LAB_DEFAULT_M = DEFAULT_M
#: The smallest size Cilium accepts: a table that fits on a screen. A notebook that wants to
#: print a table brings its lab up with ``maglev_table_size=SMALL_M``.
SMALL_M = 251
#: Cilium's default ``--bpf-lb-maglev-hash-seed`` (12 random bytes, base64).
CILIUM_DEFAULT_HASH_SEED = "JLfvgnHc2kaSUFaI"
_SIZES = ", ".join(map(str, PRIMES))
#: Seed of the datapath's flow hash (LB_FLOW_HASH_SEED in bpf/lib/hash.h): bytes 4-7 of
#: Cilium's default hash seed, as Cilium seeds its jhash from the rest of that seed.
FLOW_HASH_SEED = int.from_bytes(base64.b64decode(CILIUM_DEFAULT_HASH_SEED)[4:8], "big")
_MASK32 = 0xFFFFFFFF

_MASK64 = 0xFFFFFFFFFFFFFFFF
_C1, _C2 = 0x87C37B91114253D5, 0x4CF5AD432745937F
_MAX_BACKEND_ID = 0xFFFFFFFF  # the backend id is a __u32 in the backends map and the Maglev table
_MAX_WEIGHT = 0xFFFF  # Cilium's backend weight is a uint16


def _rotl64(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK64


def _fmix64(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _MASK64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _MASK64
    return k ^ (k >> 33)


def murmur3_x64_128(data: bytes, seed: int = 0) -> tuple[int, int]:
    """MurmurHash3_x64_128 (Austin Appleby's reference; what Cilium's pkg/murmur3
    computes): ``(h1, h2)``, two unsigned 64-bit halves. ``seed`` is 32-bit.

    >>> murmur3_x64_128(b"")
    (0, 0)
    >>> [hex(h) for h in murmur3_x64_128(b"hello")]
    ['0xcbd8a7b341bd9b02', '0x5b1e906a48ae1d19']
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ConfigError(f"murmur3 data: expected bytes, got {type(data).__name__} {data!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= 0xFFFFFFFF:
        raise ConfigError(f"murmur3 seed: expected an integer from 0 to 2^32-1, got {seed!r}")
    data = bytes(data)
    n = len(data)
    h1 = h2 = seed
    nblocks = n // 16
    for i in range(nblocks):
        k1 = int.from_bytes(data[16 * i : 16 * i + 8], "little")
        k2 = int.from_bytes(data[16 * i + 8 : 16 * i + 16], "little")
        h1 ^= (_rotl64((k1 * _C1) & _MASK64, 31) * _C2) & _MASK64
        h1 = (((_rotl64(h1, 27) + h2) & _MASK64) * 5 + 0x52DCE729) & _MASK64
        h2 ^= (_rotl64((k2 * _C2) & _MASK64, 33) * _C1) & _MASK64
        h2 = (((_rotl64(h2, 31) + h1) & _MASK64) * 5 + 0x38495AB5) & _MASK64
    tail = data[16 * nblocks :]
    if len(tail) > 8:  # bytes 8..14 of the tail feed k2, little-endian
        k2 = int.from_bytes(tail[8:], "little")
        h2 ^= (_rotl64((k2 * _C2) & _MASK64, 33) * _C1) & _MASK64
    if tail:  # bytes 0..7 feed k1
        k1 = int.from_bytes(tail[:8], "little")
        h1 ^= (_rotl64((k1 * _C1) & _MASK64, 31) * _C2) & _MASK64
    h1, h2 = h1 ^ n, h2 ^ n
    h1 = (h1 + h2) & _MASK64
    h2 = (h2 + h1) & _MASK64
    h1, h2 = _fmix64(h1), _fmix64(h2)
    h1 = (h1 + h2) & _MASK64
    h2 = (h2 + h1) & _MASK64
    return h1, h2


def cilium_seed(hash_seed: str = CILIUM_DEFAULT_HASH_SEED) -> int:
    """The Murmur seed Cilium derives from ``--bpf-lb-maglev-hash-seed``: the first
    four of its twelve bytes, big-endian (the other eight seed the datapath's jhash).

    >>> hex(cilium_seed())
    '0x24b7ef82'
    """
    try:
        raw = base64.b64decode(hash_seed, validate=True)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise ConfigError(f"Maglev hash seed: expected base64 of 12 bytes, got {hash_seed!r} ({exc})") from None
    if len(raw) != 12:
        raise ConfigError(f"Maglev hash seed {hash_seed!r}: expected 12 bytes once decoded, got {len(raw)}")
    return int.from_bytes(raw[:4], "big")


#: The Murmur seed of Cilium's default ``--bpf-lb-maglev-hash-seed`` (0x24b7ef82): the seed
#: every table, preference order and offset here is computed with unless told otherwise.
MURMUR_SEED = cilium_seed()

#: The string Cilium hashes for a backend, per release: v1.16's pkg/service keys the active
#: backends by ``Backend.String()`` = ``L3n4Addr.String()`` = ``"%s:%d%s"`` (no protocol; ``/i``
#: only for a frontend's internal scope); from 1.18 pkg/maglev hashes ``BackendInfo.hashString``,
#: ``"[" + addr + ":" + port + "/" + protocol + ",State:active]"`` (a form Cilium promises to keep,
#: so that tables agree across upgrades).
_NAME_FORMATS = {"1.16": "{ip}:{port}", "1.20": "[{ip}:{port}/{proto},State:active]"}


def backend_name(ip: str, port: int, protocol: str = "TCP", cilium: str = "1.16") -> str:
    """The name release ``cilium`` hashes (and sorts) a backend by.

    >>> backend_name("198.18.2.11", 8080), backend_name("198.18.2.11", 8080, "UDP", "1.20")
    ('198.18.2.11:8080', '[198.18.2.11:8080/UDP,State:active]')
    """
    profile(cilium)  # ConfigError names the releases
    return _NAME_FORMATS[cilium].format(ip=ip, port=int(port), proto=str(protocol).upper())


def _is_prime(m: int) -> bool:
    return m >= 2 and all(m % d for d in range(2, int(m**0.5) + 1))


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"Maglev backend name: expected a non-empty 'ip:port' string, got {name!r}")
    return name


def offset_skip(name: str, m: int, seed: int = MURMUR_SEED) -> tuple[int, int]:
    """Where ``name``'s preference order starts, and its stride: ``h1 % m`` and
    ``h2 % (m - 1) + 1`` of its Murmur hash (Cilium's ``getOffsetAndSkip``). ``m`` must be prime.

    >>> offset_skip("198.18.2.11:8080", 251)
    (143, 183)
    """
    if isinstance(m, bool) or not isinstance(m, int) or not _is_prime(m):
        raise ConfigError(f"Maglev table size: expected a prime (Cilium takes {_SIZES}), got {m!r}")
    h1, h2 = murmur3_x64_128(_check_name(name).encode(), seed)
    return h1 % m, h2 % (m - 1) + 1


def permutation(name: str, m: int, seed: int = MURMUR_SEED) -> list[int]:
    """``name``'s preference order over the ``m`` slots: row j is
    ``(offset + j * skip) % m``, a permutation of ``range(m)`` because ``m`` is prime.

    >>> permutation("198.18.2.11:8080", 7)
    [2, 3, 4, 5, 6, 0, 1]
    """
    offset, skip = offset_skip(name, m, seed)
    return [(offset + j * skip) % m for j in range(m)]


def _backend_pairs(backends: object) -> list[tuple[str, int]]:
    if isinstance(backends, dict):
        pairs = list(backends.items())
    elif isinstance(backends, (list, tuple)):
        pairs = list(backends)
        for p in pairs:
            if not (isinstance(p, tuple) and len(p) == 2):
                raise ConfigError(f"Maglev backends: expected (name, id) pairs, got {p!r}")
    else:
        raise ConfigError(f"Maglev backends: expected a dict or list of (name, id), got {type(backends).__name__}")
    if not pairs:
        raise ConfigError("Maglev backends: expected at least one backend, got none (the datapath drops instead)")
    names: set[str] = set()
    ids: set[int] = set()
    for name, bid in pairs:
        _check_name(name)
        if name in names:
            raise ConfigError(f"Maglev backend {name!r}: expected unique names, got it twice")
        if isinstance(bid, bool) or not isinstance(bid, int) or not 1 <= bid <= _MAX_BACKEND_ID:
            raise ConfigError(f"Maglev backend {name!r}: expected an id from 1 to 2^32-1, got {bid!r}")
        if bid in ids:
            raise ConfigError(f"Maglev backend {name!r}: expected a unique id, got {bid} (already used)")
        names.add(name)
        ids.add(bid)
    return pairs


def _check_weights(weights: object, names: Iterable[str]) -> dict[str, int]:
    if not isinstance(weights, dict):
        raise ConfigError(f"Maglev weights: expected a dict of name -> weight, got {type(weights).__name__}")
    names = set(names)
    missing, unknown = sorted(names - weights.keys()), sorted(set(weights) - names)
    if missing or unknown:
        raise ConfigError(f"Maglev weights: expected one weight per backend, got missing {missing}, unknown {unknown}")
    for name, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= _MAX_WEIGHT:
            raise ConfigError(f"Maglev weight of {name!r}: expected an integer from 0 to 65535, got {w!r}")
    if not any(weights.values()):
        raise ConfigError("Maglev weights: expected a backend with weight > 0, got all 0 (the datapath drops)")
    return dict(weights)


def lookup_table(
    backends: dict[str, int] | list[tuple[str, int]],
    m: int = LAB_DEFAULT_M,
    seed: int = MURMUR_SEED,
    weights: dict[str, int] | None = None,
) -> list[int]:
    """The M-slot table of backend ids for ``backends`` (name -> id), as Cilium's
    ``GetLookupTable`` fills it: names sorted, round-robin turns, each turn claiming
    the backend's next free preferred slot.

    The defaults are Cilium's: ``m`` 16381 (``LAB_DEFAULT_M`` = ``DEFAULT_M``, a lab's
    default too; pass the lab's ``maglev_table_size`` when it has another) and the seed
    of its default hash seed (:data:`MURMUR_SEED`). Name backends with :func:`backend_name`
    for the release the lab reproduces.

    ``weights`` (name -> 0..65535, one per backend) follows Cilium exactly: a
    weight-0 backend is left out (Cilium puts it in maintenance); then a backend
    skips its turn while ``(n + 1) * weight`` is below its counter, which starts
    at ``weight / N`` and grows by ``sum(weights)`` per slot taken. Cilium only
    applies this when ``sum(weights) // N > 1`` -- its default weight is 100 --
    so tiny weights such as 2 and 1 for two backends are treated as equal.

    >>> t = lookup_table({"10.0.0.1:80": 7, "10.0.0.2:80": 9}, SMALL_M,
    ...                  weights={"10.0.0.1:80": 300, "10.0.0.2:80": 100})
    >>> t[:8], t.count(7), t.count(9)
    ([7, 9, 9, 7, 9, 7, 7, 9], 188, 63)
    """
    if isinstance(m, bool) or m not in PRIMES:
        raise ConfigError(f"Maglev table size: expected one of {_SIZES}, got {m!r}")
    pairs = _backend_pairs(backends)
    if weights is not None:
        weights = _check_weights(weights, (name for name, _ in pairs))
        pairs = [(name, bid) for name, bid in pairs if weights[name] > 0]
    pairs.sort()
    n_backends = len(pairs)
    rows = [offset_skip(name, m, seed) for name, _ in pairs]
    ws = [weights[name] for name, _ in pairs] if weights is not None else [1] * n_backends
    weight_sum = sum(ws)
    weighted = weight_sum // n_backends > 1
    counter = [w / n_backends for w in ws]  # a float64 in Cilium too
    nxt = [0] * n_backends
    entry = [0] * m  # 0 = free: backend ids are >= 1
    for n in range(m):
        i = n % n_backends
        if weighted:
            while (n + 1) * ws[i] < int(counter[i]):
                i = (i + 1) % n_backends
            counter[i] += float(weight_sum)
        offset, skip = rows[i]
        c = (offset + nxt[i] * skip) % m
        while entry[c]:
            nxt[i] += 1
            c = (offset + nxt[i] * skip) % m
        entry[c] = pairs[i][1]
        nxt[i] += 1
    return entry


def disruption(old: list[int], new: list[int]) -> float:
    """Fraction of slots whose backend changed between two tables of one size.

    >>> disruption([1, 2, 3, 1], [1, 2, 2, 1])
    0.25
    """
    if len(old) != len(new) or not old:
        raise ConfigError(f"Maglev disruption: expected two non-empty tables of one size, got {len(old)}, {len(new)}")
    return sum(a != b for a, b in zip(old, new)) / len(old)


def shares(table: list[int]) -> dict[int, float]:
    """Each backend id's fraction of the slots (= of new flows), by id.

    >>> shares([1, 2, 1, 1])
    {1: 0.75, 2: 0.25}
    """
    if not table:
        raise ConfigError("Maglev shares: expected a non-empty table, got 0 slots")
    counts: dict[int, int] = {}
    for bid in table:
        counts[bid] = counts.get(bid, 0) + 1
    return {bid: counts[bid] / len(table) for bid in sorted(counts)}


def slot_for(hash_value: int, m: int) -> int:
    """The slot a flow reads: ``hash_value % m``. In Cilium the hash is a jhash of
    the packet's source address, ports and protocol -- not its destination, which
    is the service anyway -- seeded from the rest of the Maglev hash seed.

    >>> slot_for(1000, 251)
    247
    """
    if isinstance(hash_value, bool) or not isinstance(hash_value, int) or hash_value < 0:
        raise ConfigError(f"Maglev flow hash: expected an integer >= 0, got {hash_value!r}")
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ConfigError(f"Maglev table size: expected an integer >= 1, got {m!r}")
    return hash_value % m


def _rol32(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK32


def jhash_3words(a: int, b: int, c: int, initval: int) -> int:
    """The kernel's ``jhash_3words`` (include/linux/jhash.h), as bpf/lib/hash.h computes it.

    >>> hex(jhash_3words(1, 2, 3, 0))
    '0xa46158f5'
    """
    a = (a + initval + 0xDEADBEEF + 12) & _MASK32
    b = (b + initval + 0xDEADBEEF + 12) & _MASK32
    c = (c + initval + 0xDEADBEEF + 12) & _MASK32
    c ^= b; c = (c - _rol32(b, 14)) & _MASK32  # noqa: E702 -- the kernel's __jhash_final, line for line
    a ^= c; a = (a - _rol32(c, 11)) & _MASK32  # noqa: E702
    b ^= a; b = (b - _rol32(a, 25)) & _MASK32  # noqa: E702
    c ^= b; c = (c - _rol32(b, 16)) & _MASK32  # noqa: E702
    a ^= c; a = (a - _rol32(c, 4)) & _MASK32  # noqa: E702
    b ^= a; b = (b - _rol32(a, 14)) & _MASK32  # noqa: E702
    c ^= b; c = (c - _rol32(b, 24)) & _MASK32  # noqa: E702
    return c


def _reg16(port: int) -> int:
    """A port as a __be16 reads in a little-endian register."""
    return int.from_bytes(port.to_bytes(2, "big"), "little")


def flow_hash(src: str, sport: int, dport: int, proto: int, seed: int = FLOW_HASH_SEED) -> int:
    """The datapath's hash of a flow (``lb4_flow_hash`` in bpf/lib/lb.h): jhash of the source
    address, the two ports (source port in the high half) and the protocol -- the fields of
    Cilium's ``hash_from_tuple_v4``. The destination is left out: every frontend of a service
    sends a client's flow to the same backend.

    >>> flow_hash("198.51.100.100", 40000, 80, 6) == flow_hash("198.51.100.100", 40000, 80, 6)
    True
    """
    saddr = be32(src)
    return jhash_3words(saddr, (_reg16(sport) << 16) | _reg16(dport), proto, seed)


def flow_slot(src: str, sport: int, dport: int, proto: int, m: int = LAB_DEFAULT_M) -> int:
    """The Maglev slot the datapath reads for this flow: ``flow_hash(...) % m``.

    >>> 0 <= flow_slot("198.51.100.100", 40000, 80, 6) < 16381
    True
    """
    return slot_for(flow_hash(src, sport, dport, proto), m)
