"""The Services agent's restart (labkit.agent.services.restore) without a kernel: recover() from a
journal (whole, cut, garbled, lost) and the maps an agent wrote into MemoryMaps; sync() writing only
the rows that are wrong; check() and rebuild_store()."""
from __future__ import annotations

import json

import pytest

from labkit.agent.services import core as services_mod
from labkit.agent.services import JsonStore, MemoryMaps, MemoryStore, Services
from labkit.agent.services.plan import entries
from labkit.agent.services.restore import ROW_MAPS, check, rebuild_store, recover, sync
from labkit.maps.lb import (BACKENDS_MAP, MAGLEV_MAP, REVNAT_MAP, SERVICES_MAP, Lb4BackendKey, Lb4Key, Lb4RevNatKey,
                            Lb4Service, MaglevLut)
from labkit.net import ledger
from labkit.net.topology import Topology

RELEASES = ("1.16", "1.20")  # v1.16: protocol 0 in keys; 1.17+: the protocol in keys and backends
M = 251  # a small Maglev table keeps the tests quick


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """A private /run/labkit with a lab 'demo' ledger."""
    monkeypatch.setattr(ledger, "RUN_DIR", tmp_path)
    ledger.Ledger("demo").start()
    return tmp_path


def agent(cilium: str, store=None) -> Services:
    """An agent of release ``cilium`` writing into MemoryMaps and ``store`` (a MemoryStore by default)."""
    topo = Topology.default("demo")
    return Services("demo", topo, MemoryMaps(n.name for n in topo.nodes), store or MemoryStore(), M, cilium=cilium)


def busy(svcs: Services) -> None:
    """Adds, removals and backend changes over every kind of service the agent writes."""
    svcs.add("web", 80, ["b1:8080", "b2:8080"])
    svcs.add("np", 81, ["a1:80", "b1:80"], type="NodePort", affinity=30)
    svcs.add("gone", 90, ["a2:90"])
    svcs.add("lb", 82, ["a1:80", "b2:80", "a2:80"], type="LoadBalancer", etp="Local", algorithm="maglev")
    svcs.add("dns", 53, ["a2:53", "b2:53"], protocol="UDP", type="NodePort", algorithm="maglev")
    svcs.add_backend("web", "a1:8080", state="terminating")
    svcs.remove("gone")
    svcs.set_backend_state("lb", "a1:80", "terminating")
    svcs.remove_backend("np", "a1:80")
    svcs.add("late", 83, ["b1:80", "a2:80"], type="LoadBalancer")
    svcs.add_backend("dns", "b1:53")


def held(maps: MemoryMaps, topo: Topology) -> dict:
    """What every node's service maps hold, raw bytes by raw key."""
    return {n.name: {m: maps.dump(n.name, m) for m in ROW_MAPS} for n in topo.nodes}


def rows_of(state, topo: Topology, cilium: str) -> dict:
    """What plan.entries says every node should hold for ``state``, in the form of :func:`held`."""
    out = {}
    for n in topo.nodes:
        want = entries(state, topo, n.name, M, cilium)
        out[n.name] = {m: {raw: bytes(v) for raw, (_, v) in want[m].items()} for m in ROW_MAPS}
    return out


def by_ids(state) -> dict:
    """Each service by its frontend ids: its frontends, backends (ref, state, id), type, policy, algorithm."""
    return {s.ids: ([(fe.address, fe.port, fe.type) for fe in s.frontends],
                    sorted((b.ref, b.state, b.id) for b in s.backends), s.type, s.etp, s.algorithm, s.affinity_timeout)
            for s in state.services.values()}


def journal_lines(run_dir) -> list[bytes]:
    return (run_dir / "demo" / "services.journal").read_bytes().splitlines(keepends=True)


def write_journal(run_dir, lines: list[bytes]) -> None:
    (run_dir / "demo" / "services.journal").write_bytes(b"".join(lines))


# -- a whole journal ---------------------------------------------------------------
@pytest.mark.parametrize("cilium", RELEASES)
def test_recover_equals_the_agents_state(cilium):
    """After adds, removals and backend changes, recover() returns the agent's services, ids and next ids."""
    svcs = agent(cilium)
    busy(svcs)
    r = recover(svcs.store, svcs.maps, svcs.topology, cilium, M)
    assert (r.source, r.damaged, r.problems) == ("journal", False, [])
    assert r.state.to_json() == svcs._state().to_json()


