"""The Services agent's restart on a real lab: recover() from services.json/services.journal and the
pinned cilium_lb4_* maps gives lab.services' state, sync() then writes nothing, and after one pinned
entry is deleted with bpftool, doctor's journal check names it and sync() writes back exactly that entry;
with the journal and snapshot emptied, doctor reports it, and every service comes back from the pinned maps
with its ids — by recover() and by `labkit agent restart`, which rebuilds the journal and writes nothing."""
from __future__ import annotations

import subprocess

from labkit.agent.services import JsonStore, PinnedMaps
from labkit.agent.services.plan import entries
from labkit.agent.services.restore import recover, sync
from labkit.cli.doctor import services_journal
from labkit.maps.base import PinnedMap
from labkit.maps.lb import (BACKENDS_MAP, LB_MAPS, MAGLEV_MAP, REVNAT_MAP, SERVICES_MAP, Lb4Key, Lb4Service,
                            PinnedMaglev)
from labkit.net.ledger import lab_dir

from .test_agent import bpftool_lb

ROW_MAPS = (SERVICES_MAP, BACKENDS_MAP, REVNAT_MAP)


class CountingMaps(PinnedMaps):
    """The lab's pinned maps, with every update and delete listed (the kernel still does them)."""

    def __init__(self, pin_dirs, maglev_m):
        super().__init__(pin_dirs, maglev_m)
        self.writes: list[tuple[str, str, str, str]] = []

    def update(self, node, map_name, key, value) -> None:
        self.writes.append(("update", node, map_name, str(key)))
        super().update(node, map_name, key, value)

    def delete(self, node, map_name, key) -> bool:
        self.writes.append(("delete", node, map_name, str(key)))
        return super().delete(node, map_name, key)


def dump(lab) -> dict:
    """Every node's service, backend and reverse NAT rows, raw bytes by raw key, read straight from the pins."""
    out = {}
    for node in lab.topology.nodes:
        for map_name in ROW_MAPS:
            m = PinnedMap(f"{lab.pin_dir(node.name)}/{map_name}", *LB_MAPS[map_name])
            try:
                out[(node.name, map_name)] = {bytes(k): bytes(v) for k, v in m.items()}
            finally:
                m.close()
    return out


def args(lab):
    m = lab.config.maglev_table_size
    return lab.topology, lab.config.profile.release, m


