"""Cross-host faults of a kvpool cluster under a verifying client load.

Each test builds its hosts (network namespaces on a bridge, 10.77.0.x;
cluster.py), runs etcd, 2 or 3 masters electing a leader through it, 2
storage nodes (64 MiB segments) and the load (load.py: puts of values whose
bytes derive from the key, gets comparing every byte), lets the load run,
injects one fault and measures, from the fault, how long until puts and gets
succeed again. Every test asserts: no wrong byte (in the load's gets and in
the final read-back of every key), every failed call reported to its caller
as a kvpool.Error (never another exception, never a call that hangs), and
recovery within a bound. Each counts the published objects (puts that
succeeded) no longer readable at the end and prints the count with the
recovery times (the summary's "cluster measurements" section) and asserts
it is 0 wherever the fault leaves every node's memory alive (the index
follows the leader to its standbys; only a node's death loses what it
held)."""
from __future__ import annotations

import signal
import subprocess
import time
from typing import Callable, Optional

import pytest

import cluster as cl
from cluster import Cluster, LoadProc, Recovery, analyse, now

BASELINE_S = 2.5   # load before the fault
AFTER_S = 2.0      # load after the recovery
PRINT: list[str] = []


def report(name: str, line: str) -> None:
    PRINT.append(f"{name}: {line}")
    print(f"{name}: {line}")


def baseline(c: Cluster, ld: LoadProc) -> None:
    """The load runs cleanly before any fault: every call succeeds."""
    c.run_load(ld, BASELINE_S)
    r = analyse(ld.events, 0.0)
    assert not r.failed and r.wrong == 0, f"failures before any fault: {r.line()}"
    assert sum(1 for e in ld.events if e[2] == "get" and e[4] == "ok") > 10, r.line()


class Loss:
    def __init__(self, v: dict, fault_t: float) -> None:
        self.before = [x for x in v["acked"] if x[1] <= fault_t and x[2] != "ok"]
        self.after = [x for x in v["acked"] if x[1] > fault_t and x[2] != "ok"]
        self.n_before = sum(1 for x in v["acked"] if x[1] <= fault_t)
        self.n_after = len(v["acked"]) - self.n_before
        self.wrong = [x for x in v["acked"] + v["failed"] if x[2] == "wrong"]
        self.stored_failed = sum(1 for x in v["failed"] if x[2] == "ok")
        self.misreported = [x for x in v["acked"] + v["failed"] if x[2].startswith("X:")]

    @property
    def total(self) -> int:
        return len(self.before) + len(self.after)

    def line(self) -> str:
        why: dict[str, int] = {}
        for x in self.before + self.after:
            why[x[2]] = why.get(x[2], 0) + 1
        how = ", ".join(f"{k} x{n}" for k, n in sorted(why.items()))
        return (f"lost {self.total} published objects ({len(self.before)} of {self.n_before} "
                f"put before the fault, {len(self.after)} of {self.n_after} after"
                f"{'; ' + how if how else ''}); {self.stored_failed} failed puts stored anyway")


def finish(c: Cluster, ld: LoadProc, fault_t: float, name: str,
           recs: Optional[list[tuple[str, Recovery]]] = None) -> Loss:
    """After the last fault: more load, then every key read back. Asserts no
    wrong byte and no misreported failure anywhere; reports recovery and loss."""
    c.run_load(ld, AFTER_S)
    ld.pause()
    r = analyse(ld.events, fault_t)
    loss = Loss(ld.verify(), fault_t)
    for what, rec in recs or [("", r)]:
        report(name, f"{what}{rec.line()}")
    report(name, loss.line())
    assert r.wrong == 0 and not loss.wrong, \
        f"wrong bytes: {r.wrong} in the load, {loss.wrong[:5]} read back\n{c.logs_tail()}"
    assert not r.misreported and not loss.misreported, \
        f"failures not reported as kvpool.Error: {r.misreported[:5]} {loss.misreported[:5]}"
    return loss


def recovered(c: Cluster, ld: LoadProc, fault_t: float, bound_s: float,
              settle_s: float = cl.STABLE_S) -> Recovery:
    r = c.wait_recovered(ld, fault_t, settle_s=settle_s)
    assert r.put_s is not None and r.get_s is not None, r.line()
    assert r.put_s < bound_s and r.get_s < bound_s, \
        f"recovery slower than {bound_s} s: {r.line()}\n{c.logs_tail()}"
    return r


def direct_put(c: Cluster, m: cl.Master, key: str) -> subprocess.Popen[bytes]:
    """kvpool put KEY on the client host, naming master m itself (no etcd)."""
    return c.client.spawn("direct-put", cl.kvpool_procs.kvpool_bin(), "put", "--master", m.addr,
                          "--rpc-timeout", "3s", key, "/etc/hostname")


