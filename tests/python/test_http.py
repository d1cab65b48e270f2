"""The servers' HTTP endpoint (--http): /metrics checked by promtool and
scraped by a real Prometheus, /healthz and /readyz, credentials, the
master's status page drawn by headless Chromium (its screenshot is kept as
an artifact in $KVPOOL_ARTIFACTS, default build/artifacts),
/api/kv/lookup against the client's lookup_hashes, and Mooncake's
/get_all_segments (what SGLang's check_server polls)."""
from __future__ import annotations

import html.parser
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

import pytest

import kvpool
import kvpool_procs

ROOT = Path(__file__).resolve().parents[2]


def fetch(url: str, token: Optional[str] = None, method: str = "GET") -> tuple[int, str, dict[str, str]]:
    req = urllib.request.Request(url, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def wait_http(url: str, deadline_s: float = 20.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            fetch(url)
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(url)


def samples(text: str, name: str) -> dict[str, float]:
    """{labels: value} of every sample of metric `name` in an exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, val = line.rpartition(" ")
        if head == name or head.startswith(name + "{"):
            out[head[len(name):]] = float(val)
    return out


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[kvpool_procs.Proc, str]]:
    """`kvpool serve --http` and the endpoint's base URL."""
    (port,) = kvpool_procs.free_ports(1)
    p = kvpool_procs.serve("64MiB", "--http", f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/healthz")
    yield p, base
    p.stop()


def put_some(addr: str, n: int, prefix: str) -> None:
    c = kvpool.Client({"master": addr, "mode": "standalone-store"})
    try:
        for i in range(n):
            c.put(f"{prefix}{i}", bytes([i % 251]) * (1000 + i))
        assert c.get(f"{prefix}0") == bytes([0]) * 1000
    finally:
        c.close()


def until(fn, what: str, deadline_s: float = 15.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + deadline_s
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_metrics_follow_the_pool_and_pass_promtool(served: tuple[kvpool_procs.Proc, str]) -> None:
    proc, base = served
    put_some(proc.addr, 7, "m")
    # the picture is republished every second

    def published() -> Optional[str]:
        t = fetch(base + "/metrics")[1]
        return t if samples(t, "kvpool_objects").get("") == 7 else None

    text = until(published, "kvpool_objects == 7")
    assert samples(text, "kvpool_puts_total")[""] >= 7
    assert samples(text, "kvpool_hits_total")[""] >= 1
    assert samples(text, "kvpool_capacity_bytes")['{tier="dram"}'] == 64 << 20
    assert samples(text, "kvpool_master_role")['{role="single"}'] == 1
    assert samples(text, "kvpool_node_mounted")[""] == 1
    assert samples(text, "kvpool_tenant_objects")['{tenant="default"}'] == 7
    lat = samples(text, "kvpool_request_duration_seconds_count")
    assert lat['{op="PUT_END"}'] >= 7 and lat['{op="GET"}'] >= 1
    seg = samples(text, "kvpool_segment_capacity_bytes")
    assert any(v == 64 << 20 and 'tier="dram"' in k for k, v in seg.items())
    r = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    assert not r.stdout.strip() and not r.stderr.strip(), r.stdout.decode() + r.stderr.decode()


def test_probes_methods_and_paths(served: tuple[kvpool_procs.Proc, str]) -> None:
    _, base = served
    st, body, hdr = fetch(base + "/healthz")
    assert st == 200 and body == "ok\n"
    st, body, _ = fetch(base + "/readyz")
    assert st == 200, body
    assert fetch(base + "/nope")[0] == 404
    st, _, hdr = fetch(base + "/metrics", method="POST")
    assert st == 405 and hdr.get("Allow") == "GET, HEAD"
    st, body, hdr = fetch(base + "/metrics", method="HEAD")
    assert st == 200 and body == "" and hdr["Content-Type"].startswith("text/plain; version=0.0.4")
    st, body, hdr = fetch(base + "/api/stats")
    assert st == 200 and hdr["Content-Type"] == "application/json"
    j = json.loads(body)
    assert j["role"] == "single" and j["ready"] and j["version"] == kvpool.__version__
    assert j["segments"] and j["counters"]["segments"] == 1


def test_a_token_guards_every_path() -> None:
    with tempfile.TemporaryDirectory() as d:
        tok = Path(d) / "http-token"
        tok.write_text("s3cret-metrics\n")
        tok.chmod(0o600)
        (port,) = kvpool_procs.free_ports(1)
        p = kvpool_procs.master("--http", f"127.0.0.1:{port}", "--http-token-file", str(tok))
        try:
            base = f"http://127.0.0.1:{port}"
            wait_http(base + "/healthz")
            for path in ("/metrics", "/", "/api/stats", "/api/kv/lookup?hashes=1",
                         "/get_all_segments", "/nope"):
                st, _, hdr = fetch(base + path)
                assert st == 401 and hdr.get("WWW-Authenticate", "").startswith("Bearer"), path
                assert fetch(base + path, token="wrong")[0] == 401
                assert fetch(base + path, token="s3cret-metrics")[0] == (404 if path == "/nope" else 200), path
            for path in ("/healthz", "/readyz"):  # probes need no secret
                st, body, _ = fetch(base + path)
                assert st == 200 and body == "ok\n", path
        finally:
            p.stop()


def test_beyond_loopback_needs_a_token() -> None:
    (port,) = kvpool_procs.free_ports(1)
    r = subprocess.run([kvpool_procs.kvpool_bin(), "master", "--listen", "127.0.0.1:0",
                        "--http", f"0.0.0.0:{port}"], capture_output=True, timeout=30,
                       env=kvpool_procs.server_env())
    assert r.returncode == 1
    assert b"HTTP endpoint" in r.stderr and b"insecure" in r.stderr, r.stderr


def test_a_real_prometheus_scrapes_master_and_node(tmp_path: Path) -> None:
    prom = shutil.which("prometheus")
    assert prom, "prometheus is installed by scripts/install-deps"
    mport, nport, pport = kvpool_procs.free_ports(3)
    m = kvpool_procs.master("--http", f"127.0.0.1:{mport}")
    log = open(tmp_path / "store.log", "wb")
    store = subprocess.Popen([kvpool_procs.kvpool_bin(), "store", "--master", m.addr,
                              "--segment-size", "32MiB", "--listen", "127.0.0.1:0",
                              "--http", f"127.0.0.1:{nport}"], stdout=log,
                             stderr=subprocess.STDOUT, env=kvpool_procs.server_env(),
                             start_new_session=True)
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 900ms}\n"
        "scrape_configs:\n"
        f"  - job_name: master\n    static_configs: [{{targets: ['127.0.0.1:{mport}']}}]\n"
        f"  - job_name: node\n    static_configs: [{{targets: ['127.0.0.1:{nport}']}}]\n")
    pl = open(tmp_path / "prometheus.log", "wb")
    pp = subprocess.Popen([prom, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                           f"--web.listen-address=127.0.0.1:{pport}", "--log.level=warn"],
                          stdout=pl, stderr=subprocess.STDOUT, start_new_session=True)
    api = f"http://127.0.0.1:{pport}/api/v1/query?query="

    def query(q: str) -> list[dict]:  # type: ignore[type-arg]
        try:
            st, body, _ = fetch(api + urllib.parse.quote(q))
        except OSError:
            return []
        j = json.loads(body) if st == 200 else {}
        return j.get("data", {}).get("result", []) if j.get("status") == "success" else []

    try:
        wait_http(f"http://127.0.0.1:{nport}/healthz")
        until(lambda: fetch(f"http://127.0.0.1:{nport}/readyz")[0] == 200, "the node mounted")
        put_some(m.addr, 5, "p")
        # two scrapes of each target after the puts were published
        until(lambda: [r for r in query('count_over_time(kvpool_objects{job="master"}[30s])')
                       if float(r["value"][1]) >= 2]
              and [r for r in query('kvpool_objects{job="master"}') if r["value"][1] == "5"],
              "two scrapes and kvpool_objects == 5", 60)
        up = {r["metric"]["job"]: r["value"][1] for r in query("up")}
        assert up == {"master": "1", "node": "1"}, up
        mounted = query('kvpool_node_mounted{job="node"}')
        assert mounted and mounted[0]["value"][1] == "1"
        segs = query('kvpool_segment_capacity_bytes{job="master",tier="dram"}')
        assert [s["value"][1] for s in segs] == [str(32 << 20)]
    finally:
        os.killpg(pp.pid, 15)
        pp.wait(20)
        os.killpg(store.pid, 15)
        store.wait(20)
        m.stop()
        log.close()
        pl.close()


class _Dom(html.parser.HTMLParser):
    """Elements of a dumped DOM by id (attributes and text) and table rows by class."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, dict[str, str]] = {}
        self.text: dict[str, str] = {}
        self.rows: dict[str, int] = {}
        self._open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, Optional[str]]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.by_id[a["id"]] = a
            self.text[a["id"]] = ""
            self._open.append(a["id"])
        else:
            self._open.append("")
        if tag == "tr" and a.get("class"):
            self.rows[a["class"]] = self.rows.get(a["class"], 0) + 1
        if tag in ("meta", "br", "img", "input", "link"):
            self._open.pop()

    def handle_endtag(self, tag: str) -> None:
        if self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for i in self._open:
            if i:
                self.text[i] += data


def test_the_status_page_renders_in_chromium(served: tuple[kvpool_procs.Proc, str]) -> None:
    chromium = shutil.which("chromium")
    assert chromium, "chromium is installed by scripts/install-deps"
    proc, base = served

    def counters() -> dict[str, int]:
        return json.loads(fetch(base + "/api/stats")[1])["counters"]  # type: ignore[no-any-return]

    time.sleep(1.2)  # the picture is at most a second old
    before = counters()["puts"]
    put_some(proc.addr, 3, "page")

    def objects() -> Optional[int]:
        c = counters()
        return int(c["objects"]) if c["puts"] >= before + 3 else None

    want = until(objects, "the puts published")
    art = Path(os.environ.get("KVPOOL_ARTIFACTS", ROOT / "build" / "artifacts"))
    art.mkdir(parents=True, exist_ok=True)
    shot = art / "status-page.png"
    with tempfile.TemporaryDirectory() as prof:
        flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 f"--user-data-dir={prof}", "--window-size=1280,1400", "--virtual-time-budget=5000"]
        dom = subprocess.run(flags + ["--dump-dom", base + "/"], capture_output=True, timeout=120)
        assert dom.returncode == 0, dom.stderr.decode()[-2000:]
        shot.unlink(missing_ok=True)
        r = subprocess.run(flags + [f"--screenshot={shot}", base + "/"], capture_output=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    d = _Dom()
    d.feed(dom.stdout.decode())
    # what the script drew, not what the server sent (the HTML has "-" there)
    assert d.by_id["status"]["data-state"] == "live", d.text.get("status")
    assert int(d.by_id["objects"]["data-value"]) == want
    assert d.text["role"] == "single" and d.text["version"] == kvpool.__version__
    assert d.text["ready"] == "ready"
    assert d.rows.get("seg") == 1 and d.rows.get("tenant") == 1
    assert d.text["hit-rate"].endswith("%")
    assert "PUT_END" in d.text["ops"]


def test_a_cluster_of_masters_shows_its_roles(tmp_path: Path) -> None:
    """With etcd: the leader is ready, a standby is healthy but not ready and
    says so; the leader counts it as a follower; after the leader is killed,
    the standby's endpoint turns ready as the leader."""
    h0, h1 = kvpool_procs.free_ports(2)
    e, curl = kvpool_procs.etcd(tmp_path / "etcd")
    masters: list[subprocess.Popen[bytes]] = []
    bases = [f"http://127.0.0.1:{h0}", f"http://127.0.0.1:{h1}"]
    # a standby follows its leader's index with the cluster's node credential
    env = dict(kvpool_procs.server_env(), KVPOOL_NODE_TOKEN=secrets.token_hex(16))
    try:
        for port in (h0, h1):
            masters.append(subprocess.Popen(
                [kvpool_procs.kvpool_bin(), "master", "--listen", "127.0.0.1:0", "--etcd", curl,
                 "--cluster", "http", "--http", f"127.0.0.1:{port}"],
                env=env, start_new_session=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_http(f"http://127.0.0.1:{port}/healthz")

        def roles() -> Optional[tuple[int, int]]:
            r = [fetch(b + "/readyz")[0] for b in bases]
            return (r.index(200), r.index(503)) if sorted(r) == [200, 503] else None

        lead, stand = until(roles, "one leader, one standby", 30)
        st, body, _ = fetch(bases[stand] + "/readyz")
        assert st == 503 and body.startswith("standby"), body
        st, body, _ = fetch(bases[stand] + "/api/kv/lookup?hashes=1")  # the leader answers
        assert st == 503 and json.loads(body)["error"].startswith("standby"), body
        st, body, _ = fetch(bases[lead] + "/api/kv/lookup?hashes=1")
        assert st == 200 and json.loads(body)["any"] == 0, body
        st, body, _ = fetch(bases[stand] + "/get_all_segments")  # as Mooncake's standby
        assert st == 503 and body == "service plane is not active\n", body
        st, body, _ = fetch(bases[lead] + "/get_all_segments")  # no segment mounted yet
        assert st == 200 and body == "", body
        assert fetch(bases[stand] + "/healthz")[0] == 200
        assert samples(fetch(bases[stand] + "/metrics")[1],
                       "kvpool_master_role")['{role="standby"}'] == 1
        until(lambda: json.loads(fetch(bases[lead] + "/api/stats")[1])["repl"]["followers"] == 1,
              "the standby follows the leader", 30)
        j = json.loads(fetch(bases[lead] + "/api/stats")[1])
        assert j["role"] == "leader"
        (sb,) = j["repl"]["standbys"]
        assert sb["peer"].startswith("127.0.0.1") and sb["lag"] >= 0
        os.killpg(masters[lead].pid, 9)
        masters[lead].wait(10)
        until(lambda: fetch(bases[stand] + "/readyz")[0] == 200, "the standby took over", 30)
        assert samples(fetch(bases[stand] + "/metrics")[1],
                       "kvpool_master_role")['{role="leader"}'] == 1
    finally:
        for m in masters:
            if m.poll() is None:
                os.killpg(m.pid, 15)
                m.wait(30)
        e.terminate()
        e.wait(20)


def test_get_all_segments_lists_names_as_mooncake(served: tuple[kvpool_procs.Proc, str]) -> None:
    """Mooncake's master route: the mounted segments' names, one a line,
    text/plain; SGLang's check_server waits for a non-empty body."""
    proc, base = served
    names = until(lambda: [sg["name"] for sg in json.loads(fetch(base + "/api/stats")[1])
                           ["segments"]], "the node's segment published")
    assert len(names) == 1 and names[0]
    st, body, hdr = fetch(base + "/get_all_segments")
    assert st == 200 and hdr["Content-Type"] == "text/plain; version=0.0.4"
    assert body == names[0] + "\n"
    # an embedded client's segment joins the list under its own name
    c = kvpool.Client({"master": proc.addr, "mode": "embedded", "global_segment_size": "8MiB",
                       "local_hostname": "127.0.0.1"})
    try:
        seg = str(c.segment_name)
        until(lambda: sorted(fetch(base + "/get_all_segments")[1].splitlines())
              == sorted(names + [seg]), "the embedded segment listed")
    finally:
        c.close()
    assert fetch(base + "/get_all_segments", method="POST")[0] == 405


def test_kvpool_stat_names_the_masters_release(served: tuple[kvpool_procs.Proc, str]) -> None:
    """The master's HELLO answer carries its release: `kvpool stat` shows it."""
    proc, _ = served
    env = kvpool_procs.server_env()
    r = subprocess.run([kvpool_procs.kvpool_bin(), "stat", "--master", proc.addr],
                       capture_output=True, timeout=30, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().splitlines()[0] == f"master version {kvpool.__version__}"
    r = subprocess.run([kvpool_procs.kvpool_bin(), "stat", "--master", proc.addr, "--json"],
                       capture_output=True, timeout=30, env=env)
    assert json.loads(r.stdout)["version"] == kvpool.__version__
    v = subprocess.run([kvpool_procs.kvpool_bin(), "--version"], capture_output=True, timeout=30)
    assert v.stdout.decode().strip() == f"kvpool {kvpool.__version__}"


# ------------------------------------------------------------ /api/kv/lookup

H0 = 0xFEDCBA9876543210  # 20 decimal digits


def put_chain(c: kvpool.Client, prefix: str, hashes: list[int], group: int = 0) -> None:
    """One object per block of the chain (parts 1)."""
    blocks = [kvpool.Block(h, hashes[i - 1] if i else None, 16, 1, group)
              for i, h in enumerate(hashes)]
    res = c.put_batch([f"{prefix}-{i}" for i in range(len(hashes))],
                      [bytes([i]) * 700 for i in range(len(hashes))], blocks=blocks)
    assert res == [None] * len(hashes), res


def lookup(base: str, hashes: list[int], group: Optional[int] = None, tenant: Optional[str] = None,
           hexa: bool = False, token: Optional[str] = None) -> tuple[int, dict]:  # type: ignore[type-arg]
    q = {"hashes": ",".join(hex(h) if hexa else str(h) for h in hashes)}
    if group is not None:
        q["group"] = str(group)
    if tenant is not None:
        q["tenant"] = tenant
    st, body, hdr = fetch(base + "/api/kv/lookup?" + urllib.parse.urlencode(q), token=token)
    assert hdr["Content-Type"] == "application/json", hdr
    return st, json.loads(body)


def test_kv_lookup_answers_as_lookup_hashes(served: tuple[kvpool_procs.Proc, str]) -> None:
    proc, base = served
    a = [H0 + i for i in range(5)]
    g = [H0 + 100, H0 + 101]
    t = [H0 + 200, H0 + 201]
    with kvpool.Client({"master": proc.addr, "mode": "standalone-store"}) as c, \
            kvpool.Client({"master": proc.addr, "mode": "standalone-store",
                           "tenant": "http-t"}) as ct:
        put_chain(c, "kvl-a", a[:3])  # a[3:] never put
        put_chain(c, "kvl-g", g, group=3)
        put_chain(ct, "kvl-t", t)
        cases = [  # (client of the tenant, chain, group, tenant, hex)
            (c, a, None, None, False),            # a hit chain: 3 of 5
            (c, a[:2], None, None, True),         # hex
            (c, a, 0, "default", False),
            (c, a[:4], None, "", False),          # "" is "default"
            (c, [a[3]] + a[:3], None, None, False),  # first block missing: 0
            (c, a[1:3], None, None, False),       # a chain need not start at the root
            (c, g, 3, None, False),               # another group
            (c, g, None, None, False),            # ... not in group 0
            (c, g, 255, None, False),
            (ct, t, None, "http-t", False),       # a tenant's own blocks
            (c, t, None, None, False),            # ... not the default tenant's
        ]
        for cl, chain, group, tenant, hexa in cases:
            want = cl.lookup_hashes([chain], [group or 0])[0]
            st, j = lookup(base, chain, group, tenant, hexa)
            assert st == 200, j
            assert j == {"tenant": tenant or "default", "group": group or 0, "blocks": len(chain),
                         "dram": want.dram, "disk": want.disk, "any": want.any}, (j, want)
        assert c.lookup_hashes([a])[0] == kvpool.HashPrefix(3, 0, 3)
        assert ct.lookup_hashes([t])[0] == kvpool.HashPrefix(2, 0, 2)
        assert c.lookup_hashes([g], [3])[0].any == 2
    # an unknown tenant holds nothing
    st, j = lookup(base, a, tenant="no-such-tenant")
    assert st == 200 and j == {"tenant": "no-such-tenant", "group": 0, "blocks": 5, "dram": 0,
                               "disk": 0, "any": 0}, j


def test_kv_lookup_refuses_bad_arguments(served: tuple[kvpool_procs.Proc, str]) -> None:
    _, base = served
    cases = {
        "": "hashes: missing",
        "hashes=": "hashes: empty list",
        "hashes=abc": 'hash 1 ("abc") is not an unsigned integer',
        "hashes=1,-2": 'hash 2 ("-2") is not an unsigned integer',
        "hashes=18446744073709551616": "larger than 2^64-1",
        "hashes=0x1ffffffffffffffff": "larger than 2^64-1",
        "hashes=1,,2": "hash 2 of 3 is empty",
        "hashes=" + ",".join(["1"] * 4097): "hashes: 4097 given, at most 4096",
        "hashes=1&group=256": "group:",
        "hashes=1&group=-1": "group:",
        "hashes=1&hashes=2": 'parameter "hashes" given twice',
        "hashes=1&limit=2": 'unknown parameter "limit"',
        "hashes=1&tenant=" + "x" * 256: "tenant: 256 bytes, at most 255",
    }
    for q, says in cases.items():
        st, body, hdr = fetch(base + "/api/kv/lookup?" + q)
        assert st == 400 and hdr["Content-Type"] == "application/json", (q[:80], st, body)
        assert says in json.loads(body)["error"], (q[:80], body)
    # the largest query fits: 4096 hashes of 20 digits, a 255-byte tenant
    chain = [(1 << 64) - 1 - i for i in range(4096)]
    st, j = lookup(base, chain, group=31, tenant="t" * 255)
    assert st == 200 and j["blocks"] == 4096 and j["any"] == 0 and len(j["tenant"]) == 255, st
    # a URL past the connection's memory: 414 (or the connection closed), never served
    host, port = base.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        req = ("GET /api/kv/lookup?hashes=" + ",".join(["1"] * 150_000) +
               " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").encode()
        try:
            s.sendall(req)
            ans = s.recv(4096)
        except OSError:  # reset while sending: refused before the end
            ans = b""
        assert ans == b"" or ans.startswith(b"HTTP/1.1 414"), ans[:200]
    assert fetch(base + "/api/kv/lookup?hashes=1")[0] == 200  # and it goes on
    assert fetch(base + "/readyz")[0] == 200


def test_kv_lookup_answers_while_the_master_is_busy(served: tuple[kvpool_procs.Proc, str]) -> None:
    """Clients keep the master's loop busy (puts, gets, lookups over the
    wire) while HTTP lookups go through it: each is answered, well within
    the endpoint's 2 s wait, and agrees with the wire's answer."""
    proc, base = served
    chain = [H0 + 300 + i for i in range(8)]
    with kvpool.Client({"master": proc.addr, "mode": "standalone-store"}) as c:
        put_chain(c, "kvl-busy", chain)
        stop = threading.Event()
        errors: list[str] = []
        ops = [0]

        def hammer(n: int) -> None:
            try:
                with kvpool.Client({"master": proc.addr, "mode": "standalone-store"}) as w:
                    val = bytes([n]) * 65536
                    i = 0
                    while not stop.is_set():
                        keys = [f"kvl-busy-{n}-{(i + k) % 32}" for k in range(8)]
                        assert w.put_batch(keys, [val] * 8) == [None] * 8
                        assert w.get(keys[0]) == val
                        assert w.lookup_hashes([chain])[0].any == 8
                        ops[0] += 1
                        i += 8
            except Exception as e:  # noqa: BLE001 -- reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=hammer, args=(n,)) for n in range(4)]
        for th in threads:
            th.start()
        try:
            worst, n = 0.0, 0
            end = time.monotonic() + 3
            while time.monotonic() < end:
                t0 = time.monotonic()
                st, j = lookup(base, chain + [1])
                worst = max(worst, time.monotonic() - t0)
                assert st == 200 and j["any"] == 8 and j["blocks"] == 9, j
                n += 1
        finally:
            stop.set()
            for th in threads:
                th.join(30)
        assert not errors, errors
        assert ops[0] > 0 and n > 0
        assert worst < 2.0, worst


# ------------------------------------------------------------ configurations

FP_A, FP_B = "0123456789abcdef", "fedcba9876543210"
TAIL = "@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@"


def test_configurations_in_stat_api_metrics_and_page(served: tuple[kvpool_procs.Proc, str]) -> None:
    """Objects whose keys carry @cfg:<fingerprint> (kvpool.vllm's) are counted
    per configuration: `kvpool stat` (table and --json), /api/stats, /metrics."""
    proc, base = served
    c = kvpool.Client({"master": proc.addr, "mode": "standalone-store"})
    try:
        for i in range(3):
            c.put(f"cfgtest@Model@cfg:{FP_A}{TAIL}{i:04x}", b"a" * 1000)
        c.put(f"cfgtest@Model@cfg:{FP_B}{TAIL}0000", b"b" * 500)
        c.put(f"cfgtest@Model@cfg:{FP_A}@kvpool-config", b'{"dtype": "bfloat16"}')
    finally:
        c.close()
    env = kvpool_procs.server_env()
    r = subprocess.run([kvpool_procs.kvpool_bin(), "stat", "--master", proc.addr],
                       capture_output=True, timeout=30, env=env, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = next(i for i, l in enumerate(lines) if l.startswith("CONFIGURATION"))
    rows = {tuple(l.split()[:3]): l.split()[3] for l in lines[head + 1:] if l.startswith("cfgtest@")}
    assert rows == {("cfgtest@Model", "default", FP_A): "4", ("cfgtest@Model", "default", FP_B): "1"}
    assert "@kvpool-config" in r.stdout  # how to read a configuration's description
    r = subprocess.run([kvpool_procs.kvpool_bin(), "stat", "--master", proc.addr, "--json"],
                       capture_output=True, timeout=30, env=env, text=True)
    cf = {(x["name"], x["fingerprint"]): x for x in json.loads(r.stdout)["configs"]}
    assert cf[("cfgtest@Model", FP_A)]["objects"] == 4
    assert cf[("cfgtest@Model", FP_A)]["bytes"] == 3000 + len(b'{"dtype": "bfloat16"}')
    assert cf[("cfgtest@Model", FP_B)] == {"tenant": "default", "name": "cfgtest@Model",
                                           "fingerprint": FP_B, "objects": 1, "bytes": 500}
    # the HTTP picture is republished every second
    j = until(lambda: (lambda s: s if any(x["name"] == "cfgtest@Model" for x in s["configs"])
                       else None)(json.loads(fetch(base + "/api/stats")[1])), "configs in /api/stats")
    api = {(x["name"], x["fingerprint"]): x["objects"] for x in j["configs"]}
    assert api[("cfgtest@Model", FP_A)] == 4 and api[("cfgtest@Model", FP_B)] == 1
    text = fetch(base + "/metrics")[1]
    m = samples(text, "kvpool_config_objects")
    assert m[f'{{tenant="default",name="cfgtest@Model",fingerprint="{FP_A}"}}'] == 4
    assert samples(text, "kvpool_config_bytes")[
        f'{{tenant="default",name="cfgtest@Model",fingerprint="{FP_B}"}}'] == 500
    r = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    # the status page draws one row per configuration
    with tempfile.TemporaryDirectory() as prof:
        dom = subprocess.run([shutil.which("chromium") or "chromium", "--headless", "--no-sandbox",
                              "--disable-gpu", "--no-first-run", f"--user-data-dir={prof}",
                              "--virtual-time-budget=5000", "--dump-dom", base + "/"],
                             capture_output=True, timeout=120)
    assert dom.returncode == 0, dom.stderr.decode()[-2000:]
    d = _Dom()
    d.feed(dom.stdout.decode())
    assert d.rows.get("config") == len(j["configs"]) >= 2
    assert FP_A in d.text["configs"] and "cfgtest@Model" in d.text["configs"]


def _raw(port: int, src: str, data: bytes, timeout: float = 2.0) -> socket.socket:
    s = socket.socket()
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    if data:
        s.sendall(data)
    return s


def _status(port: int, src: str, req: bytes) -> int:
    """The status of one request from address src, or -1 (refused, closed
    unanswered, or no answer within 2 s)."""
    try:
        s = _raw(port, src, req)
        try:
            head = s.recv(64)
        finally:
            s.close()
    except OSError:
        return -1
    return int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else -1


def test_slow_headers_leave_the_probes_answerable() -> None:
    """64 connections from 8 loopback addresses, each sending a header line
    every 0.5 s: /healthz and /metrics stay answered (a token is set, checked
    only after the headers), and every slow connection is closed by its
    header deadline. Bounded: the slow senders stop after 7 s."""
    (port,) = kvpool_procs.free_ports(1)
    with tempfile.TemporaryDirectory() as d:
        tok = Path(d) / "tok"
        tok.write_text("sekrit\n")
        tok.chmod(0o600)
        p = kvpool_procs.serve("64MiB", "--http", f"127.0.0.1:{port}",
                               "--http-token-file", str(tok))
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz")
            assert _status(port, "127.0.0.4", b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") == 401
            slow = [_raw(port, f"127.0.0.{2 + i % 8}", b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    for i in range(64)]
            closed = [False] * 64
            t0 = time.monotonic()
            probes: list[tuple[int, int]] = []
            n = 0
            while time.monotonic() - t0 < 7.0 and not all(closed):
                for i, s in enumerate(slow):
                    if closed[i]:
                        continue
                    try:
                        s.setblocking(False)
                        try:
                            if s.recv(1) == b"":
                                closed[i] = True
                                continue
                        except BlockingIOError:
                            pass
                        s.setblocking(True)
                        s.sendall(f"X-Slow-{n}: 1\r\n".encode())
                    except OSError:
                        closed[i] = True
                n += 1
                probes.append((_status(port, "127.0.0.1", b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
                               _status(port, "127.0.0.3", b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
                                       b"Authorization: Bearer sekrit\r\n\r\n")))
                time.sleep(0.5)
            elapsed = time.monotonic() - t0
            for s in slow:
                s.close()
            assert all(a == 200 and b == 200 for a, b in probes), probes
            assert all(closed) and elapsed < 6.5, (sum(closed), elapsed)
        finally:
            p.stop()


def test_too_many_query_arguments_are_answered_at_once(served: tuple[kvpool_procs.Proc, str]) -> None:
    _, base = served
    port = int(base.rsplit(":", 1)[1])
    t0 = time.monotonic()
    st = _status(port, "127.0.0.1", b"GET /api/stats?" + b"&" * 19999 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert st == 400 and time.monotonic() - t0 < 2.0


def test_protected_tenants_need_the_token_even_on_loopback(tmp_path: Path) -> None:
    """With tenant_tokens_file the master's endpoint shows every tenant's
    objects (/metrics, /api/stats, /api/kv/lookup): it needs
    http_token_file even on loopback (the start is refused without), and
    then only the probes answer without the token."""
    def secret(name: str, text: str) -> str:
        f = tmp_path / name
        f.write_text(text)
        f.chmod(0o600)
        return str(f)
    tenants = secret("tenants", "alice tok-alice-0123456789\n")
    node = secret("node", "node-token-0123456789\n")
    http_tok = secret("http", "http-token-0123456789\n")
    (port,) = kvpool_procs.free_ports(1)
    base = ["--tenant-tokens-file", tenants, "--node-token-file", node,
            "--http", f"127.0.0.1:{port}"]
    r = subprocess.run([kvpool_procs.kvpool_bin(), "master", "--listen", "127.0.0.1:0", *base],
                       capture_output=True, timeout=15, env=kvpool_procs.server_env())
    assert r.returncode != 0 and b"http_token_file" in r.stderr, r
    p = kvpool_procs.master(*base, "--http-token-file", http_tok)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        for path in ("/metrics", "/api/stats", "/api/kv/lookup?tenant=alice&hash=1", "/"):
            assert fetch(f"http://127.0.0.1:{port}{path}")[0] == 401, path
        assert fetch(f"http://127.0.0.1:{port}/healthz")[0] == 200
        assert fetch(f"http://127.0.0.1:{port}/api/stats", "http-token-0123456789")[0] == 200
    finally:
        assert p.stop() == 0
