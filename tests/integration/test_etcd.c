/* test_etcd.c -- the etcd client (src/ha/etcd.c) against a real etcd on
 * loopback (tests/support tp_etcd): key-value calls, leases, the election
 * transaction and its epochs, fencing of a deposed holder, endpoint failover
 * and a hung etcd; a leader whose record is deleted or overwritten steps down
 * (src/ha/leader.c); etcd with authentication (user, password, token
 * renewal) and over TLS (https, a throwaway CA made with the openssl CLI).
 * Skips with the reason when no etcd is installed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ha/etcd.h"
#include "ha/leader.h"
#include "harness.h"
#include "kvpool.h"
#include "proc.h"

/* Up to the point where etcd serves (a fresh member elects itself). */
static kvp_etcd *open_on(const char *url, int timeout_ms)
{
    kvp_etcd_target t;
    char err[128];
    kvp_etcd *e = NULL;
    if (kvp_etcd_parse_url(url, &t, err, sizeof err) != 0 || kvp_etcd_open(&t, timeout_ms, &e))
        return NULL;
    return e;
}

static kvp_etcd *up(tp_etcd *srv, int *skipped)
{
    char why[256], url[128];
    *skipped = 0;
    int rc = tp_etcd_start(srv, why, sizeof why);
    if (rc == 1) {
        *skipped = 1;
        th_skip(why);
        return NULL;
    }
    if (rc != 0) {
        th_fail(__FILE__, __LINE__, "%s", why);
        return NULL;
    }
    snprintf(url, sizeof url, "etcd://%s/test", srv->addr);
    kvp_etcd *e = open_on(url, 2000);
    for (int i = 0; e && i < 100; i++) {
        bool found;
        if (kvp_etcd_get(e, "/ready", NULL, 0, NULL, &found) == 0)
            return e;
        tp_sleep_ms(50);
    }
    th_fail(__FILE__, __LINE__, "etcd at %s does not serve", srv->addr);
    kvp_etcd_close(e);
    tp_etcd_stop(srv);
    return NULL;
}

static int collect(const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
                   const kvp_etcd_kv *kv, void *arg)
{
    (void)kv;
    char *out = arg;
    size_t n = strlen(out);
    snprintf(out + n, 64 - n, "%.*s=%.*s;", (int)klen, (const char *)key, (int)vlen,
             (const char *)val);
    return 0;
}

TEST(etcd_kv_and_leases)
{
    tp_etcd srv;
    int skipped;
    kvp_etcd *e = up(&srv, &skipped);
    if (!e) {
        return;
    }
    int ok = 0;
    do {
        uint8_t val[4], big[300];
        for (int i = 0; i < 300; i++)
            big[i] = (uint8_t)i;
        uint64_t rev = 0, lease = 0;
        bool found = true;
        kvp_etcd_kv kv;
        if (kvp_etcd_get(e, "/k", val, sizeof val, &kv, &found) != 0 || found)
            break;
        if (kvp_etcd_put(e, "/k", big, sizeof big, 0, &rev) != 0 || rev == 0)
            break;
        /* a value larger than the buffer is an error, never a truncated value */
        if (kvp_etcd_get(e, "/k", val, sizeof val, &kv, &found) != KVP_EBUFFER_OVERFLOW)
            break;
        uint8_t back[400];
        if (kvp_etcd_get(e, "/k", back, sizeof back, &kv, &found) != 0 || !found ||
            kv.value_len != sizeof big || memcmp(back, big, sizeof big) != 0 ||
            kv.mod_revision != rev)
            break;
        if (kvp_etcd_delete(e, "/k") != 0 || kvp_etcd_get(e, "/k", back, sizeof back, &kv,
                                                          &found) != 0 || found)
            break;
        /* a lease: keepalive, a key under it, revoke -> key gone, keepalive refused */
        int64_t ttl = 0;
        if (kvp_etcd_lease_grant(e, 10, &lease) != 0 || lease == 0 ||
            kvp_etcd_lease_keepalive(e, lease, &ttl) != 0 || ttl <= 0 || ttl > 10)
            break;
        if (kvp_etcd_put(e, "/l", "x", 1, lease, NULL) != 0 ||
            kvp_etcd_get(e, "/l", back, sizeof back, &kv, &found) != 0 || !found ||
            kv.lease != lease)
            break;
        if (kvp_etcd_lease_revoke(e, lease) != 0 ||
            kvp_etcd_get(e, "/l", back, sizeof back, &kv, &found) != 0 || found)
            break;
        if (kvp_etcd_lease_keepalive(e, lease, &ttl) != KVP_ELEASE_EXPIRED)
            break;
        if (kvp_etcd_put(e, "/l", "x", 1, lease, NULL) != KVP_ELEASE_EXPIRED)
            break;
        /* a prefix lists exactly its keys, in order */
        if (kvp_etcd_put(e, "/p/a", "1", 1, 0, NULL) != 0 || kvp_etcd_put(e, "/p/b", "22", 2, 0, NULL) ||
            kvp_etcd_put(e, "/q", "3", 1, 0, NULL) != 0)
            break;
        char seen[64] = "";
        if (kvp_etcd_list(e, "/p/", collect, seen) != 0 || strcmp(seen, "/p/a=1;/p/b=22;") != 0)
            break;
        /* refusals before the wire */
        if (kvp_etcd_put(e, "", "x", 1, 0, NULL) != KVP_EINVALID_PARAMS ||
            kvp_etcd_lease_grant(e, 0, &lease) != KVP_EINVALID_PARAMS)
            break;
        ok = 1;
    } while (0);
    if (!ok)
        th_fail(__FILE__, __LINE__, "kv/lease sequence: %s", kvp_etcd_last_error(e));
    kvp_etcd_close(e);
    tp_etcd_stop(&srv);
}