# ------------------------------------------------------------------ tests

def no_loss(c: Cluster, loss: Loss) -> None:
    assert loss.total == 0, f"{loss.line()}: {(loss.before + loss.after)[:10]}\n{c.logs_tail()}"


def test_kill_leader(make_cluster: Callable[..., Cluster]) -> None:
    """kill -9 of the leader under put/get load: the standby takes over, the
    nodes remount there, puts and gets succeed again, and every object whose
    put succeeded before (or after) the kill is readable from the new
    leader, byte for byte."""
    c = make_cluster()
    ld = c.start()
    baseline(c, ld)
    c.run_load(ld, 2.0)
    m1, m2 = c.masters
    t = now()
    cl.kill(m1.proc)
    took = c.wait_leader(m2)
    r = recovered(c, ld, t, 15)
    report("kill -9 leader", f"standby named leader after {took:.2f} s")
    loss = finish(c, ld, t, "kill -9 leader", [("", r)])
    assert loss.n_before > 100, loss.line()
    no_loss(c, loss)


def test_stopped_leader_past_its_lease(make_cluster: Callable[..., Cluster]) -> None:
    """SIGSTOP of the leader past its lease: the standby takes over; once
    SIGCONT, the old leader serves nothing (a put sent to it directly
    fails) and exits 3."""
    c = make_cluster()
    ld = c.start()
    baseline(c, ld)
    m1, m2 = c.masters
    t = now()
    cl.kill(m1.proc, signal.SIGSTOP)
    took = c.wait_leader(m2)
    time.sleep(max(0.0, t + 2 * cl.LEASE_TTL_S - now()))  # well past its lease
    direct = direct_put(c, m1, "to-the-deposed-leader")  # queued at the stopped process
    time.sleep(0.3)
    tc = now()
    cl.kill(m1.proc, signal.SIGCONT)
    rc = cl.nethosts.wait_exit(m1.proc, 10)
    exited = now() - tc
    drc = cl.nethosts.wait_exit(direct, 15)
    assert rc == 3, f"the resumed old leader: exit status {rc}\n{m1.log()[-3000:]}"
    assert drc not in (None, 0), \
        f"a put sent to the deposed leader after SIGCONT: status {drc}\n{c.logs_tail()}"
    r = recovered(c, ld, t, 15)
    report("SIGSTOP leader", f"standby named leader after {took:.2f} s; the old leader exited "
                             f"{rc} {exited:.2f} s after SIGCONT; a direct put to it: status {drc}")
    no_loss(c, finish(c, ld, t, "SIGSTOP leader", [("", r)]))


def test_leader_cut_from_etcd(make_cluster: Callable[..., Cluster]) -> None:
    """The leader loses etcd (silent drops both ways) but still reaches the
    clients and the nodes: it steps down (exit 3) before its lease can
    expire, the standby takes over; the healed master rejoins as standby."""
    c = make_cluster()
    ld = c.start()
    baseline(c, ld)
    m1, m2 = c.masters
    t = now()
    c.lab.partition(m1.host, c.etcd)
    rc = cl.nethosts.wait_exit(m1.proc, 10)
    stepped = now() - t
    # cut from etcd only: the client, the nodes and the other master still reach it
    assert not m1.host.reaches(c.etcd.addr, cl.ETCD_PORT)
    assert c.client.reaches(m1.host.addr, cl.MASTER_PORT)
    assert c.nodes[0].host.reaches(m1.host.addr, cl.MASTER_PORT)
    assert m2.host.reaches(c.etcd.addr, cl.ETCD_PORT)
    c.wait_leader(m2)
    took = now() - t
    assert rc == 3, f"the leader cut from etcd: exit status {rc}\n{m1.log()[-3000:]}"
    assert stepped < cl.LEASE_TTL_S + 0.5, f"stepped down only after {stepped:.2f} s"
    r = recovered(c, ld, t, 15)
    c.lab.heal(m1.host, c.etcd)
    m1.start()
    c.wait(lambda: len(c.members()) == 2, "the healed master back as a standby")
    assert c.leader() == m2.addr
    report("leader cut from etcd", f"old leader exited {rc} after {stepped:.2f} s, standby "
                                   f"named leader after {took:.2f} s")
    no_loss(c, finish(c, ld, t, "leader cut from etcd", [("", r)]))


