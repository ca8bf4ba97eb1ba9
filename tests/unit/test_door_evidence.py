"""labkit.door.evidence: a lab's evidence journal kept in a file beside labkitd's socket and read back by a new
labkitd, and its check results (no root needed: LABKIT_DOOR points at a directory of the test's own)."""
from __future__ import annotations

import dataclasses
import json
import os
import pwd
import stat
from types import SimpleNamespace

import pytest
from tracefixtures import recorded_steps

from labkit.config import DatapathConfig
from labkit.door import evidence
from labkit.door.evidence import (
    EvidenceFiles,
    Facts,
    append_check,
    evidence_dir,
    read_checks,
)
from labkit.net.topology import Topology
from labkit.observe.evidence import Journal, Snapshot

KEY = "demo_u65534"  # nobody's lab: an owner with a passwd entry on every machine
LAB = SimpleNamespace(name="demo", topology=Topology.default("x"), config=DatapathConfig(routing="native"))


@pytest.fixture
def door_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DOOR", str(tmp_path / "labkitd.sock"))
    return tmp_path


@pytest.fixture
def journal(door_dir):
    """A journal whose records go to the evidence files; the lab is open (lab_of gives it)."""
    j = Journal()
    j.sinks.append(EvidenceFiles(j, lambda key: LAB if key == KEY else None))
    return j


def _lines(key=KEY) -> list[str]:
    return (evidence_dir() / f"{key}.jsonl").read_text().splitlines()


def _record_three(journal):
    step = recorded_steps("a1-b1")[0]
    step.flows = [dataclasses.replace(f, wall=1.7e9 + i / 7) for i, f in enumerate(step.flows)]  # as decode() fixes it
    snap = Snapshot("after", 100, step.after, {}, extra={"note": 1}, iptables="*nat\n")
    return [journal.record(KEY, "snapshot", "after", data=snap, node="node-a"),
            journal.record(KEY, "clock", "advance 60", data=(60, 8000), seconds=60),
            journal.record(KEY, "step", step.title, data=step, actor="a1", target="b1", port=8080)]


def test_the_evidence_directory_is_beside_the_socket(door_dir):
    """evidence_dir() is <the socket's directory>/evidence."""
    assert evidence_dir() == door_dir / "evidence"


def test_records_are_appended_after_the_labs_facts(journal):
    """The file's first line is the lab's facts (topology and options), then one line per record in order."""
    recs = _record_three(journal)
    lines = _lines()
    assert len(lines) == 4
    facts = json.loads(lines[0])["facts"]
    assert Topology.from_dict(facts["topology"]) == LAB.topology
    assert DatapathConfig.from_dict(facts["config"]) == LAB.config
    kept = [json.loads(ln) for ln in lines[1:]]
    assert [(d["seq"], d["kind"], d["title"]) for d in kept] == [(r.seq, r.kind, r.title) for r in recs]
    assert kept[1]["data"] == {"$t": [60, 8000]} and kept[1]["attrs"] == {"seconds": 60}


def test_a_lab_labkitd_does_not_hold_gets_no_facts_line(door_dir):
    """When lab_of has no lab, records are kept without a facts line."""
    j = Journal()
    j.sinks.append(EvidenceFiles(j, lambda key: None))
    j.record(KEY, "clock", "advance", data=1)
    assert [json.loads(ln)["kind"] for ln in _lines()] == ["clock"]


def test_records_read_back_are_the_records_kept(journal):
    """A new labkitd's journal loads records equal to the originals (Snapshot, tuple, Step), in seq order, their
    Steps belonging to the lab's facts when the lab is not open."""
    recs = _record_three(journal)
    fresh = Journal()
    files = EvidenceFiles(fresh, lambda key: None)
    assert files.load(KEY) == 3
    back = fresh.find(KEY)
    assert [(r.seq, r.lab, r.kind, r.title, r.attrs, r.time) for r in back] == \
           [(r.seq, r.lab, r.kind, r.title, r.attrs, r.time) for r in recs]
    assert back[0].data == recs[0].data and isinstance(back[0].data, Snapshot)
    assert back[1].data == (60, 8000)
    step, orig = back[2].data, recs[2].data
    assert isinstance(step.lab, Facts) and step.lab.name == KEY
    assert step.lab.topology == LAB.topology and step.lab.config == LAB.config
    assert [bytes(f.event) for f in step.flows] == [bytes(f.event) for f in orig.flows]
    assert step.before == orig.before and step.after == orig.after and step.result == orig.result
    assert step.lines() == orig.lines() and step.diff_lines() == orig.diff_lines()


def test_an_open_lab_takes_the_steps_read_back(journal):
    """Loaded with the lab open, a Step belongs to it; opened() hands Facts-owned Steps to the lab opened later."""
    _record_three(journal)
    fresh = Journal()
    assert EvidenceFiles(fresh, lambda key: LAB).load(KEY) == 3
    assert fresh.latest(KEY, "step").data.lab is LAB
    later = Journal()
    files = EvidenceFiles(later, lambda key: None)
    files.load(KEY)
    files.opened(KEY, LAB)
    assert later.latest(KEY, "step").data.lab is LAB


def test_records_after_a_load_number_after_those_read_back(journal):
    """Records kept by an earlier labkitd (numbered past this process's count) stay in their order, and the next
    record is numbered after them."""
    journal.record(KEY, "clock", "one", data=1)
    journal.record(KEY, "clock", "two", data=2)
    path = evidence_dir() / f"{KEY}.jsonl"
    lines = path.read_text().splitlines()
    top = 10**9
    renumbered = [lines[0]] + [json.dumps({**json.loads(ln), "seq": top + i}) for i, ln in enumerate(lines[1:])]
    path.write_text("\n".join([renumbered[0], renumbered[2], renumbered[1]]) + "\n")  # out of order on disk
    fresh = Journal()
    EvidenceFiles(fresh, lambda key: None).load(KEY)
    assert [(r.seq, r.title) for r in fresh.find(KEY)] == [(top, "one"), (top + 1, "two")]
    assert fresh.record(KEY, "clock", "three", data=3).seq > top + 1