/* Two candidates: one wins under its lease, the other sees it; the winner's
 * lease lapses (no keepalive), the other wins with a larger epoch, and the
 * deposed one's resign (its old epoch) leaves the new holder in place. */
TEST(etcd_election_epochs_and_fencing)
{
    tp_etcd srv;
    int skipped;
    kvp_etcd *a = up(&srv, &skipped);
    if (!a)
        return;
    char url[128];
    snprintf(url, sizeof url, "etcd://%s/test", srv.addr);
    kvp_etcd *b = open_on(url, 2000);
    int ok = 0;
    const char *key = "/kvpool/test/leader";
    do {
        uint64_t la = 0, lb = 0;
        bool won = false, deleted = true;
        kvp_etcd_kv h;
        uint8_t hv[64];
        if (!b || kvp_etcd_lease_grant(a, 1, &la) != 0 || kvp_etcd_lease_grant(b, 30, &lb) != 0)
            break;
        if (kvp_etcd_campaign(a, key, "A", 1, la, &won, &h, hv, sizeof hv) != 0 || !won)
            break;
        uint64_t e1 = h.create_revision;
        if (kvp_etcd_campaign(b, key, "B", 1, lb, &won, &h, hv, sizeof hv) != 0 || won ||
            h.create_revision != e1 || h.value_len != 1 || hv[0] != 'A' || h.lease != la)
            break;
        /* a's lease (TTL 1 s) lapses: etcd drops the key; b wins a new term */
        uint64_t t0 = tp_now_ms();
        while (tp_now_ms() - t0 < 10000) {
            if (kvp_etcd_campaign(b, key, "B", 1, lb, &won, &h, hv, sizeof hv) != 0 || won)
                break;
            tp_sleep_ms(100);
        }
        if (!won || h.create_revision <= e1)
            break;
        uint64_t e2 = h.create_revision;
        if (kvp_etcd_resign(a, key, e1, &deleted) != 0 || deleted)
            break; /* fenced: the old term's epoch no longer matches */
        bool found = false;
        if (kvp_etcd_get(a, key, hv, sizeof hv, &h, &found) != 0 || !found ||
            h.create_revision != e2 || hv[0] != 'B')
            break;
        if (kvp_etcd_resign(b, key, e2, &deleted) != 0 || !deleted)
            break;
        if (kvp_etcd_get(a, key, hv, sizeof hv, &h, &found) != 0 || found)
            break;
        ok = 1;
    } while (0);
    if (!ok)
        th_fail(__FILE__, __LINE__, "election sequence: %s / %s", kvp_etcd_last_error(a),
                b ? kvp_etcd_last_error(b) : "no handle");
    kvp_etcd_close(a);
    kvp_etcd_close(b);
    tp_etcd_stop(&srv);
}

