"""deploy/: the systemd units, the Containerfile, the bash completion and the
Grafana dashboard, checked against the program and the repository so that
they cannot drift from them."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from kvpool_procs import free_ports, kvpool_bin, server_env

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = ("kvpool-master.service", "kvpool-store.service")


def unit(name: str) -> dict[str, list[str]]:
    """A unit file as {"Section.Key": [values in order]} (keys may repeat)."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in (DEPLOY / "systemd" / name).read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        k, _, v = line.partition("=")
        out.setdefault(f"{section}.{k.strip()}", []).append(v.strip())
    return out


def help_flags(sub: str) -> set[str]:
    r = subprocess.run([kvpool_bin(), sub, "--help"], capture_output=True, text=True,
                       env=server_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    return set(re.findall(r"--[a-z0-9][a-z0-9-]*", r.stdout))


def config_keys() -> list[str]:
    r = subprocess.run([kvpool_bin(), "help", "config"], capture_output=True, text=True,
                       env=server_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    return re.findall(r"^([a-z][a-z0-9_]*) ", r.stdout, re.M)


def example_config() -> dict[str, object]:
    """deploy/kvpool.example.json without its whole-line comments."""
    text = "\n".join("" if re.match(r"\s*(#|//)", ln) else ln
                     for ln in (DEPLOY / "kvpool.example.json").read_text().splitlines())
    cfg = json.loads(text)
    assert isinstance(cfg, dict)
    return cfg


@pytest.mark.parametrize("name", UNITS)
def test_unit_is_a_hardened_notify_service(name: str) -> None:
    u = unit(name)
    for key, want in {"Type": "notify", "Restart": "on-failure", "ProtectSystem": "strict",
                      "NoNewPrivileges": "yes", "User": "kvpool"}.items():
        assert u.get(f"Service.{key}") == [want], (name, key)
    for key in ("LimitNOFILE", "ReadWritePaths", "LoadCredential", "ExecStart"):
        assert f"Service.{key}" in u, (name, key)
    cfg = example_config()
    rw = u["Service.ReadWritePaths"][0].split()
    for key in ("snapshot_file", "offload_dir"):
        assert any(str(cfg[key]).startswith(p + "/") for p in rw), (name, key, rw)
    if name == "kvpool-store.service":
        assert u["Service.LimitMEMLOCK"] == ["infinity"]


@pytest.mark.parametrize("name", UNITS)
def test_unit_command_line_is_the_programs(name: str) -> None:
    """Every flag of ExecStart is one `kvpool CMD --help` names; every
    credential is a *_file key of the configuration, loaded by LoadCredential."""
    u = unit(name)
    argv = shlex.split(u["Service.ExecStart"][0])
    assert argv[0] == "/usr/local/bin/kvpool"  # make install rewrites it to $(BINDIR)
    sub = argv[1]
    known = help_flags(sub)
    keys = set(config_keys())
    creds = {c.split(":", 1)[0]: c.split(":", 1)[1] for c in u["Service.LoadCredential"]}
    used: set[str] = set()
    flags = [a for a in argv[2:] if a.startswith("--")]
    assert flags and argv[2] == "--config" and argv[3] == "/etc/kvpool/kvpool.json"
    for i, a in enumerate(argv[2:], 2):
        if not a.startswith("--"):
            continue
        assert a in known, f"{name}: kvpool {sub} has no flag {a}"
        v = argv[i + 1]
        if v.startswith("%d/"):
            key = a[2:].replace("-", "_")
            assert key.endswith("_file") and key in keys, (name, a)
            assert v[3:] in creds, (name, v)
            used.add(v[3:])
            assert creds[v[3:]].startswith("/etc/kvpool/")
    assert used == set(creds), (name, creds, used)


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    paths = []
    for name in UNITS:
        p = tmp_path / name  # verify checks the program exists: the one under test
        p.write_text((DEPLOY / "systemd" / name).read_text()
                     .replace("/usr/local/bin/kvpool", kvpool_bin()))
        paths.append(str(p))
    r = subprocess.run([tool, "verify", *paths], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and not r.stderr.strip(), r.stdout + r.stderr


def _expand(argv: list[str], creds: Path, cfg: Path) -> list[str]:
    out = [kvpool_bin()] + argv[1:]
    out = [str(cfg) if a == "/etc/kvpool/kvpool.json" else
           a.replace("%d", str(creds)) for a in out]
    for i, a in enumerate(out[:-1]):  # the HTTP endpoint on loopback, at a free port
        if a == "--http":
            out[i + 1] = f"127.0.0.1:{free_ports(1)[0]}"
    return out


def _start_ready(argv: list[str], notify: socket.socket, addr: str, log: Path,
                 ) -> subprocess.Popen[bytes]:
    env = server_env()
    env["NOTIFY_SOCKET"] = addr
    with open(log, "ab") as lf:
        p = subprocess.Popen(argv, stdout=lf, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
    notify.settimeout(60)
    try:
        while notify.recv(4096).decode().split("\n")[0] != "READY=1":
            pass
    except TimeoutError:
        p.kill()
        raise AssertionError(f"{argv[1]} never ready: {log.read_text(errors='replace')[-2000:]}")
    return p


def _stop(p: subprocess.Popen[bytes]) -> int:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            return p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
    return p.wait()


def test_units_command_lines_serve_with_the_example_config(tmp_path: Path) -> None:
    """ExecStart of both units as systemd would run them (%d = a credentials
    directory of 0600 files), on the example configuration with its host
    paths and addresses moved to this machine: both become READY."""
    creds = tmp_path / "creds"
    creds.mkdir()
    for name, text in {"cluster.token": "c" * 44, "node.token": "n" * 44, "http.token": "h" * 44,
                       "tenants": "team-a " + "t" * 44 + " max_bytes=1GiB\n"}.items():
        (creds / name).write_text(text + "\n")
        (creds / name).chmod(0o600)
    cfg = example_config()
    cfg.update(listen="127.0.0.1:0", snapshot_file=str(tmp_path / "state" / "master.snapshot"),
               offload_dir=str(tmp_path / "state" / "offload"), local_hostname="127.0.0.1",
               global_segment_size="64MiB", offload_capacity="512MiB", shm_group="",
               max_master_memory="64MiB", input_memory_budget="128MiB")
    (tmp_path / "state").mkdir()
    cfg_path = tmp_path / "kvpool.json"
    log = tmp_path / "log"
    sock_path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as n:
        n.bind(sock_path)
        cfg_path.write_text(json.dumps(cfg))
        m_argv = _expand(shlex.split(unit(UNITS[0])["Service.ExecStart"][0]), creds, cfg_path)
        port_file = tmp_path / "port"
        m = _start_ready(m_argv + ["--port-file", str(port_file)], n, sock_path, log)
        try:
            cfg["master"] = f"127.0.0.1:{port_file.read_text().strip()}"
            cfg_path.write_text(json.dumps(cfg))
            s_argv = _expand(shlex.split(unit(UNITS[1])["Service.ExecStart"][0]), creds, cfg_path)
            s_argv = [str(tmp_path / "run") if a == "/run/kvpool" else a for a in s_argv]
            s = _start_ready(s_argv, n, sock_path, log)
            assert _stop(s) == 0, log.read_text(errors="replace")[-2000:]
        finally:
            assert _stop(m) == 0, log.read_text(errors="replace")[-2000:]


# ------------------------------------------------------------ Containerfile

def _containerfile() -> list[str]:
    """The Containerfile's instructions, continuation lines joined."""
    text = (DEPLOY / "Containerfile").read_text()
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    return [i.strip() for i in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines() if i.strip()]


def test_containerfile_packages_exist_in_apt() -> None:
    if shutil.which("apt-cache") is None:
        pytest.skip("apt-cache is not installed (not a Debian machine)")
    pkgs: list[str] = []
    for ins in _containerfile():
        for m in re.finditer(r"apt-get install((?: +-{1,2}[a-z-]+)*)((?: +[a-z0-9][a-z0-9.+-]+)+)", ins):
            pkgs += m.group(2).split()
    assert {"libjansson4", "libxxhash0", "liburing2", "libmicrohttpd12", "libzmq5", "libmsgpackc2",
            "libcurl4"} <= set(pkgs)
    for p in pkgs:
        r = subprocess.run(["apt-cache", "show", p], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and f"Package: {p}" in r.stdout, f"no Debian package {p}"


def test_containerfile_copies_what_the_repository_has() -> None:
    ins = _containerfile()
    assert ins[0].startswith("FROM debian:12 AS build")
    copies = [shlex.split(i)[1:-1] for i in ins if i.startswith("COPY ") and "--from=" not in i]
    assert copies
    for srcs in copies:
        for src in srcs:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
    assert any(i.startswith("USER ") and "root" not in i for i in ins)
    assert any(i.startswith("EXPOSE ") for i in ins)
    health = [i for i in ins if i.startswith("HEALTHCHECK ")]
    port = re.search(r"curl -f\S* .*http://127\.0\.0\.1:(\d+)/healthz", health[0])
    assert port, health
    cmd = next(i for i in ins if i.startswith("CMD "))
    assert f"0.0.0.0:{port.group(1)}" in cmd and port.group(1) in next(
        i for i in ins if i.startswith("EXPOSE "))


# --------------------------------------------------------- bash completion

def complete(*words: str, cwd: Path = ROOT) -> list[str]:
    """COMPREPLY of deploy/completion/kvpool.bash for the command line
    words (the last one is completed)."""
    script = ('source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); '
              '_kvpool; printf "%s\\n" "${COMPREPLY[@]}"')
    r = subprocess.run(["bash", "-c", script, "bash", str(DEPLOY / "completion" / "kvpool.bash"),
                        kvpool_bin(), *words], capture_output=True, text=True, cwd=cwd,
                       env=server_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def test_completion_subcommands_come_from_kvpool_help() -> None:
    got = complete("")
    for c in ("serve", "master", "store", "stat", "put", "get", "help", "version", "--help"):
        assert c in got
    assert complete("ma") == ["master"]
    assert complete("s") == ["serve", "store", "stat", "sim"]
    topics = complete("help", "")
    assert "config" in topics and "master" in topics and "help" not in topics


def test_completion_flags_per_subcommand_and_config_keys() -> None:
    assert complete("master", "--tenant-t") == ["--tenant-tokens-file"]
    assert complete("master", "--lease") == ["--lease-ttl"]
    assert complete("put", "--lease") == []  # put does not read lease_ttl: refuses it
    store = complete("store", "--")
    assert {"--master-optional", "--unix-dir", "--offload-dir", "--config", "--help"} <= set(store)
    assert "--lease-ttl" not in store
    assert set(complete("serve", "--port-file", "x", "--")) >= {"--segment-size", "--listen"}


def test_completion_files_after_file_flags(tmp_path: Path) -> None:
    (tmp_path / "kvpool.json").write_text("{}")
    (tmp_path / "cluster.token").write_text("x")
    (tmp_path / "tier").mkdir()
    (tmp_path / "node token").write_text("x")
    assert complete("master", "--config", "kv", cwd=tmp_path) == ["kvpool.json"]
    assert complete("store", "--cluster-token-file", "clu", cwd=tmp_path) == ["cluster.token"]
    assert complete("store", "--offload-dir", "", cwd=tmp_path) == ["tier"]
    assert complete("store", "--config", "=", "kv", cwd=tmp_path) == ["kvpool.json"]
    assert complete("store", "--node-token-file", "no", cwd=tmp_path) == ["node token"]


# ------------------------------------------------------- Grafana dashboard

# the metric names the servers export (the names the dashboard may use)
METRICS = {
    "kvpool_objects", "kvpool_bytes", "kvpool_capacity_bytes", "kvpool_used_bytes",
    "kvpool_segment_capacity_bytes", "kvpool_segment_used_bytes", "kvpool_hits_total",
    "kvpool_misses_total", "kvpool_puts_total", "kvpool_put_bytes_total",
    "kvpool_hit_bytes_total", "kvpool_evictions_total", "kvpool_spills_total",
    "kvpool_loads_total", "kvpool_pressure_refusals_total", "kvpool_leases",
    "kvpool_pending_puts", "kvpool_tenant_objects", "kvpool_tenant_bytes",
    "kvpool_request_duration_seconds_bucket", "kvpool_requests_total", "kvpool_errors_total",
    "kvpool_connections", "kvpool_connections_refused_total", "kvpool_repl_lag_records",
    "kvpool_repl_followers", "kvpool_node_transfer_bytes_total", "kvpool_node_connections",
    "kvpool_client_bytes_total",
}


def _exprs(node: object) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "expr" and isinstance(v, str)] + \
            [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def test_grafana_dashboard_uses_only_exported_metrics() -> None:
    d = json.loads((DEPLOY / "grafana" / "kvpool.json").read_text())
    assert d["schemaVersion"] == 39
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    exprs = _exprs(d["panels"])
    assert len(exprs) >= 20
    used: set[str] = set()
    for e in exprs:
        names = set(re.findall(r"\bkvpool_[a-z_]+", e))
        assert names <= METRICS, f"{e}: not exported: {names - METRICS}"
        assert names or re.match(r"up\b", e), e
        used |= names
    assert METRICS - used == set(), f"metrics no panel shows: {METRICS - used}"
    for p in d["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
    titles = " ".join(p["title"] for p in d["panels"]).lower()
    for want in ("hit rate", "throughput", "p50", "p99", "tier", "segment", "evictions",
                 "pressure", "errors", "connections", "replication"):
        assert want in titles, want
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))


# ------------------------------------------------------------ Prometheus

def test_prometheus_example_passes_promtool(tmp_path: Path) -> None:
    """deploy/prometheus/prometheus.yml is a valid Prometheus configuration
    (its token file moved to a temp file: promtool checks that it exists)."""
    tok = tmp_path / "token"
    tok.write_text("t" * 44 + "\n")
    text = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    assert "/etc/prometheus/kvpool-http.token" in text
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(text.replace("/etc/prometheus/kvpool-http.token", str(tok)))
    r = subprocess.run(["promtool", "check", "config", str(cfg)], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
