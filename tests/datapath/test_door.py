"""labkitd on the real kernel: ordinary users, each with labs of their own, refused on every verb against another
user's lab with that lab's maps byte-identical after; malformed requests answered with one clear error and
changing nothing; a pod process running as its user with exactly CAP_NET_RAW and CAP_NET_ADMIN; and a labkitd
killed with SIGKILL under traffic, with not one connection lost and the labs adopted by the next one."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from doorusers import learner
from labkit.door import api
from labkit.door.owners import lab_key

pytestmark = pytest.mark.timeout(1200)

#: Every verb a user might turn against another user's lab, with arguments that would be valid on their own.
HOSTILE = [
    ("attach", {}), ("status", {}), ("health", {}), ("ct", {"node": "node-a"}), ("nat", {"node": "node-a"}),
    ("lb", {"node": "node-a"}), ("conntrack", {"node": "node-a"}), ("events", {"last": 5}), ("hubble", {}),
    ("observe", {"title": "peek"}), ("clock", {"advance": 100}), ("fault", {"name": "no-related"}),
    ("aggregation", {"level": "none"}), ("trace_mode", {"mode": "none"}),
    ("agent", {"method": "POST", "path": "/v1/service", "body": {"name": "evil", "port": 80, "backends": []}}),
    ("agent", {"method": "POST", "path": "/v1/policy", "body": {"text": "kind: CiliumNetworkPolicy"}}),
    ("policy.get", {"pod": "a1"}), ("gc.run", {}), ("gc.timer", {"on": True}), ("gc.fill", {"node": "node-a", "n": 10}),
    ("flush_ct", {}), ("snapshot", {"title": "x"}), ("step.ping", {"pod": "a1", "target": "b1"}),
    ("conn.new", {"pod": "a1", "target": "b1"}), ("server_log", {"pod": "a1"}), ("bpftool", {"args": ["map", "list"]}),
    ("sockops", {"node": "node-a"}), ("delete_pod", {"pod": "b2"}), ("reset", {}), ("check", {"exercise": "01.1", "answer": "x"}),
    ("kp.up", {"sizes": [10]}), ("fqdn.cache", {}), ("agent.status", {}), ("agent.logs", {}), ("agent.restart", {}),
    ("up", {}), ("down", {}), ("cleanup", {}),
]


def _dump_maps(key: str) -> dict[str, str]:
    """Every pinned map of lab ``key`` as bpftool dumps it (what 'byte-identical' is checked on)."""
    root = Path("/sys/fs/bpf/labkit") / key
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        r = subprocess.run(["bpftool", "-j", "map", "dump", "pinned", str(path)], capture_output=True, text=True)
        out[str(path)] = r.stdout if r.returncode == 0 else f"(no dump: {r.stderr.strip()[:80]})"
    assert out, f"no pinned maps under {root}"
    return out


@pytest.fixture(scope="module")
def people(door_ready):
    """Two learners, alice's lab 'demo' up (GC timer off, so nothing moves by itself) with one ping in its maps."""
    with learner("lkdoor-alice") as alice, learner("lkdoor-bob") as bob:
        r = alice.python("from labkit.client import Lab\nlab = Lab.up('demo', gc_timer=False)\nlab.reset()\n"
                         "print(lab.key, lab.pod('a1').ping('b1').ok)")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [lab_key(alice.uid, "demo"), "True"]
        yield alice, bob
        alice.python("from labkit.client import Lab\nLab.cleanup('demo')")


def test_a_learners_lab_is_theirs_and_named_for_them(people):
    """alice's 'demo' is keyed demo_u<uid>: its namespaces, pins and run directory carry the owner part."""
    alice, _ = people
    key = lab_key(alice.uid, "demo")
    assert Path(f"/run/netns/lk-{key}-a1").exists() and Path(f"/sys/fs/bpf/labkit/{key}/node-a").is_dir()
    st = os.stat(f"/run/labkit/{key}")
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, alice.gid, 0o750)