/* A dead endpoint before the live one is skipped; with every endpoint dead
 * the call fails (RPC_FAIL) at once; a hung etcd is a timeout, bounded. */
TEST(etcd_endpoint_failover_and_hang)
{
    tp_etcd srv;
    int skipped;
    kvp_etcd *e = up(&srv, &skipped);
    if (!e)
        return;
    char dead[64], url[200];
    int ok = 0;
    kvp_etcd *f = NULL, *g = NULL;
    do {
        if (tp_free_addr(dead, sizeof dead) != 0)
            break;
        snprintf(url, sizeof url, "etcd://%s,%s/test", dead, srv.addr);
        bool found;
        if (!(f = open_on(url, 1000)) || kvp_etcd_put(f, "/x", "1", 1, 0, NULL) != 0 ||
            strcmp(kvp_etcd_endpoint(f), srv.addr) != 0)
            break;
        snprintf(url, sizeof url, "etcd://%s/test", dead);
        uint64_t t0 = tp_now_ms();
        if (!(g = open_on(url, 1000)) || kvp_etcd_get(g, "/x", NULL, 0, NULL, &found) !=
                                             KVP_ERPC_FAIL ||
            tp_now_ms() - t0 > 900 || !strstr(kvp_etcd_last_error(g), dead))
            break;
        tp_etcd_pause(&srv, 1);
        t0 = tp_now_ms();
        int rc = kvp_etcd_get(e, "/x", NULL, 0, NULL, &found);
        uint64_t took = tp_now_ms() - t0;
        tp_etcd_pause(&srv, 0);
        if (rc != KVP_ERPC_TIMEOUT || took < 1500 || took > 4000) {
            th_fail(__FILE__, __LINE__, "hung etcd: rc %d after %llu ms", rc,
                    (unsigned long long)took);
            break;
        }
        ok = 1;
    } while (0);
    if (!ok)
        th_fail(__FILE__, __LINE__, "failover sequence: %s", kvp_etcd_last_error(e));
    kvp_etcd_close(e);
    kvp_etcd_close(f);
    kvp_etcd_close(g);
    tp_etcd_stop(&srv);
}

static void on_lost(void *arg, const char *why)
{
    (void)why;
    __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
}

/* Waits (up to 15 s: a bound for a loaded machine, not a latency figure)
 * for *flag. 1 once set. */
static int wait_flag(int *flag)
{
    for (int i = 0; i < 300 && !__atomic_load_n(flag, __ATOMIC_ACQUIRE); i++)
        tp_sleep_ms(50);
    return __atomic_load_n(flag, __ATOMIC_ACQUIRE);
}

/* etcd is a root of trust: deleting the leader record lets a standby win a
 * new epoch while the old leader's lease is still valid. The old leader
 * must notice at its next renewal and give the term up (lost()), so there
 * are never two leaders past one renewal period; overwriting the record
 * (same key, another value) is the same. */
