"""labkit.fqdn.dns: DNS messages on the wire (RFC 1035 §4) as the DNS proxy reads and writes them."""
from __future__ import annotations

import pytest

from labkit.fqdn import dns

# A response assembled by hand (RFC 1035 §4.1): id 0xbeef, flags QR|RD|RA (0x8180), 1 question, 2 answers:
# www.lab.example CNAME web.lab.example (the target's tail compressed to "lab.example" at byte 16), and
# web.lab.example A 198.51.100.101 TTL 300 (its name a pointer to the CNAME's data at byte 45).
RESPONSE = bytes.fromhex(
    "beef81800001000200000000"
    "03777777036c6162076578616d706c6500" "00010001"          # question www.lab.example A IN (bytes 12-32)
    "c00c" "0005" "0001" "0000003c" "0006" "03776562" "c010"  # CNAME, TTL 60, data "web" + ptr to byte 16
    "c02d" "0001" "0001" "0000012c" "0004" "c6336465"         # A, TTL 300, 198.51.100.101
)


def test_parse_hand_built_response():
    """Header, question, a CNAME with a compressed target and an A record behind a pointer are read."""
    m = dns.parse(RESPONSE)
    assert (m.id, m.is_response, m.rcode) == (0xBEEF, True, dns.RCODE_NOERROR)
    assert m.question == dns.Question("www.lab.example.", dns.TYPE_A, 1)
    assert [(a.name, a.rtype, a.ttl, a.data) for a in m.answers] == [
        ("www.lab.example.", 5, 60, "web.lab.example."), ("web.lab.example.", 1, 300, "198.51.100.101")]
    assert m.a_records() == [("198.51.100.101", 300)]


def test_query_bytes():
    """A query is the 12-byte header (RD set, one question), the name as length-prefixed labels, type A, class IN."""
    assert dns.build_query(0x0102, "web.lab.example.") == bytes.fromhex(
        "010201000001000000000000" "03776562036c6162076578616d706c6500" "00010001")


def test_refused_keeps_id_and_question():
    """REFUSED (rcode 5) answers with the query's id and question and no records; QR set, RD copied."""
    q = dns.build_query(999, "www.example.org")
    r = dns.refused(q)
    assert r[:4] == bytes.fromhex("03e7") + (0x8000 | 0x0100 | 0x0080 | 5).to_bytes(2, "big")
    m = dns.parse(r)
    assert (m.id, m.rcode, m.question.name, m.answers) == (999, 5, "www.example.org.", [])


def test_response_round_trip():
    """build_response writes A records whose names point at the question (0xc00c) and parse reads them back."""
    raw = dns.build_response(dns.build_query(7, "db.lab.example"), [("198.51.100.103", 30), ("198.51.100.104", 5)])
    assert raw.count(b"\xc0\x0c") == 2
    assert dns.parse(raw).a_records() == [("198.51.100.103", 30), ("198.51.100.104", 5)]


@pytest.mark.parametrize("raw, message", [
    (b"\x00" * 5, "expected at least 12 bytes of header, got 5"),
    (bytes.fromhex("000101000001000000000000") + b"\x03ab", "expected a label, got the end"),
    (bytes.fromhex("000101000001000000000000") + b"\xc0\x0c", "expected a pointer to an earlier name, got a loop"),
    (bytes.fromhex("000101000001000000000000") + b"\x41", "expected a label length < 64, got 0x41"),
])
def test_malformed_messages(raw, message):
    """Cut or looping messages raise DnsError (a ValueError) saying what was expected."""
    with pytest.raises(dns.DnsError) as exc:
        dns.parse(raw)
    assert message in str(exc.value) and isinstance(exc.value, ValueError)
