/*
 * test_attack_mount.c -- the mount and disk-record attacks of the hardening
 * run (against main 0a85b26), staged with raw wire-protocol peers against a
 * real master and storage node:
 *   - tenants on, node credential off: a client with no credential mounted
 *     a fake 1 TiB segment and received a tenant's next put; now the master
 *     refuses to start without node_token, and with it the mount is refused;
 *   - a DISK_REPORT HAVE from a segment whose owner may not write tenant
 *     alice created alice/poison (EXIST 1, her own put refused -705); now
 *     such records are ignored;
 *   - a plain client mounting a segment under a live node's name replaced
 *     it and dropped its objects; now the live node keeps its name.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"
#include "proc.h"
#include "tenant_peer.h"

#define FAKE_SEG 0xFA4E0001ull
#define TENANTS "alice tok-alice-0123456789\nbob tok-bob-0123456789\n"

/* Reads a small file into buf (NUL-terminated); "" when unreadable. */
static void slurp(const char *path, char *buf, size_t len)
{
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = 0;
    fclose(f);
}

/* Tenants on, no node credential: the master does not start, and says
 * which key is missing. Where it did start (0a85b26), the attack: a client
 * with no credential mounts a fake 1 TiB segment and alice's put is placed
 * there -- the test then fails on the mount and placement checks. With
 * node_token set, the fake mount is refused and alice's put goes to the
 * real node. */
TEST(fake_mount_with_tenants_needs_node_token)
{
    char tpath[] = "/tmp/kvp-attack-tenants-XXXXXX";
    CHECK_EQ(tq_write_secret(tpath, TENANTS), 0);
    char log[] = "/tmp/kvp-attack-log-XXXXXX";
    int lfd = mkstemp(log);
    CHECK(lfd >= 0);
    close(lfd);
    const char *const margs[] = {"--tenant-tokens-file", tpath, NULL};
    tp_master m;
    tp_master_opts mo = {0, log};
    unsetenv("KVPOOL_NODE_TOKEN");
    int started = tp_master_start_opts(&m, margs, &mo);
    if (started == 0) { /* 0a85b26: it starts, and the attack works */
        int rc;
        tp_store s0 = {0};
        tp_store_start(&s0, m.addr, (const char *const[]){"--segment-size", "16MiB", NULL});
        kvp_rpc *attacker = tq_hello(m.addr, NULL, NULL, &rc);
        kvp_rpc *alice = tq_hello(m.addr, NULL, "tok-alice-0123456789", &rc);
        uint64_t seg = 0;
        int mrc = attacker ? tq_mount(attacker, FAKE_SEG, "127.0.0.1:9", 1ull << 40, 0) : -1;
        int prc = alice ? tq_put_start(alice, "alice", "kv/layer0/block7", 1 << 20, &seg) : -1;
        printf("  started without node_token: fake 1 TiB mount %d, alice's put %d placed on "
               "%s\n", mrc, prc, seg == FAKE_SEG ? "the fake segment" : "a real node");
        kvp_rpc_close(attacker);
        kvp_rpc_close(alice);
        tp_store_kill(&s0);
        tp_master_kill(&m);
    }
    CHECK(started != 0); /* refused to start */
    char text[8192];
    slurp(log, text, sizeof text);
    CHECK(strstr(text, "node_token") != NULL);
    CHECK(strstr(text, "KVPOOL_NODE_TOKEN") != NULL);
    if (started != 0) { /* the fixed master: run it the way it asks */
        setenv("KVPOOL_NODE_TOKEN", "node-secret-0123456789", 1);
        started = tp_master_start(&m, margs);
        CHECK_EQ(started, 0);
    }
    tp_store s = {0};
    if (started == 0) /* the store takes the node token from the environment too */
        CHECK_EQ(tp_store_start(&s, m.addr, (const char *const[]){"--segment-size", "16MiB",
                                                                   NULL}),
                 0);
    unsetenv("KVPOOL_NODE_TOKEN");
    if (started) {
        unlink(tpath);
        unlink(log);
        return;
    }
    int rc;
    kvp_rpc *attacker = tq_hello(m.addr, NULL, NULL, &rc);
    kvp_rpc *alice = tq_hello(m.addr, NULL, "tok-alice-0123456789", &rc);
    CHECK(attacker && alice);
    if (attacker && alice) {
        /* a fake 1 TiB segment whose endpoint is the attacker's listener */
        CHECK_EQ(tq_mount(attacker, FAKE_SEG, "127.0.0.1:9", 1ull << 40, 0),
                 KVP_EILLEGAL_CLIENT);
        CHECK_EQ(tp_master_segments(m.addr), 1);
        uint64_t seg = 0;
        CHECK_EQ(tq_put_start(alice, "alice", "kv/layer0/block7", 1 << 20, &seg), 0);
        CHECK(seg != 0 && seg != FAKE_SEG); /* her bytes go to the real node */
    }
    kvp_rpc_close(attacker);
    kvp_rpc_close(alice);
    tp_store_kill(&s);
    CHECK_EQ(tp_master_stop(&m), 0);
    unlink(tpath);
    unlink(log);
}

/* A segment's owner reports a disk record (HAVE) in a tenant it may not
 * write: a tenant-bound client (bob's token) holding the node credential,
 * as an embedded engine segment does. 0a85b26 created alice/poison (EXIST
 * 1, GET answering the attacker's size and checksum) and refused alice's
 * own put of the key (-705). Now the record is ignored and alice's put
 * works; bob's records in bob's own tenant still register. */