TEST(leader_steps_down_when_its_record_is_deleted_or_overwritten)
{
    tp_etcd srv;
    int skipped;
    kvp_etcd *e = up(&srv, &skipped);
    if (!e)
        return;
    char url[128], err[200] = "";
    snprintf(url, sizeof url, "etcd://%s/test", srv.addr);
    kvp_etcd_target t;
    kvp_leader *a = NULL, *b = NULL;
    int lost_a = 0, lost_b = 0;
    int ok = 0;
    do {
        if (kvp_etcd_parse_url(url, &t, err, sizeof err) != 0 ||
            kvp_leader_open(&t, 3, "127.0.0.1:1", 0xa, &a, err, sizeof err) != 0 ||
            kvp_leader_open(&t, 3, "127.0.0.1:2", 0xb, &b, err, sizeof err) != 0)
            break;
        if (kvp_leader_campaign(a, NULL, NULL) != 0 ||
            kvp_leader_start_keepalive(a, on_lost, NULL, &lost_a) != 0)
            break;
        uint64_t ea = kvp_leader_epoch(a);
        /* two renewals with the record intact: still the leader */
        tp_sleep_ms(2500);
        if (__atomic_load_n(&lost_a, __ATOMIC_ACQUIRE)) {
            th_fail(__FILE__, __LINE__, "the leader stepped down with its record intact");
            break;
        }
        if (kvp_etcd_delete(e, "/kvpool/test/leader") != 0)
            break;
        /* the standby wins a new epoch; the old leader steps down */
        if (kvp_leader_campaign(b, NULL, NULL) != 0 || kvp_leader_epoch(b) <= ea)
            break;
        if (!wait_flag(&lost_a)) {
            th_fail(__FILE__, __LINE__, "the old leader kept its term: two leaders");
            break;
        }
        if (kvp_leader_start_keepalive(b, on_lost, NULL, &lost_b) != 0)
            break;
        /* an overwrite under another lease (same key) */
        uint64_t lease = 0;
        const char *forged = "{\"addr\":\"10.9.9.9:1\",\"id\":\"00000000000000ee\"}";
        if (kvp_etcd_lease_grant(e, 30, &lease) != 0 ||
            kvp_etcd_put(e, "/kvpool/test/leader", forged, strlen(forged), lease, NULL) != 0)
            break;
        if (!wait_flag(&lost_b)) {
            th_fail(__FILE__, __LINE__, "the leader kept its term under a forged record");
            break;
        }
        ok = 1;
    } while (0);
    if (!ok)
        th_fail(__FILE__, __LINE__, "leader step-down sequence: %s / %s", err,
                kvp_etcd_last_error(e));
    kvp_leader_close(a);
    kvp_leader_close(b);
    kvp_etcd_close(e);
    tp_etcd_stop(&srv);
}

/* ------------------------------------------------ authentication, TLS */

/* Runs a shell command line (bounded): its exit status; output into out. */
static int sh(const char *cmd, char *out, size_t outlen)
{
    const char *const argv[] = {"/bin/sh", "-c", cmd, NULL};
    return tp_run_capture(argv, 3, out, outlen, 30000);
}

/* A secret file (0600) holding text, at path (a mkstemp template). */
static int secret_file(char *path, const char *text)
{
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    int ok = write(fd, text, strlen(text)) == (ssize_t)strlen(text);
    close(fd);
    return ok ? 0 : -1;
}

/* A handle on url's etcd with the process's credentials set to user /
 * password (NULL user: none) and cacert (NULL: none), then one put + get:
 * its status. */
static int try_with(const char *url, const char *user, const char *pw, const char *cacert,
                    char *last, size_t lastlen)
{
    kvp_etcd_auth a;
    memset(&a, 0, sizeof a);
    if (user) {
        snprintf(a.user, sizeof a.user, "%s", user);
        snprintf(a.password, sizeof a.password, "%s", pw);
    }
    if (cacert)
        snprintf(a.cacert, sizeof a.cacert, "%s", cacert);
    kvp_etcd_auth_set(&a);
    kvp_etcd_target t;
    char err[160];
    kvp_etcd *e = NULL;
    int rc = kvp_etcd_parse_url(url, &t, err, sizeof err);
    kvp_etcd_auth_set(NULL);
    if (rc == 0)
        rc = kvp_etcd_open(&t, 3000, &e);
    if (rc == 0)
        rc = kvp_etcd_put(e, "/kvpool/test/x", "v", 1, 0, NULL);
    if (rc == 0) {
        bool found = false;
        uint8_t v[8];
        rc = kvp_etcd_get(e, "/kvpool/test/x", v, sizeof v, NULL, &found);
        if (rc == 0 && !found)
            rc = -1;
    }
    snprintf(last, lastlen, "%s", e ? kvp_etcd_last_error(e) : err);
    kvp_etcd_close(e);
    return rc;
}

/*
 * etcd with `auth enable` (root:pw, simple tokens living 1 s): the right
 * password works and keeps working past the token's life (the handle
 * authenticates again); a wrong one, or none, is AUTH; a master given a
 * wrong password file fails at start, naming the keys, and one with the
 * right one becomes the leader.
 */