def test_recover_reads_snapshot_and_journal(run_dir, monkeypatch):
    """A compacted store (a snapshot, then journal lines after it) recovers to the agent's state."""
    monkeypatch.setattr(services_mod, "COMPACT_MIN", 3)
    svcs = agent("1.20", JsonStore("demo"))
    busy(svcs)
    assert (run_dir / "demo" / "services.json").exists() and journal_lines(run_dir)
    r = recover(JsonStore("demo"), svcs.maps, svcs.topology, "1.20", M)
    assert (r.damaged, r.problems) == (False, [])
    assert r.state.to_json() == svcs._state().to_json()


def test_torn_last_line_is_not_damage(run_dir):
    """A record its writer never finished is not a record: nothing is reported, the state is the agent's."""
    svcs = agent("1.16", JsonStore("demo"))
    busy(svcs)
    with open(run_dir / "demo" / "services.journal", "ab") as f:
        f.write(b'{"seq":99,"op":"del","na')
    r = recover(JsonStore("demo"), svcs.maps, svcs.topology, "1.16", M)
    assert (r.damaged, r.problems) == (False, [])
    assert r.state.to_json() == svcs._state().to_json()


# -- a damaged journal -------------------------------------------------------------
def assert_maps_kept(r, svcs: Services, cilium: str, want) -> None:
    """Every service of ``want`` (the agent's state before the journal was damaged) is in ``r`` with its
    ids, frontends and backends, and ``r``'s rows are what the maps hold."""
    assert rows_of(r.state, svcs.topology, cilium) == held(svcs.maps, svcs.topology)
    assert by_ids(r.state) == by_ids(want)
    assert r.state.next_service_id >= want.next_service_id and r.state.next_backend_id >= want.next_backend_id


@pytest.mark.parametrize("cilium", RELEASES)
def test_gap_in_the_middle_of_the_journal(run_dir, cilium):
    """Records cut out of the middle: the seq gap is named and the maps supply what the journal lost."""
    svcs = agent(cilium, JsonStore("demo"))
    busy(svcs)
    want = svcs._state()
    lines = journal_lines(run_dir)
    write_journal(run_dir, lines[:3] + lines[6:])
    r = recover(JsonStore("demo"), svcs.maps, svcs.topology, cilium, M)
    assert r.damaged and r.source == "maps"  # every service changed after the gap: each is the maps' version
    assert any("line 4: expected record seq 4, found seq 7 (records 4-6 are missing)" in p for p in r.problems)
    assert_maps_kept(r, svcs, cilium, want)
    assert set(r.state.services) == set(want.services)  # names: from records before and after the gap


@pytest.mark.parametrize("cilium", RELEASES)
def test_journal_cut_short(run_dir, cilium):
    """A journal that lost its last records: the maps hold more than it says, so it is damaged and they win."""
    svcs = agent(cilium, JsonStore("demo"))
    busy(svcs)
    want = svcs._state()
    write_journal(run_dir, journal_lines(run_dir)[:5])
    r = recover(JsonStore("demo"), svcs.maps, svcs.topology, cilium, M)
    assert r.damaged
    assert_maps_kept(r, svcs, cilium, want)
    late = f"restored-{want.services['late'].id}"
    assert "late" not in r.state.services and late in r.state.services  # added after the cut: no name
    assert "gone" not in r.state.services  # removed after the cut, and in no map


@pytest.mark.parametrize("cilium", RELEASES)
def test_garbled_middle_line(run_dir, cilium):
    """An unparsable line that is not the last: named with its line number, replay stops there, the maps fill in."""
    svcs = agent(cilium, JsonStore("demo"))
    busy(svcs)
    want = svcs._state()
    lines = journal_lines(run_dir)
    lines[4] = b'{"seq":5,"op":"put","serv\xff\n'
    write_journal(run_dir, lines)
    r = recover(JsonStore("demo"), svcs.maps, svcs.topology, cilium, M)
    assert r.damaged
    assert any(p.startswith(f"{run_dir}/demo/services.journal line 5: expected a JSON record, found") for p in r.problems)
    assert_maps_kept(r, svcs, cilium, want)
    assert set(r.state.services) == set(want.services)