def test_a_reset_empties_the_file(journal):
    """A reset leaves the file empty; the next record starts it again with the facts line."""
    _record_three(journal)
    journal.reset(KEY)
    assert (evidence_dir() / f"{KEY}.jsonl").read_text() == ""
    fresh = Journal()
    assert EvidenceFiles(fresh, lambda key: None).load(KEY) == 0
    journal.record(KEY, "clock", "after the reset", data=5)
    lines = _lines()
    assert len(lines) == 2 and "facts" in json.loads(lines[0]) and json.loads(lines[1])["title"] == "after the reset"


def _titles() -> list:
    return [json.loads(ln).get("title") for ln in _lines()]


def test_compaction_keeps_the_facts_and_the_last_records(journal, monkeypatch):
    """Past 2*KEEP lines the file is cut to the facts line and the last KEEP records; it then grows again until it
    passes 2*KEEP lines once more."""
    monkeypatch.setattr(evidence, "KEEP", 3)
    for i in range(1, 6):
        journal.record(KEY, "clock", f"r{i}", data=i)
    assert _titles() == [None, "r1", "r2", "r3", "r4", "r5"]  # 6 lines: not past 2*KEEP yet
    journal.record(KEY, "clock", "r6", data=6)
    assert _titles() == [None, "r4", "r5", "r6"]
    assert "facts" in json.loads(_lines()[0])
    journal.record(KEY, "clock", "r7", data=7)
    journal.record(KEY, "clock", "r8", data=8)
    assert _titles() == [None, "r4", "r5", "r6", "r7", "r8"]
    journal.record(KEY, "clock", "r9", data=9)
    assert _titles() == [None, "r7", "r8", "r9"]
    assert stat.S_IMODE(os.stat(evidence_dir() / f"{KEY}.jsonl").st_mode) == 0o640


def test_a_line_that_cannot_be_read_back_is_skipped(journal, capsys):
    """A torn line, or one naming a class wire does not know, is left out with a message; the rest load."""
    journal.record(KEY, "clock", "good", data=1)
    with open(evidence_dir() / f"{KEY}.jsonl", "a") as f:
        f.write('{"seq": 5, "kind": "clock", "ti\n')
        f.write(json.dumps({"seq": 6, "kind": "gc", "title": "x", "data": {"$c": "Nope"}, "attrs": {},
                            "time": 1.0}) + "\n")
    journal.record(KEY, "clock", "also good", data=2)
    fresh = Journal()
    assert EvidenceFiles(fresh, lambda key: None).load(KEY) == 2
    assert [r.title for r in fresh.find(KEY)] == ["good", "also good"]
    assert capsys.readouterr().err.count("a record could not be read back") == 2


def test_load_all_reads_every_labs_journal_and_no_check_results(door_dir):
    """load_all() loads each lab's .jsonl and leaves the .checks.jsonl files alone; no directory is no records."""
    fresh = Journal()
    assert EvidenceFiles(fresh, lambda key: None).load_all() == 0
    j = Journal()
    j.sinks.append(EvidenceFiles(j, lambda key: None))
    j.record("a_u1000", "clock", "a", data=1)
    j.record("b", "clock", "b1", data=1)
    j.record("b", "clock", "b2", data=2)
    append_check("b", {"question": "q1", "passed": True})
    assert EvidenceFiles(fresh, lambda key: None).load_all() == 3
    assert [r.title for r in fresh.find("b")] == ["b1", "b2"] and len(fresh.find("a_u1000")) == 1


def test_check_results_round_trip(door_dir):
    """append_check() keeps each result one line; read_checks() gives them back oldest first, a torn line left out."""
    assert read_checks(KEY) == []
    first = {"question": "q1", "passed": False, "message": "expected 2 rows, got 1", "tries": 1}
    second = {"question": "q1", "passed": True, "message": "ok", "tries": 2}
    append_check(KEY, first)
    with open(evidence_dir() / f"{KEY}.checks.jsonl", "a") as f:
        f.write('{"question": \n')
    append_check(KEY, second)
    assert read_checks(KEY) == [first, second]


def test_files_are_readable_by_the_owners_group_only(journal):
    """The evidence directory is 0711 and each file 0640; as root, each file is root's with the owner's group."""
    journal.record(KEY, "clock", "x", data=1)
    append_check(KEY, {"passed": True})
    d = evidence_dir()
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o711
    for name in (f"{KEY}.jsonl", f"{KEY}.checks.jsonl"):
        st = os.stat(d / name)
        assert stat.S_IMODE(st.st_mode) == 0o640, name
        if os.geteuid() == 0:
            assert (st.st_uid, st.st_gid) == (0, pwd.getpwuid(65534).pw_gid), name


def test_a_record_that_cannot_be_encoded_is_kept_as_what_can_be_said(journal, capsys):
    """A record whose data wire cannot encode is kept in memory as it is and on disk as a note, with a message."""
    rec = journal.record(KEY, "snapshot", "odd", data=object())
    assert journal.latest(KEY).data is rec.data
    kept = json.loads(_lines()[-1])
    assert kept["title"] == "odd" and set(kept["data"]) == {"unencodable"}
    assert "evidence snapshot 'odd'" in capsys.readouterr().err