def test_another_user_is_refused_on_every_verb_and_changes_nothing(people):
    """bob naming alice's lab by its key is refused on each of 39 verbs with one line naming the verb and the lab;
    `list` shows him nothing of it; alice's maps are byte-identical afterwards."""
    alice, bob = people
    key = lab_key(alice.uid, "demo")
    before = _dump_maps(key)
    script = f"""
import json, os
from labkit.client.door import DoorClient
door = DoorClient()
out = []
for verb, args in {HOSTILE!r}:
    reply = door.request(verb, {key!r}, args)
    out.append([verb, reply.get("ok"), (reply.get("error") or {{}}).get("type"), (reply.get("error") or {{}}).get("message")])
r, w = os.pipe()
reply = door.request("exec", {key!r}, {{"name": "a1", "argv": ["id"]}}, fds=[r, w, w, w])
out.append(["exec", reply.get("ok"), (reply.get("error") or {{}}).get("type"), (reply.get("error") or {{}}).get("message")])
out.append(["list", [l["key"] for l in door.call("list")]])
print(json.dumps(out))
"""
    r = bob.python(script)
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)
    listed = results.pop()
    assert listed == ["list", []]
    assert len(results) == len(HOSTILE) + 1 >= 30
    for verb, ok, kind, message in results:
        assert not ok and kind == "AccessError", (verb, kind, message)
        assert message == f"`{verb}` on lab '{key}' refused: you may use only your own labs"
    # bob's own 'demo' is another lab: not up, so NotFoundError, and it names nothing of alice's
    r = bob.labkit("--lab", "demo", "ct", "list", "node-a")
    assert r.returncode == 1 and "not up" in r.stderr and str(alice.uid) not in r.stderr
    after = _dump_maps(key)
    assert [p for p in after if after[p] != before[p]] == []


def test_two_users_each_have_a_lab_called_demo(people):
    """bob brings up his own 'demo' beside alice's: two keys, two sets of namespaces and pins, each pinging in its
    own; bob's down leaves alice's untouched."""
    alice, bob = people
    a_key, b_key = lab_key(alice.uid, "demo"), lab_key(bob.uid, "demo")
    before = _dump_maps(a_key)
    r = bob.python("from labkit.client import Lab\nlab = Lab.up('demo', gc_timer=False)\n"
                   "print(lab.key, lab.pod('a1').ping('b1').ok)\nlab.down()")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [b_key, "True"] and b_key != a_key
    assert Path(f"/run/netns/lk-{a_key}-a1").exists() and not Path(f"/run/netns/lk-{b_key}-a1").exists()
    after = _dump_maps(a_key)
    assert [p for p in after if after[p] != before[p]] == []


def test_a_pod_process_runs_as_its_user_with_exactly_two_capabilities(people):
    """A command alice starts in her pod runs with her uid and gid, CapEff/CapPrm/CapAmb/CapBnd = NET_ADMIN|NET_RAW
    (0x3000), no_new_privs, in the pod's namespace (its eth0 has a1's address); her notebook's own process has
    CapEff 0."""
    alice, _ = people
    r = alice.python("import json\nfrom labkit.client import Lab\nlab = Lab.attach('demo')\n"
                     "st = lab.pod('a1').exec('cat', '/proc/self/status').stdout\n"
                     "addr = lab.pod('a1').exec('ip', '-4', '-o', 'addr', 'show', 'dev', 'eth0').stdout\n"
                     "mine = open('/proc/self/status').read()\n"
                     "print(json.dumps([st, addr, mine, lab.pod('a1').ip]))")
    assert r.returncode == 0, r.stderr
    st, addr, mine, ip = json.loads(r.stdout)
    fields = dict(line.split(":", 1) for line in st.splitlines() if ":" in line)
    assert fields["Uid"].split()[:3] == [str(alice.uid)] * 3 and fields["Gid"].split()[:3] == [str(alice.gid)] * 3
    for cap in ("CapEff", "CapPrm", "CapAmb", "CapBnd", "CapInh"):
        assert int(fields[cap], 16) == 0x3000, (cap, fields[cap])
    assert fields["NoNewPrivs"].strip() == "1"
    assert f" {ip}/" in addr
    assert int(dict(line.split(":", 1) for line in mine.splitlines() if ":" in line)["CapEff"], 16) == 0