TEST(have_poison_in_another_tenant_is_ignored)
{
    char tpath[] = "/tmp/kvp-attack-tenants-XXXXXX";
    CHECK_EQ(tq_write_secret(tpath, TENANTS), 0);
    setenv("KVPOOL_NODE_TOKEN", "node-secret-0123456789", 1);
    tp_master m;
    int started = tp_master_start(&m, (const char *const[]){"--tenant-tokens-file", tpath, NULL});
    CHECK_EQ(started, 0);
    tp_store s = {0};
    if (started == 0)
        CHECK_EQ(tp_store_start(&s, m.addr, (const char *const[]){"--segment-size", "16MiB",
                                                                   NULL}),
                 0);
    unsetenv("KVPOOL_NODE_TOKEN");
    if (started) {
        unlink(tpath);
        return;
    }
    int rc;
    kvp_rpc *evil = tq_hello(m.addr, "node-secret-0123456789", "tok-bob-0123456789", &rc);
    kvp_rpc *alice = tq_hello(m.addr, NULL, "tok-alice-0123456789", &rc);
    CHECK(evil && alice);
    if (evil && alice) {
        /* a small segment with an "SSD tier", so its DISK_REPORTs count */
        CHECK_EQ(tq_mount(evil, FAKE_SEG, "127.0.0.1:9", 1 << 20, 1ull << 40), 0);
        CHECK_EQ(tq_have(evil, FAKE_SEG, "alice", "poison", 4096, 0xBAD), 0);
        CHECK_EQ(tq_exist(alice, "alice", "poison"), 0);
        CHECK_EQ(tq_put_start(alice, "alice", "poison", 4096, NULL), 0);
        CHECK_EQ(tq_put_end(alice, "alice", "poison", 0x600D), 0);
        /* a record naming alice's (now existing) key changes nothing either */
        CHECK_EQ(tq_have(evil, FAKE_SEG, "alice", "poison", 4096, 0x600D), 0);
        CHECK_EQ(tq_exist(alice, "alice", "poison"), 1);
        /* its own tenant: registered (a restarted engine's records) */
        CHECK_EQ(tq_have(evil, FAKE_SEG, "bob", "mine", 4096, 0x1234), 0);
        CHECK_EQ(tq_exist(evil, "bob", "mine"), 1);
    }
    kvp_rpc_close(evil);
    kvp_rpc_close(alice);
    tp_store_kill(&s);
    CHECK_EQ(tp_master_stop(&m), 0);
    unlink(tpath);
}

/* The id and name of the only segment, via STATS. 0 or -1. */
static int only_segment(const char *addr, uint64_t *id, char *name, size_t len)
{
    int rc;
    kvp_rpc *r = tq_hello(addr, NULL, NULL, &rc);
    if (!r)
        return -1;
    kvp_arena a;
    kvp_arena_init(&a, 1 << 20);
    kvp_msg_stats_resp st;
    rc = tq_stats(r, &a, &st) == 0 && st.n_segs == 1 ? 0 : -1;
    if (rc == 0) {
        *id = st.segs[0].id;
        snprintf(name, len, "%.*s", (int)st.segs[0].name.len, (const char *)st.segs[0].name.p);
    }
    kvp_arena_free(&a);
    kvp_rpc_close(r);
    return rc;
}

/* Default configuration (anyone may mount): a plain client mounts a
 * segment under a live node's name. 0a85b26 replaced the node's segment
 * ("its node restarted") and dropped its objects; now the mount is refused
 * and the node keeps its segment and objects. (A restarted node, whose old
 * connection is gone, still takes its name back:
 * test_hostile's restarted_node_takes_its_name_back.) */
TEST(name_collision_does_not_replace_a_live_node)
{
    tp_master m;
    CHECK_EQ(tp_master_start(&m, (const char *const[]){"--client-ttl", "30s", NULL}), 0);
    tp_store s = {0};
    CHECK_EQ(tp_store_start(&s, m.addr, (const char *const[]){"--segment-size", "8MiB", NULL}), 0);
    uint64_t id = 0, id2 = 0;
    char name[256], name2[256];
    CHECK_EQ(only_segment(m.addr, &id, name, sizeof name), 0);
    int rc;
    kvp_rpc *user = tq_hello(m.addr, NULL, NULL, &rc);
    kvp_rpc *attacker = tq_hello(m.addr, NULL, NULL, &rc);
    CHECK(user && attacker);
    if (user && attacker) {
        CHECK_EQ(tq_publish(user, "", "precious", 8192), 0);
        CHECK_EQ(tq_exist(user, "", "precious"), 1);
        CHECK_EQ(tq_mount(attacker, FAKE_SEG, name, 1ull << 40, 0), KVP_ESEGMENT_ALREADY_EXISTS);
        CHECK_EQ(only_segment(m.addr, &id2, name2, sizeof name2), 0);
        CHECK_EQ(id2, id);
        CHECK_EQ(tq_exist(user, "", "precious"), 1);
        uint64_t seg = 0;
        CHECK_EQ(tq_put_start(user, "", "next", 4096, &seg), 0);
        CHECK_EQ(seg, id);
    }
    kvp_rpc_close(user);
    kvp_rpc_close(attacker);
    tp_store_kill(&s);
    CHECK_EQ(tp_master_stop(&m), 0);
}