def test_recover_and_sync_on_a_running_lab(lab):
    """Recover equals lab.services' state; sync writes nothing; a pinned head deleted with bpftool is
    named by recover and written back by sync, alone, as it was."""
    svcs = lab.services
    svcs.add("web", 80, ["b1:8080", "b2:8080"])
    svcs.add("np", 81, ["a1:8080", "b1:8080"], type="NodePort", affinity=60)
    svcs.add("lb", 82, ["a1:8080", "a2:8080", "b2:8080"], type="LoadBalancer", etp="Local", algorithm="maglev")
    svcs.add_backend("web", "a2:8080", state="terminating")
    svcs.remove_backend("np", "a1:8080")
    topo, cilium, m = args(lab)

    r = recover(JsonStore(lab.name), PinnedMaps(lab.pin_dirs, m), topo, cilium, m)
    assert (r.source, r.damaged, r.problems) == ("journal", False, [])
    assert r.state.to_json() == svcs.local._state().to_json()

    maps = CountingMaps(lab.pin_dirs, m)
    report = sync(r.state, maps, topo, cilium, m)
    assert maps.writes == [] and report.written == report.deleted == {n.name: 0 for n in topo.nodes}

    before = dump(lab)
    web = svcs.get("web")
    head = Lb4Key.make(web.vip, web.port, 0 if cilium == "1.16" else "TCP")
    path = f"{lab.pin_dir('node-b')}/{SERVICES_MAP}"
    proc = subprocess.run(["bpftool", "map", "delete", "pinned", path, "key", "hex", *bytes(head).hex(" ").split()],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert bytes(head) not in dump(lab)[("node-b", SERVICES_MAP)]

    r = recover(JsonStore(lab.name), PinnedMaps(lab.pin_dirs, m), topo, cilium, m)
    assert r.state.to_json() == svcs.local._state().to_json() and not r.damaged
    want = Lb4Service.from_buffer_copy(before[("node-b", SERVICES_MAP)][bytes(head)])
    assert r.problems == [f"node node-b {SERVICES_MAP} {head}: expected {want}, found no row; sync writes it"]
    lines, ok = services_journal(lab)  # what `labkit doctor` prints for the lab
    assert ok and lines == [f"  - {r.problems[0]}", f"services journal: ok; the maps differ from it in 1 place(s): "
                                                    f"`labkit --lab {lab.name} agent restart` rewrites them"]

    maps = CountingMaps(lab.pin_dirs, m)
    report = sync(r.state, maps, topo, cilium, m)
    assert maps.writes == [("update", "node-b", SERVICES_MAP, str(head))]
    assert report.written == {"node-a": 0, "node-b": 1}
    assert dump(lab) == before
    assert services_journal(lab) == (["services journal: ok"], True)


def test_lost_journal_is_rebuilt_from_the_pinned_maps(lab):
    """services.json and services.journal emptied: recover() reads every service back from the pinned maps
    with its ids (damaged), sync() writes nothing, and after rebuild_store() the journal is whole again."""
    svcs = lab.services
    svcs.add("web", 80, ["b1:8080", "b2:8080"])
    svcs.add("lb", 82, ["a1:8080", "b2:8080"], type="LoadBalancer", algorithm="maglev", affinity=30)
    svcs.set_backend_state("lb", "b2:8080", "terminating")
    want = {s.ids: sorted((b.ref, b.state, b.id) for b in s.backends) for s in svcs.list()}
    topo, cilium, m = args(lab)
    for name in ("services.json", "services.journal"):
        (lab_dir(lab.name) / name).write_text("")

    r = recover(JsonStore(lab.name), PinnedMaps(lab.pin_dirs, m), topo, cilium, m)
    assert (r.damaged, r.source) == (True, "maps")
    assert {s.ids: sorted((b.ref, b.state, b.id) for b in s.backends) for s in r.state.services.values()} == want
    assert r.state.services[f"restored-{min(want)[0]}"].algorithm == "random"
    assert {s.algorithm for s in r.state.services.values()} == {"random", "maglev"}
    pinned = dump(lab)
    for node in topo.nodes:
        rows = entries(r.state, topo, node.name, m, cilium)
        for map_name in ROW_MAPS:
            assert {k: bytes(v) for k, (_, v) in rows[map_name].items()} == pinned[(node.name, map_name)]
        tables = PinnedMaglev(f"{lab.pin_dir(node.name)}/{MAGLEV_MAP}", m)
        try:  # each Maglev table, read back through its inner map, is the one the recovered state computes
            assert len(rows[MAGLEV_MAP]) == 2  # the node's own NodePort address and the LB VIP (no ClusterIP, no 0.0.0.0)
            assert all(tables.get(key) == lut for key, lut in rows[MAGLEV_MAP].values())
        finally:
            tables.close()

    maps = CountingMaps(lab.pin_dirs, m)
    sync(r.state, maps, topo, cilium, m)
    assert maps.writes == []
    lines, ok = services_journal(lab)  # `labkit doctor` reports it before anything is rebuilt
    assert not ok and "damaged" in lines[-1] and "agent restart" in lines[-1]
    before = bpftool_lb(lab)
    status = lab.restart_agent()  # the agent does what the steps above did: recover, rebuild, sync
    assert (status["restored"]["source"], status["restored"]["damaged"]) == ("maps", True)
    assert {s.ids for s in lab.services.list()} == set(want) and bpftool_lb(lab) == before
    again = recover(JsonStore(lab.name), PinnedMaps(lab.pin_dirs, m), topo, cilium, m)
    assert (again.damaged, again.problems) == (False, [])
    assert services_journal(lab) == (["services journal: ok"], True)
    assert svcs.add("api", 83, ["a2:8080"]).id == r.state.next_service_id