def test_bpftool_is_read_only_and_only_on_the_users_own_pins(people):
    """alice's `bpftool map dump pinned` of her own CT map works (labkitd runs it as root); an update, another
    lab's pin and a global listing are refused."""
    alice, _ = people
    key = lab_key(alice.uid, "demo")
    r = alice.python("import json\nfrom labkit.client import Lab\nfrom labkit.errors import LabkitError\n"
                     "lab = Lab.attach('demo')\nout = []\n"
                     f"d = lab.node('node-a').exec('bpftool', '-j', 'map', 'dump', 'pinned', lab.pin_dir('node-a') + '/cilium_ct_any4_global')\n"
                     "out.append(len(json.loads(d.stdout)))\n"
                     "for args in (['map', 'update', 'pinned', lab.pin_dir('node-a') + '/cilium_ct_any4_global', 'key', '0'],\n"
                     "             ['map', 'dump', 'pinned', '/sys/fs/bpf/labkit/' + 'x' + '/node-a/cilium_ct4_global'],\n"
                     "             ['prog', 'list']):\n"
                     "    try:\n        lab.bpftool(*args)\n        out.append('ran')\n"
                     "    except LabkitError as exc:\n        out.append(type(exc).__name__)\n"
                     "print(json.dumps(out))")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got[0] >= 2 and got[1:] == ["ConfigError"] * 3, got
    assert all(p.startswith(f"/sys/fs/bpf/labkit/{key}/") for p in _dump_maps(key))


# -- malformed requests ------------------------------------------------------------------------------
def _raw_exchange(payloads: list[bytes]) -> list[dict | str]:
    """Send each raw frame body on a fresh connection as root; labkitd's answer to each (or why none came)."""
    out = []
    for body in payloads:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(str(api.socket_path()))
        try:
            sock.sendall(api.HEADER.pack(len(body)) + body)
            head = sock.recv(4, socket.MSG_WAITALL)
            (n,) = api.HEADER.unpack(head)
            data = b""
            while len(data) < n:
                data += sock.recv(n - len(data))
            out.append(json.loads(data))
        finally:
            sock.close()
    return out


def _req(verb: str, lab, args: dict | None = None, **top) -> bytes:
    body = {"verb": verb, "args": args if args is not None else {}, **top}
    if lab is not None:
        body["lab"] = lab
    return json.dumps(body).encode()