def test_record_missing_fields(run_dir):
    """A record without the fields its op needs is damage, named with what is missing."""
    svcs = agent("1.20", JsonStore("demo"))
    busy(svcs)
    want = svcs._state()
    lines = journal_lines(run_dir)
    rec = json.loads(lines[2])
    del rec["next_backend_id"]
    lines[2] = json.dumps(rec).encode() + b"\n"
    write_journal(run_dir, lines)
    r = recover(JsonStore("demo"), svcs.maps, svcs.topology, "1.20", M)
    assert r.damaged and any("line 3: expected a put record with next_backend_id" in p for p in r.problems)
    assert_maps_kept(r, svcs, "1.20", want)


@pytest.mark.parametrize("cilium", RELEASES)
def test_empty_journal_and_snapshot(run_dir, cilium):
    """Both files empty: every service the maps hold comes back from them, with its ids, as restored-<id>."""
    svcs = agent(cilium, JsonStore("demo"))
    busy(svcs)
    want = svcs._state()
    write_journal(run_dir, [])
    (run_dir / "demo" / "services.json").write_text("")
    r = recover(JsonStore("demo"), svcs.maps, svcs.topology, cilium, M)
    assert (r.damaged, r.source) == (True, "maps")
    assert_maps_kept(r, svcs, cilium, want)
    assert sorted(r.state.services) == sorted(f"restored-{s.id}" for s in want.services.values())


def test_unparsable_snapshot(run_dir, monkeypatch):
    """A snapshot that does not parse is named as such and the maps supply its services."""
    monkeypatch.setattr(services_mod, "COMPACT_MIN", 3)
    svcs = agent("1.20", JsonStore("demo"))
    busy(svcs)
    want = svcs._state()
    (run_dir / "demo" / "services.json").write_text('{"seq": 3, "services": [')
    r = recover(JsonStore("demo"), svcs.maps, svcs.topology, "1.20", M)
    assert r.damaged and any("services.json: expected the services snapshot as a JSON object" in p for p in r.problems)
    assert_maps_kept(r, svcs, "1.20", want)


def test_rebuild_store_makes_the_journal_match_the_maps(run_dir):
    """After rebuild_store(), the same store recovers without damage to the recovered state."""
    svcs = agent("1.20", JsonStore("demo"))
    busy(svcs)
    write_journal(run_dir, journal_lines(run_dir)[:4])
    r = recover(JsonStore("demo"), svcs.maps, svcs.topology, "1.20", M)
    assert r.damaged
    rebuild_store(JsonStore("demo"), r.state)
    again = recover(JsonStore("demo"), svcs.maps, svcs.topology, "1.20", M)
    assert (again.damaged, again.problems) == (False, [])
    assert again.state.to_json() == r.state.to_json()
    fresh = Services("demo", svcs.topology, svcs.maps, JsonStore("demo"), M, cilium="1.20")
    assert fresh.add("after", 85, ["a1:85"]).id == r.state.next_service_id  # the agent goes on from there


# -- maps that are wrong -----------------------------------------------------------
def test_next_ids_above_every_id_the_maps_use():
    """Ids the maps use that the journal never handed out push the next ids past them."""
    svcs = agent("1.20")
    busy(svcs)
    state = svcs._state()
    svcs.maps.update("node-a", SERVICES_MAP, Lb4Key.make("198.19.0.99", 99, "TCP"), Lb4Service.head(0, 700))
    svcs.maps.update("node-a", BACKENDS_MAP, Lb4BackendKey(900), svcs.maps.get("node-a", BACKENDS_MAP, Lb4BackendKey(1)))
    r = recover(svcs.store, svcs.maps, svcs.topology, "1.20", M)
    assert r.state.next_service_id == 701 and r.state.next_backend_id == 901
    assert state.next_service_id < 700 and "restored-700" in r.state.services


def test_a_missing_row_keeps_the_journals_service():
    """A deleted slot does not make a new service: the journal's stays, the row is named, not damage."""
    svcs = agent("1.16")
    busy(svcs)
    web = svcs.get("web")
    key = Lb4Key.make(web.vip, web.port, 0, slot=2)
    svcs.maps.delete("node-b", SERVICES_MAP, key)
    r = recover(svcs.store, svcs.maps, svcs.topology, "1.16", M)
    assert r.state.to_json() == svcs._state().to_json() and not r.damaged
    assert r.problems == [f"node node-b {SERVICES_MAP} {key}: expected {Lb4Service.slot(web.backends[1].id, web.id)}, "
                          f"found no row; sync writes it"]