def test_node_cut_from_masters(make_cluster: Callable[..., Cluster]) -> None:
    """A storage node loses both masters but not the clients: the leader
    stops placing on it once it counts the node gone, puts and gets carry on
    (those of its objects fail, reported); healed, it mounts again."""
    c = make_cluster(master_args=("--lease-ttl", "2s", "--client-ttl", "4s"))
    ld = c.start()
    baseline(c, ld)
    n1 = c.nodes[0]
    t = now()
    for m in c.masters:
        c.lab.partition(n1.host, m.host)
    c.wait_segments(1, timeout=20)
    gone = now() - t
    # cut from the masters only: the client still reaches it, it still reaches etcd
    assert not n1.host.reaches(c.masters[0].host.addr, cl.MASTER_PORT)
    assert not c.masters[0].host.reaches(n1.host.addr, cl.NODE_PORT)
    assert c.client.reaches(n1.host.addr, cl.NODE_PORT)
    assert n1.host.reaches(c.etcd.addr, cl.ETCD_PORT)
    r = recovered(c, ld, t, 20)
    th = now()
    for m in c.masters:
        c.lab.heal(n1.host, m.host)
    back = c.wait_segments(2)
    report("node cut from masters", f"the leader unmounted the node after {gone:.2f} s; "
                                    f"healed, it mounted again after {back:.2f} s")
    finish(c, ld, t, "node cut from masters", [("", r)])
    assert n1.alive()


def test_restart_etcd(make_cluster: Callable[..., Cluster]) -> None:
    """etcd killed and started again on its data at once, then stopped
    (SIGTERM) for longer than the lease and started again. A leader that
    could not renew its lease meanwhile steps down (exit 3) and is started
    again by its supervisor (the test's, as systemd's Restart=on-failure);
    once etcd is back a master takes the term and the load recovers."""
    c = make_cluster()
    ld = c.start()
    c.supervise()
    baseline(c, ld)
    t = now()
    cl.kill(c.etcd_proc)
    assert cl.nethosts.wait_exit(c.etcd_proc, 10) is not None
    c.start_etcd()
    quick = now() - t
    # a lease renewal that failed meanwhile ends a term up to a TTL later
    r1 = recovered(c, ld, t, 20, settle_s=quick + 2 * cl.LEASE_TTL_S)
    quick_restarts = len(c.restarts)
    c.run_load(ld, 1.0)

    t2 = now()
    cl.kill(c.etcd_proc, signal.SIGTERM)
    assert cl.nethosts.wait_exit(c.etcd_proc, 10) is not None
    c.run_load(ld, 1.5 * cl.LEASE_TTL_S)  # etcd gone past the leader's lease
    c.start_etcd()
    down = now() - t2
    c.wait(lambda: c.leader() is not None, "a leader after etcd's restart")
    r2 = recovered(c, ld, t2, 25, settle_s=down + 2 * cl.LEASE_TTL_S)
    c.wait(lambda: len(c.members()) == len(c.masters), "every master a member again")
    slow_restarts = [m for m, w in c.restarts if w > t2]
    assert slow_restarts, \
        f"etcd down past the lease, yet no master gave its term up\n{c.logs_tail()}"
    report("restart etcd", f"kill -9 + start: etcd back after {quick:.2f} s, {quick_restarts} "
                           f"master(s) stepped down; SIGTERM, down {down:.2f} s: "
                           f"{', '.join(slow_restarts)} stepped down (exit 3, restarted); "
                           f"leader then {c.leader_master().host.name}")
    no_loss(c, finish(c, ld, t, "restart etcd", [("kill -9 + start: ", r1),
                                                 (f"down {down:.1f} s: ", r2)]))


def test_kill_standby(make_cluster: Callable[..., Cluster]) -> None:
    """kill -9 of the standby: the load sees nothing (no failed call); the
    standby started again follows the leader."""
    c = make_cluster()
    ld = c.start()
    baseline(c, ld)
    m1, m2 = c.masters
    t = now()
    cl.kill(m2.proc)
    c.run_load(ld, 3.0)
    r1 = analyse(ld.events, t)
    m2.start()
    c.wait(lambda: len(c.members()) == 2, "the standby back")
    c.run_load(ld, 2.0)
    r = analyse(ld.events, t)
    assert c.leader() == m1.addr
    assert not r.failed, f"the load saw the standby's death: {r.line()}\n{c.logs_tail()}"
    report("kill -9 standby", f"slowest call in the 3 s after the kill {r1.max_call_s:.2f} s")
    no_loss(c, finish(c, ld, t, "kill -9 standby", [("", r)]))