def test_malformed_requests_get_one_clear_error_and_change_nothing(people):
    """At least 30 malformed requests — bad JSON, an unknown verb, lab names with '/', '..', NUL or 200
    characters, negative and huge numbers, another lab's pod, oversized fields — each answered with an error that
    says what was expected, alice's maps byte-identical afterwards."""
    alice, _ = people
    key = lab_key(alice.uid, "demo")
    before = _dump_maps(key)
    cases = [
        (b"{not json", "invalid JSON"), (b"\xff\xfe\x00", "undecodable"), (b"[]", "expected a JSON object"),
        (b'{"lab": "demo"}', "'verb'"), (b'{"verb": ""}', "'verb'"), (b'{"verb": 12}', "'verb'"),
        (_req("no-such-verb", key), "unknown verb"), (_req("ct", key, {"node": "node-a"}, extra=1), "unknown fields"),
        (b'{"verb": "ct", "lab": "' + key.encode() + b'", "args": [1]}', "'args' to be an object"),
        (_req("ct", "a/b", {"node": "node-a"}), "not a lab name"), (_req("ct", "..", {"node": "node-a"}), "not a lab name"),
        (_req("ct", "de\x00mo", {"node": "node-a"}), "not a lab name"), (_req("ct", "x" * 200, {"node": "node-a"}), "not a lab name"),
        (_req("ct", key, {}), "'node' is missing"), (_req("ct", key, {"node": "node-z"}), "node-z"),
        (_req("ct", key, {"node": 7}), "must be a string"), (_req("ct", key, {"node": "node-a", "rm": True}), "unknown arguments"),
        (_req("clock", key, {"advance": -5}), "from 0 to"), (_req("clock", key, {"advance": 10**15}), "from 0 to"),
        (_req("step.ping", key, {"pod": "a1", "target": "b1", "count": 0}), "from 1 to 100"),
        (_req("step.ping", key, {"pod": "a1", "target": "b1", "count": 10**9}), "from 1 to 100"),
        (_req("step.ping", key, {"pod": "zz9", "target": "b1"}), "zz9"),
        (_req("step.udp", key, {"pod": "a1", "target": "b1", "port": 70000}), "from 1 to 65535"),
        (_req("step.udp", key, {"pod": "a1", "target": "b1", "port": -1}), "from 1 to 65535"),
        (_req("step.raw", key, {"pod": "a1", "packet": "zz"}), "hex bytes"),
        (_req("step.raw", key, {"pod": "a1", "packet": "00" * 70000}), "at most"),
        (_req("step.raw", key, {"pod": "a1", "packet": "6000"}), "expected an IPv4 packet"),
        (_req("step.ping", key, {"pod": "node-a", "target": "b1"}), "expected a pod"),
        (_req("exec", key, {"name": "a1", "argv": ["id"]}), "4 file descriptors"),
        (_req("conn.step", key, {"id": 999999, "op": "open"}), "no TCP connection"),
        (_req("fault", key, {"name": "rm-rf"}), "expected one of"),
        (_req("gc.fill", key, {"node": "node-a", "n": 10**9}), "from 1 to"),
        (_req("agent", key, {"method": "GET", "path": "/etc/passwd"}), "under /v1/"),
        (_req("agent", key, {"method": "TRACE", "path": "/v1/service"}), "expected one of"),
        (_req("snapshot", key, {"title": "t" * 5000}), "at most 200"),
        (_req("check", key, {"exercise": "01.1", "answer": {"$c": "Step", "v": {}}}), "plain data"),
        (_req("up", key, {"options": {"ct_tcp_size": 16_000_000}}), "allows a learner at most"),
        (_req("up", key, {"options": {"no_such_option": 1}}), "unknown"),
        (_req("bpftool", key, {"args": ["map", "delete", "pinned", "/x"]}), "refused"),
    ]
    assert len(cases) >= 30
    # as alice: these are her own lab's requests, so what refuses them is what they say, not who sends them
    script = f"""
import json, socket
from labkit.door import api
out = []
for body in {[c[0] for c in cases]!r}:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(str(api.socket_path()))
    s.sendall(api.HEADER.pack(len(body)) + body)
    n = api.HEADER.unpack(s.recv(4, socket.MSG_WAITALL))[0]
    data = b""
    while len(data) < n:
        data += s.recv(n - len(data))
    out.append(json.loads(data)); s.close()
print(json.dumps(out))
"""
    r = alice.python(script)
    assert r.returncode == 0, r.stderr
    replies = json.loads(r.stdout)
    for (body, says), reply in zip(cases, replies):
        assert reply["ok"] is False, (body[:80], reply)
        assert says in reply["error"]["message"], (body[:80], reply["error"])
        assert "\n" not in reply["error"]["message"].strip() or "Traceback" not in reply["error"]["message"]
    after = _dump_maps(key)
    assert [p for p in after if after[p] != before[p]] == []


def test_a_16_mb_request_is_refused_before_it_is_read(people):
    """A 16 MB body is answered with the size limit and the connection closed; labkitd still answers after."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(api.socket_path()))
    try:
        sock.sendall(api.HEADER.pack(16 * 1024 * 1024) + b"{" * 65536)
        (n,) = api.HEADER.unpack(sock.recv(4, socket.MSG_WAITALL))
        reply = json.loads(sock.recv(n, socket.MSG_WAITALL))
    finally:
        sock.close()
    assert reply["ok"] is False and f"at most {api.MAX_REQUEST} bytes" in reply["error"]["message"]
    assert _raw_exchange([_req("hello", None)])[0]["ok"]


def test_too_many_descriptors_are_refused(people):
    """A request carrying more descriptors than a verb takes is refused (and the descriptors closed)."""
    from labkit.client.door import DoorClient

    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(3)]
    try:
        reply = DoorClient().request("hello", None, {}, fds=fds)
    finally:
        for fd in fds:
            os.close(fd)
    assert reply["ok"] is False and "file descriptors" in reply["error"]["message"]


# -- survival -----------------------------------------------------------------------------------------
EXCHANGE = r"""
import socket, sys, time
dst, seconds = sys.argv[1], float(sys.argv[2])
long = socket.create_connection((dst, 8080), timeout=5)
ok = fail = echoes = 0
end = time.monotonic() + seconds
print("running", flush=True)
while time.monotonic() < end:
    try:
        long.sendall(b"x"); assert long.recv(16)
        echoes += 1
    except Exception as exc:
        fail += 1; print("long:", exc, flush=True)
    try:
        s = socket.create_connection((dst, 8080), timeout=5); s.sendall(b"hello"); assert s.recv(16); s.close()
        ok += 1
    except Exception as exc:
        fail += 1; print("short:", exc, flush=True)
    time.sleep(0.02)