def test_frontends_missing_everywhere_keep_the_journals_service():
    """A NodePort service whose node frontends' heads are gone from every node is not taken for a smaller
    service: no agent writes a NodePort service without them, so the journal's stays and sync writes them."""
    svcs = agent("1.20")
    busy(svcs)
    np_ = svcs.get("np")
    for node in ("node-a", "node-b"):
        for fe in np_.frontends[1:]:
            svcs.maps.delete(node, SERVICES_MAP, Lb4Key.make(fe.address, fe.port, "TCP"))
    r = recover(svcs.store, svcs.maps, svcs.topology, "1.20", M)
    assert r.state.to_json() == svcs._state().to_json() and not r.damaged
    assert len(r.problems) == 4 and all("slot 0" in p and "sync writes it" in p for p in r.problems)
    svcs.maps.ops.clear()
    sync(r.state, svcs.maps, svcs.topology, "1.20", M)
    assert len(svcs.maps.ops) == 4 and held(svcs.maps, svcs.topology) == rows_of(svcs._state(), svcs.topology, "1.20")


def test_without_a_journal_a_node_with_whole_rows_is_read():
    """Journal lost and one node missing a slot: the service is rebuilt from the node that holds it whole."""
    svcs = agent("1.20")
    busy(svcs)
    want = svcs._state()
    lb = svcs.get("lb")
    svcs.maps.delete("node-a", SERVICES_MAP, Lb4Key.make(lb.vip, lb.port, "TCP", slot=1))
    r = recover(MemoryStore(), svcs.maps, svcs.topology, "1.20", M)
    assert by_ids(r.state) == by_ids(want)
    assert rows_of(r.state, svcs.topology, "1.20")["node-b"] == held(svcs.maps, svcs.topology)["node-b"]
    slot = Lb4Key.make(lb.vip, lb.port, "TCP", slot=1)
    assert [p for p in r.problems if p.startswith("node ")] == [
        f"node node-a {SERVICES_MAP} {slot}: expected {Lb4Service.slot(lb.slots[0].id, lb.id)}, found no row; "
        f"sync writes it"]


def test_a_service_no_map_holds_stays_when_the_journal_is_whole():
    """Maps emptied (a reloaded datapath) under a whole journal: every service stays, sync writes them."""
    svcs = agent("1.20")
    busy(svcs)
    for node in ("node-a", "node-b"):
        for m in ROW_MAPS:
            svcs.maps.clear(node, m)
    r = recover(svcs.store, svcs.maps, svcs.topology, "1.20", M)
    assert r.state.to_json() == svcs._state().to_json() and not r.damaged
    assert any(p == "service 'web' (ids 1): the journal has it, no node's maps hold it; sync writes it" for p in r.problems)


def test_check_reads_only(run_dir):
    """check() names the same problems recover() does and changes neither the journal nor the maps."""
    svcs = agent("1.20", JsonStore("demo"))
    busy(svcs)
    lines = journal_lines(run_dir)
    write_journal(run_dir, lines[:2] + [b"not json\n"] + lines[3:] + [b'{"torn'])
    before = (journal_lines(run_dir), held(svcs.maps, svcs.topology))
    svcs.maps.ops.clear()
    problems = check(JsonStore("demo"), svcs.maps, svcs.topology, "1.20", M)
    assert problems == recover(JsonStore("demo"), svcs.maps, svcs.topology, "1.20", M).problems
    assert any("line 3: expected a JSON record, found 'not json'" in p for p in problems)
    assert (journal_lines(run_dir), held(svcs.maps, svcs.topology)) == before and svcs.maps.ops == []


# -- sync ----------------------------------------------------------------------------
@pytest.mark.parametrize("cilium", RELEASES)
def test_sync_on_correct_maps_writes_nothing(cilium):
    """Maps that already hold every row: no update, no delete, every row counted unchanged."""
    svcs = agent(cilium)
    busy(svcs)
    svcs.maps.ops.clear()
    report = sync(svcs._state(), svcs.maps, svcs.topology, cilium, M)
    assert svcs.maps.ops == []
    want = rows_of(svcs._state(), svcs.topology, cilium)
    assert report.written == report.deleted == {"node-a": 0, "node-b": 0}
    assert report.unchanged == {n: sum(len(v) for v in want[n].values()) for n in want}