def kill_node_during(c: Cluster, ld: LoadProc, node: cl.Node, op: str) -> tuple[float, str]:
    """kill -9 of node 5 ms into a call `op` (bigput / bigget of 16 MiB: ~20
    ms each, most of it the transfer); the time of the kill and what became
    of the call (its result; for a put that succeeded, where the value went)."""
    deadline = now() + 10
    while now() < deadline:
        fl = [x for x in ld.cmd("inflight")["inflight"] if x[0] == op]
        if fl and now() - fl[0][1] > 0.005:
            break
        time.sleep(0.001)
    else:
        raise AssertionError(f"no {op} in flight within 10 s\n{c.logs_tail()}")
    t0 = round(fl[0][1], 4)
    t = now()
    cl.kill(node.proc)

    def returned() -> bool:
        ld.poll()
        return any(e[2] == op and e[0] == t0 for e in ld.events)
    c.wait(returned, f"the {op} in flight to return", timeout=cl.MAX_CALL_S)
    ev = [e for e in ld.events if e[2] == op and e[0] == t0][0]
    assert ev[4] == "ok" or ev[4].startswith("E:"), \
        f"the {op} in flight at the kill: {ev[4]}\n{c.logs_tail()}"
    what = ev[4] if ev[1] > t else f"{ev[4]}, returned before the kill"
    if op == "bigput" and ev[4] == "ok":
        where = [e[4] for e in ld.events if e[2] == "bigwhere" and e[3] == ev[3]]
        what += f", stored on {where[0] if where else '?'}"
    return t, what


def test_kill_node_mid_put_and_mid_get(make_cluster: Callable[..., Cluster]) -> None:
    """kill -9 of a storage node 5 ms into a 16 MiB put to it, and (started
    again) into a 16 MiB get from it: the calls fail with an error or
    succeed with the right bytes (a put the client placed again elsewhere),
    never wrong bytes; the load carries on with the other node."""
    c = make_cluster()
    n1 = c.nodes[0]
    ld = c.start(options={"big": {"size": 16 << 20, "segment": n1.addr}})
    baseline(c, ld)
    recs = []
    t_first = None
    for op in ("bigput", "bigget"):
        t, what = kill_node_during(c, ld, n1, op)
        t_first = t_first or t
        r = recovered(c, ld, t, 20)
        recs.append((f"kill -9 during a {op} (the call: {what}): ", r))
        cl.nethosts.wait_exit(n1.proc, 10)
        c.wait_segments(1)  # the master saw it go
        n1.start()
        c.wait_segments(2)
    big = [e for e in ld.events if e[2] in ("bigput", "bigget")]
    assert all(e[4] == "ok" or e[4].startswith("E:") for e in big), big
    finish(c, ld, t_first, "kill -9 node", recs)


def test_rolling_restart(make_cluster: Callable[..., Cluster]) -> None:
    """Every master (3: the standbys first, then the leader) and every node
    stopped (SIGTERM) and started again, one by one, while the load runs;
    before a master goes, the others follow the leader in sync. What the
    master restarts lost is counted before the nodes' (a node's memory does
    not outlive it: what it held is lost by design)."""
    c = make_cluster(masters=3)
    ld = c.start()
    baseline(c, ld)
    recs = []
    t_first = now()
    leader = c.leader_master()
    for m in [m for m in c.masters if m is not leader] + [leader]:
        c.wait(lambda: c.stat_value("repl_in_sync") == len(c.masters) - 1,
               "every standby in sync")
        t = now()
        cl.kill(m.proc, signal.SIGTERM)
        rc = cl.nethosts.wait_exit(m.proc, 15)
        assert rc == 0, f"{m.host.name} stopped with status {rc}\n{m.log()[-2000:]}"
        if m is leader:  # it resigned: a standby takes the term
            c.wait(lambda: c.leader() not in (None, m.addr), "a standby taking over")
        m.start()
        c.wait(lambda: len(c.members()) == len(c.masters) and c.leader() is not None,
               f"{m.host.name} back")
        recs.append((f"restart {m.host.name}{' (leader)' if m is leader else ''}: ",
                     recovered(c, ld, t, 20)))
        c.run_load(ld, 1.0)
    assert c.leader() != leader.addr
    ld.pause()
    mloss = Loss(ld.verify(), t_first)
    report("rolling restart", f"after the masters' restarts: {mloss.line()}")
    assert not mloss.wrong
    no_loss(c, mloss)
    ld.resume()
    for n in c.nodes:
        t = now()
        cl.kill(n.proc, signal.SIGTERM)
        rc = cl.nethosts.wait_exit(n.proc, 15)
        assert rc == 0, f"{n.host.name} stopped with status {rc}"
        n.start()
        c.wait_segments(2)
        recs.append((f"restart {n.host.name}: ", recovered(c, ld, t, 20)))
        c.run_load(ld, 1.0)
    finish(c, ld, t_first, "rolling restart", recs)