print(f"ok={ok} echoes={echoes} fail={fail}", flush=True)
"""


def test_kill_9_of_labkitd_under_traffic_loses_no_connection_and_the_lab_is_adopted(people):
    """With a private labkitd, a process alice started in a1 exchanges with b1 over one long connection and a new
    connection every 20 ms while labkitd is killed with SIGKILL and a new one starts: 0 failures; the new labkitd
    lists the same labs, adopts alice's lab and a step works."""
    from labkit.door import daemon

    import shutil
    import tempfile

    alice, _ = people
    where = Path(tempfile.mkdtemp(prefix="labkitd-test-"))  # alice must reach it: pytest's tmp_path is root's only
    os.chmod(where, 0o755)
    sock = where / "labkitd.sock"
    started, pid = daemon.start(sock)
    assert started
    env = {"LABKIT_DOOR": str(sock)}
    listing = ("import json\nfrom labkit.client import Lab\nprint(json.dumps(sorted((l['key'], l['status']) "
               "for l in Lab.list())))")
    before = alice.python(listing, **env)
    assert before.returncode == 0, before.stderr
    driver = subprocess.Popen(
        alice.argv([sys.executable, "-c",
         "import subprocess, sys\nfrom labkit.client import Lab\nlab = Lab.attach('demo')\n"
         f"p = lab.popen('a1', [sys.executable, '-c', {EXCHANGE!r}, lab.pod('b1').ip, '4'], stdout=subprocess.PIPE, text=True)\n"
         "print(p.stdout.readline().strip(), flush=True)\nsys.stdin.readline()\n"
         "print(p.stdout.read().strip(), flush=True)\nprint('exit', p.wait(), flush=True)"], **env),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(alice.home))
    try:
        assert driver.stdout.readline().strip() == "running"
        time.sleep(0.8)
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        assert daemon.status(sock) is None  # nobody answers meanwhile
        again, pid2 = daemon.start(sock)
        assert again and pid2 != pid
        driver.stdin.write("go\n")
        driver.stdin.flush()
        out, err = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    lines = out.splitlines()
    assert lines[-1] == "exit 0", (out, err)
    summary = dict(kv.split("=") for kv in lines[-2].split())
    assert int(summary["fail"]) == 0 and int(summary["ok"]) > 20 and int(summary["echoes"]) > 20, out
    after = alice.python(listing, **env)
    assert after.stdout == before.stdout
    step = alice.python("from labkit.client import Lab\nlab = Lab.attach('demo')\nprint(lab.pod('a1').ping('b1').ok)", **env)
    assert step.stdout.strip() == "True", step.stderr
    daemon.stop(sock)
    shutil.rmtree(where)


# -- limits and the evidence files -------------------------------------------------------------------
@pytest.fixture(scope="module")
def strict(people):
    """A private labkitd that allows each user 1 lab, 3 Services per lab and 1 request at a time."""
    import shutil
    import tempfile

    from labkit.door import daemon

    where = Path(tempfile.mkdtemp(prefix="labkitd-limits-"))
    os.chmod(where, 0o755)
    sock = where / "labkitd.sock"
    limits = {"LABKIT_LIMIT_LABS": "1", "LABKIT_LIMIT_SERVICES": "3", "LABKIT_LIMIT_CONCURRENT": "1"}
    old = {k: os.environ.get(k) for k in limits}
    os.environ.update(limits)
    try:
        started, _ = daemon.start(sock)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert started
    yield {"LABKIT_DOOR": str(sock)}
    daemon.stop(sock)
    shutil.rmtree(where)