TEST(etcd_with_authentication)
{
    tp_etcd srv;
    char why[256], out[4096], url[128], last[256];
    const char *const extra[] = {"--auth-token", "simple", "--auth-token-ttl", "1", NULL};
    tp_etcd_opts o = {NULL, NULL, extra};
    int rc = tp_etcd_start_opts(&srv, &o, why, sizeof why);
    if (rc == 1) {
        th_skip(why);
        return;
    }
    if (rc != 0) {
        th_fail(__FILE__, __LINE__, "%s", why);
        return;
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "etcdctl --endpoints=http://%s user add root:pw-0123456789 && "
             "etcdctl --endpoints=http://%s auth enable",
             srv.addr, srv.addr);
    int st = -1;
    for (int i = 0; i < 50 && st != 0; i++) { /* until the fresh member serves */
        st = sh(cmd, out, sizeof out);
        if (st != 0 && strstr(out, "already exists"))
            st = sh(strstr(cmd, "&& ") + 3, out, sizeof out);
        if (st != 0)
            tp_sleep_ms(100);
    }
    if (st != 0) {
        th_fail(__FILE__, __LINE__, "etcdctl: %s", out);
        tp_etcd_stop(&srv);
        return;
    }
    snprintf(url, sizeof url, "etcd://%s/test", srv.addr);
    CHECK_EQ(try_with(url, "root", "pw-0123456789", NULL, last, sizeof last), 0);
    rc = try_with(url, "root", "wrong-password", NULL, last, sizeof last);
    printf("  wrong password: %s (%s)\n", kvp_err_name(rc), last);
    CHECK_EQ(rc, KVP_EAUTH);
    CHECK_EQ(try_with(url, NULL, NULL, NULL, last, sizeof last), KVP_EAUTH);
    /* the token expires: the handle authenticates again */
    kvp_etcd_auth a;
    memset(&a, 0, sizeof a);
    snprintf(a.user, sizeof a.user, "root");
    snprintf(a.password, sizeof a.password, "pw-0123456789");
    kvp_etcd_auth_set(&a);
    kvp_etcd_target t;
    kvp_etcd *e = NULL;
    CHECK_EQ(kvp_etcd_parse_url(url, &t, why, sizeof why), 0);
    kvp_etcd_auth_set(NULL);
    CHECK_EQ(kvp_etcd_open(&t, 3000, &e), 0);
    bool found = false;
    uint8_t v[8];
    CHECK_EQ(kvp_etcd_get(e, "/kvpool/test/x", v, sizeof v, NULL, &found), 0);
    tp_sleep_ms(2500);
    rc = kvp_etcd_get(e, "/kvpool/test/x", v, sizeof v, NULL, &found);
    printf("  after the token's life: %s (%s)\n", rc ? kvp_err_name(rc) : "ok",
           kvp_etcd_last_error(e));
    CHECK_EQ(rc, 0);
    CHECK(found);
    kvp_etcd_close(e);
    /* the master: a wrong password file fails at start, the right one leads */
    char bad[] = "/tmp/kvp-etcd-pw-XXXXXX", good[] = "/tmp/kvp-etcd-pw-XXXXXX";
    CHECK_EQ(secret_file(bad, "wrong-password\n"), 0);
    CHECK_EQ(secret_file(good, "pw-0123456789\n"), 0);
    const char *const m1[] = {tp_kvpool_bin(), "master", "--listen", "127.0.0.1:0",
                              "--etcd", url, "--etcd-user", "root", "--etcd-password-file",
                              bad, NULL};
    st = tp_run_capture(m1, 2, out, sizeof out, 20000);
    printf("  master with a wrong password: exit %d\n", st);
    CHECK(st > 0 && st < 128);
    CHECK(strstr(out, "etcd_password_file") != NULL);
    tp_master m;
    CHECK_EQ(tp_master_start(&m, (const char *const[]){"--etcd", url, "--etcd-user", "root",
                                                       "--etcd-password-file", good, NULL}),
             0);
    kvp_leader_info li;
    int has = 0, n = 0;
    memset(&li, 0, sizeof li);
    snprintf(a.user, sizeof a.user, "root");
    kvp_etcd_auth_set(&a);
    for (int i = 0; i < 100 && !has; i++) {
        if (kvp_leader_cluster(url, &li, &has, NULL, 0, &n, why, sizeof why) != 0)
            has = 0;
        if (!has)
            tp_sleep_ms(100);
    }
    kvp_etcd_auth_set(NULL);
    CHECK(has);
    CHECK_EQ(tp_master_stop(&m), 0);
    unlink(bad);
    unlink(good);
    tp_etcd_stop(&srv);
}