def one_row(svcs: Services, which: str):
    """(node, map, key) of one row the busy() agent wrote: an eTP=Local head, a terminating backend's slot,
    a shared backend, a NodePort frontend's reverse NAT, a Maglev table."""
    lb, web, np_ = svcs.get("lb"), svcs.get("web"), svcs.get("np")
    wire = 6 if svcs.cilium != "1.16" else 0
    return {
        "head": ("node-b", SERVICES_MAP, Lb4Key.make(lb.lb_vip, lb.port, wire)),
        "slot": ("node-a", SERVICES_MAP, Lb4Key.make(web.vip, web.port, wire, slot=3)),
        "backend": ("node-a", BACKENDS_MAP, Lb4BackendKey(web.backends[0].id)),
        "revnat": ("node-b", REVNAT_MAP, Lb4RevNatKey.make(np_.ids[2])),  # node-b's own NodePort frontend
        "maglev": ("node-a", MAGLEV_MAP, Lb4RevNatKey.make(lb.ids[-1])),  # the LoadBalancer frontend's table
    }[which]


@pytest.mark.parametrize("cilium", RELEASES)
@pytest.mark.parametrize("which", ["head", "slot", "backend", "revnat", "maglev"])
@pytest.mark.parametrize("how", ["deleted", "corrupted"])
def test_sync_writes_back_exactly_the_one_wrong_row(cilium, which, how):
    """One row deleted, or with its first byte flipped: recover() names it, sync() writes that row alone."""
    svcs = agent(cilium)
    busy(svcs)
    node, map_name, key = one_row(svcs, which)
    raw = svcs.maps.data[node][map_name][bytes(key)]
    if how == "deleted":
        del svcs.maps.data[node][map_name][bytes(key)]
    else:
        svcs.maps.data[node][map_name][bytes(key)] = bytes([raw[0] ^ 0xFF]) + raw[1:]
    r = recover(svcs.store, svcs.maps, svcs.topology, cilium, M)
    assert r.state.to_json() == svcs._state().to_json()
    assert len(r.problems) == 1 and r.problems[0].startswith(f"node {node} {map_name} {key}: expected ")
    svcs.maps.ops.clear()
    sync(r.state, svcs.maps, svcs.topology, cilium, M)
    assert svcs.maps.ops == [f"update {node} {map_name} {key}"]
    assert svcs.maps.data[node][map_name][bytes(key)] == raw


@pytest.mark.parametrize("cilium", RELEASES)
def test_sync_rewrites_exactly_the_corrupted_rows(cilium):
    """A head with a wrong count, a backend with a wrong port and a Maglev table with a wrong slot:
    those three rows are written, nothing else."""
    svcs = agent(cilium)
    busy(svcs)
    web, lb = svcs.get("web"), svcs.get("lb")
    wire = 6 if cilium != "1.16" else 0
    head = Lb4Key.make(web.vip, web.port, wire)
    bad = Lb4Service.from_buffer_copy(bytes(svcs.maps.get("node-a", SERVICES_MAP, head)))
    bad.count += 1
    svcs.maps.update("node-a", SERVICES_MAP, head, bad)
    be = svcs.maps.get("node-b", BACKENDS_MAP, Lb4BackendKey(1))
    be.port ^= 0x0100
    svcs.maps.update("node-b", BACKENDS_MAP, Lb4BackendKey(1), be)
    mkey = Lb4RevNatKey.make(lb.ids[1])
    table = list(svcs.maps.get("node-a", MAGLEV_MAP, mkey).backend_ids)
    table[0] = 77
    svcs.maps.update("node-a", MAGLEV_MAP, mkey, MaglevLut(table))
    svcs.maps.ops.clear()
    report = sync(svcs._state(), svcs.maps, svcs.topology, cilium, M)
    assert sorted(svcs.maps.ops) == sorted([f"update node-a {SERVICES_MAP} {head}", f"update node-b {BACKENDS_MAP} backend 1",
                                            f"update node-a {MAGLEV_MAP} {mkey}"])
    assert (report.written, report.deleted) == ({"node-a": 2, "node-b": 1}, {"node-a": 0, "node-b": 0})
    assert held(svcs.maps, svcs.topology) == rows_of(svcs._state(), svcs.topology, cilium)