def test_a_users_labs_are_limited_and_a_refused_up_builds_nothing(people, strict):
    """With 1 lab allowed, alice's second lab is refused with one line naming the limit and nothing of it is
    made; a variant of her lab (one-snat) belongs to it and is allowed."""
    alice, _ = people
    r = alice.python("from labkit.client import Lab\nfrom labkit.errors import LimitError\n"
                     "try:\n    Lab.up('two')\n    print('built')\nexcept LimitError as exc:\n    print(exc)", **strict)
    assert r.returncode == 0, r.stderr
    assert "you have 1 labs (demo); labkitd allows 1 per user" in r.stdout
    assert not Path(f"/run/labkit/two_u{alice.uid}").exists() and not Path(f"/run/netns/lk-two_u{alice.uid}-a1").exists()


def test_services_per_lab_are_limited_and_a_refusal_writes_no_row(people, strict):
    """With 3 Services allowed, the fourth add and an apply past the limit are refused; the lab's Service maps are
    byte-identical after the refusals."""
    alice, _ = people
    key = lab_key(alice.uid, "demo")
    r = alice.python("from labkit.client import Lab\nlab = Lab.attach('demo')\nlab.services.flush()\n"
                     "for i in range(3):\n    lab.services.add(f's{i}', 80, ['b1:8080'])\nprint(len(lab.services.list()))",
                     **strict)
    assert r.returncode == 0 and r.stdout.strip() == "3", r.stderr
    before = _dump_maps(key)
    r = alice.python("import json\nfrom labkit.client import Lab\nfrom labkit.errors import LimitError\n"
                     "lab = Lab.attach('demo')\nout = []\n"
                     "for call in (lambda: lab.services.add('s3', 80, ['b1:8080']),\n"
                     "             lambda: lab.services.apply([{'name': 'x', 'port': 80, 'backends': []},"
                     " {'name': 'y', 'port': 80, 'backends': []}])):\n"
                     "    try:\n        call()\n        out.append('done')\n"
                     "    except LimitError as exc:\n        out.append(str(exc))\n"
                     "print(json.dumps(out))", **strict)
    assert r.returncode == 0, r.stderr
    said = json.loads(r.stdout)
    assert said == ["lab 'demo': 3 services and 1 more; labkitd allows 3 per lab",
                    "lab 'demo': 3 services and 2 more; labkitd allows 3 per lab"]
    after = _dump_maps(key)
    changed = [p for p in after if after[p] != before[p]]
    assert changed == []
    alice.python("from labkit.client import Lab\nLab.attach('demo').services.flush()", **strict)


def test_one_users_requests_in_progress_are_limited(people, strict):
    """With 1 request at a time allowed, alice's second request while a slow step runs is refused at once, with
    one line; when the step ends her next request is served."""
    alice, _ = people
    script = ("import json, threading, time\nfrom labkit.client import Lab\nfrom labkit.client.door import DoorClient\n"
              "lab = Lab.attach('demo')\nout = {}\n"
              "def slow():\n    out['step'] = lab.pod('a1').ping('b1', count=6).ok\n"
              "t = threading.Thread(target=slow); t.start(); time.sleep(0.4)\n"
              "reply = DoorClient().request('hello', None, {})\n"
              "out['second'] = reply['error']['message'] if not reply['ok'] else 'served'\n"
              "t.join(); out['after'] = DoorClient().request('hello', None, {})['ok']\nprint(json.dumps(out))")
    r = alice.python(script, **strict)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == {"step": True, "second": "request refused: you have 1 requests in progress; labkitd allows 1",
                   "after": True}


def test_evidence_is_the_owners_to_read_and_no_ones_to_write(people):
    """The evidence and check files labkitd keeps for alice's lab are root's: she reads them and cannot write them;
    bob can neither read them nor list the directory."""
    alice, bob = people
    key = lab_key(alice.uid, "demo")
    r = alice.python("from labkit.client import Lab\nfrom labkit.nb import check\nlab = Lab.attach('demo')\n"
                     "lab.reset()\nlab.pod('a1').ping('b1')\nprint(check('01.1', 'from-container', lab=lab).passed)")
    assert r.stdout.strip() == "True", r.stderr
    evidence = api.socket_path().parent / "evidence" / f"{key}.jsonl"
    checks = api.socket_path().parent / "evidence" / f"{key}.checks.jsonl"
    probe = ("import json, sys\nout = {}\nfor p in sys.argv[1:]:\n"
             "    try:\n        out[p + ' read'] = bool(open(p).read())\n    except OSError as exc:\n"
             "        out[p + ' read'] = type(exc).__name__\n"
             "    try:\n        open(p, 'a').write('{\"exercise\": \"01.1\", \"passed\": true}\\n')\n"
             "        out[p + ' write'] = 'wrote'\n    except OSError as exc:\n        out[p + ' write'] = type(exc).__name__\n"
             "try:\n    import os; os.listdir(os.path.dirname(sys.argv[1])); out['list'] = 'listed'\n"
             "except OSError as exc:\n    out['list'] = type(exc).__name__\nprint(json.dumps(out))")
    mine = json.loads(alice.run([sys.executable, "-c", probe, str(evidence), str(checks)]).stdout)
    theirs = json.loads(bob.run([sys.executable, "-c", probe, str(evidence), str(checks)]).stdout)
    for p in (evidence, checks):
        assert mine[f"{p} read"] is True and mine[f"{p} write"] == "PermissionError"
        assert theirs[f"{p} read"] == "PermissionError" and theirs[f"{p} write"] == "PermissionError"
    assert mine["list"] == "PermissionError" and theirs["list"] == "PermissionError"
    st = os.stat(evidence)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, alice.gid, 0o640)