/*
 * etcd over TLS only (a CA and a server certificate for 127.0.0.1 made
 * here with the openssl CLI): with etcd_cacert the client speaks https and
 * verifies etcd's certificate; against another CA it refuses the server;
 * without a CA an https:// address is refused before any call.
 */
TEST(etcd_over_tls)
{
    char dir[] = "/tmp/kvp-etcd-tls-XXXXXX", out[4096], cmd[2048], why[256], url[160],
         last[256];
    if (access("/usr/bin/openssl", X_OK) != 0 && sh("command -v openssl", out, sizeof out) != 0) {
        th_skip("no openssl CLI to make a throwaway CA");
        return;
    }
    if (!mkdtemp(dir)) {
        th_fail(__FILE__, __LINE__, "mkdtemp");
        return;
    }
    snprintf(cmd, sizeof cmd,
             "set -e; cd %s; "
             "for ca in ca other; do openssl req -x509 -newkey ec -pkeyopt "
             "ec_paramgen_curve:prime256v1 -nodes -keyout $ca.key -out $ca.pem -days 1 "
             "-subj /CN=kvp-test-$ca; done; "
             "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
             "-keyout srv.key -out srv.csr -subj /CN=127.0.0.1; "
             "printf 'subjectAltName=IP:127.0.0.1\\n' > ext; "
             "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
             "-out srv.pem -days 1 -extfile ext",
             dir);
    int st = sh(cmd, out, sizeof out);
    if (st != 0) {
        th_fail(__FILE__, __LINE__, "openssl: %s", out);
        return;
    }
    char cert[300], key[300], ca[300], other[300];
    snprintf(cert, sizeof cert, "%s/srv.pem", dir);
    snprintf(key, sizeof key, "%s/srv.key", dir);
    snprintf(ca, sizeof ca, "%s/ca.pem", dir);
    snprintf(other, sizeof other, "%s/other.pem", dir);
    tp_etcd srv;
    tp_etcd_opts o = {cert, key, NULL};
    int rc = tp_etcd_start_opts(&srv, &o, why, sizeof why);
    if (rc != 0) {
        if (rc == 1)
            th_skip(why);
        else
            th_fail(__FILE__, __LINE__, "%s", why);
        tp_rm_dir(dir);
        return;
    }
    snprintf(url, sizeof url, "etcd://%s/test", srv.addr);
    rc = -1;
    for (int i = 0; i < 100 && rc != 0; i++) { /* until the fresh member serves */
        rc = try_with(url, NULL, NULL, ca, last, sizeof last);
        if (rc)
            tp_sleep_ms(100);
    }
    printf("  https with the CA: %s (%s)\n", rc ? kvp_err_name(rc) : "ok", last);
    CHECK_EQ(rc, 0);
    rc = try_with(url, NULL, NULL, other, last, sizeof last);
    printf("  https with another CA: %s (%s)\n", kvp_err_name(rc), last);
    CHECK_EQ(rc, KVP_ERPC_FAIL);
    snprintf(url, sizeof url, "https://%s", srv.addr);
    CHECK_EQ(try_with(url, NULL, NULL, NULL, last, sizeof last), KVP_EINVALID_PARAMS);
    CHECK_EQ(try_with(url, NULL, NULL, ca, last, sizeof last), 0);
    /* plain http to a TLS-only etcd: no answer it could trust */
    snprintf(url, sizeof url, "http://%s", srv.addr);
    CHECK(try_with(url, NULL, NULL, NULL, last, sizeof last) != 0);
    tp_etcd_stop(&srv);
    tp_rm_dir(dir);
}