def test_sync_restores_a_deleted_row_and_deletes_extras():
    """A deleted reverse NAT row comes back; a slot past the count, an unused backend and a stray
    reverse NAT row go; nothing else is touched, and a slot is never left without its head."""
    svcs = agent("1.20")
    busy(svcs)
    np_ = svcs.get("np")
    svcs.maps.delete("node-b", REVNAT_MAP, Lb4RevNatKey.make(np_.ids[2]))
    extra_slot = Lb4Key.make(np_.vip, np_.port, 6, slot=len(np_.backends) + 1)
    svcs.maps.update("node-a", SERVICES_MAP, extra_slot, Lb4Service.slot(1, np_.id))
    svcs.maps.update("node-a", BACKENDS_MAP, Lb4BackendKey(4000), svcs.maps.get("node-a", BACKENDS_MAP, Lb4BackendKey(1)))
    svcs.maps.update("node-b", REVNAT_MAP, Lb4RevNatKey.make(4000), svcs.maps.get("node-b", REVNAT_MAP, Lb4RevNatKey.make(1)))
    svcs.maps.ops.clear()
    r = recover(svcs.store, svcs.maps, svcs.topology, "1.20", M)
    assert r.state.to_json()["services"] == svcs._state().to_json()["services"] and not r.damaged
    assert len(r.problems) == 4 and r.state.next_backend_id == 4001  # above every id the maps use
    sync(r.state, svcs.maps, svcs.topology, "1.20", M)
    assert sorted(svcs.maps.ops) == sorted([
        f"update node-b {REVNAT_MAP} rev_nat {np_.ids[2]}", f"delete node-a {SERVICES_MAP} {extra_slot}",
        f"delete node-a {BACKENDS_MAP} backend 4000", f"delete node-b {REVNAT_MAP} rev_nat 4000"])
    assert held(svcs.maps, svcs.topology) == rows_of(svcs._state(), svcs.topology, "1.20")


def test_sync_after_recover_from_nothing_writes_every_row():
    """An agent restarting with empty maps and a whole journal writes every row once, heads after their slots."""
    svcs = agent("1.16")
    busy(svcs)
    for node in ("node-a", "node-b"):
        for m in ROW_MAPS:
            svcs.maps.clear(node, m)
    svcs.maps.ops.clear()
    r = recover(svcs.store, svcs.maps, svcs.topology, "1.16", M)
    report = sync(r.state, svcs.maps, svcs.topology, "1.16", M)
    want = rows_of(svcs._state(), svcs.topology, "1.16")
    assert report.written == {n: sum(len(v) for v in want[n].values()) for n in want}
    assert held(svcs.maps, svcs.topology) == want
    a = [op for op in svcs.maps.ops if op.startswith("update node-a")]
    assert a.index(f"update node-a {SERVICES_MAP} 198.19.0.10:80/ANY slot 0") > \
        a.index(f"update node-a {SERVICES_MAP} 198.19.0.10:80/ANY slot 3")


def test_sync_refused_by_the_kernel_undoes_every_write():
    """A write the kernel refuses: DatapathError names the map, key and node, and every map is as it was."""
    import errno

    from labkit.errors import DatapathError

    svcs = agent("1.20")
    busy(svcs)
    state = svcs._state()
    for node in ("node-a", "node-b"):
        for m in ROW_MAPS:
            svcs.maps.clear(node, m)
    web = state.services["web"]
    head = Lb4Key.make(web.vip, web.port, "TCP")

    def refuse(op, node, map_name, key):
        if (node, map_name, bytes(key)) == ("node-b", SERVICES_MAP, bytes(head)):
            raise OSError(errno.ENOSPC, "No space left on device")

    svcs.maps.fail = refuse
    with pytest.raises(DatapathError, match=rf"writing {SERVICES_MAP} {head} on node 'node-b' failed .*every map is as it was"):
        sync(state, svcs.maps, svcs.topology, "1.20", M)
    assert all(not rows for maps in held(svcs.maps, svcs.topology).values() for rows in maps.values())