def test_labkitd_restarts_a_users_dead_agent(people):
    """alice's lab's agent killed with SIGKILL is started again by labkitd within seconds; her Services are back
    (restored from the journal) and a step to one works."""
    alice, _ = people
    key = lab_key(alice.uid, "demo")
    r = alice.python("from labkit.client import Lab\nlab = Lab.attach('demo')\nlab.services.flush()\n"
                     "lab.services.add('web', 80, ['b1:8080'])\nprint(lab.agent_status()['pid'])")
    assert r.returncode == 0, r.stderr
    old = int(r.stdout.strip())
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        r = alice.python("from labkit.client import Lab\nst = Lab.attach('demo').agent_status()\n"
                         "print(st.get('status'), st.get('pid'))")
        status, pid = r.stdout.split()
        if status == "ok" and pid not in ("None", str(old)):
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"lab {key}: no new agent within 20 s (last: {r.stdout} {r.stderr})")
    r = alice.python("from labkit.client import Lab\nlab = Lab.attach('demo')\n"
                     "print([s.name for s in lab.services.list()], lab.pod('a1').tcp('web', 80).open().ok)\n"
                     "lab.services.flush()")
    assert r.stdout.strip() == "['web'] True", r.stderr


def test_tries_outlive_a_kernel_and_start_again_with_a_new_lab(people):
    """A check's tries are labkitd's: a second process (a restarted kernel) continues the count; the lab taken down
    and brought up again starts it at 1."""
    _, bob = people
    first = ("from labkit.client import Lab\nfrom labkit.nb import check\nlab = Lab.up('tries', gc_timer=False)\n"
             "lab.reset()\nlab.pod('a1').ping('b1')\nprint(check('01.1', 'to-container', lab=lab).attempt)")
    again = ("from labkit.client import Lab\nfrom labkit.nb import check\nlab = Lab.attach('tries')\n"
             "print(check('01.1', 'to-netdev', lab=lab).attempt)")  # another wrong answer: a repeat costs no try
    try:
        assert bob.python(first).stdout.strip() == "1"
        assert bob.python(again).stdout.strip() == "2"  # another process: the count goes on
        bob.python("from labkit.client import Lab\nLab.attach('tries').down()")
        assert bob.python(first).stdout.strip() == "1"
    finally:
        bob.python("from labkit.client import Lab\nLab.cleanup('tries')")


def test_two_starts_at_once_make_one_labkitd_and_stop_stops_it(tmp_path):
    """Two `labkit daemon start` at once on one socket take turns: exactly one starts labkitd, both name its pid,
    the pid file names it, and `labkit daemon stop` then stops it (no labkitd left that stop cannot find)."""
    import threading

    from labkit.door import daemon

    sock = tmp_path / "labkitd.sock"
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(daemon.start(sock))) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(started for started, _ in results) == [False, True]
        pids = {pid for _, pid in results}
        assert len(pids) == 1 and daemon._read_pid(sock) in pids
        pid = pids.pop()
        assert Path(f"/proc/{pid}").exists() and daemon.status(sock) is not None
    finally:
        stopped = daemon.stop(sock)
    assert stopped and daemon.status(sock) is None and not Path(f"/proc/{pid}/status").exists()
