/* test_master_snapshot.c -- a lone master with snapshot_file restarts warm:
 * after kill -9 (or a clean stop) the restarted master lists every object
 * its node still holds, byte for byte, and nothing removed; a torn tail in
 * the file costs only the torn frame. Real processes on loopback. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"
#include "proc.h"

#define N 200

typedef struct env {
    char dir[256], file[300], listen[64];
    tp_master m;
    tp_store st;
    kvp_client *c;
} env;

static int master_up(env *e)
{
    const char *extra[] = {"--snapshot-file", e->file, e->listen[0] ? "--listen" : NULL,
                           e->listen, NULL};
    if (tp_master_start(&e->m, extra) != 0)
        return -1;
    if (!e->listen[0])
        snprintf(e->listen, sizeof e->listen, "%s", e->m.addr);
    return 0;
}

static int env_up(env *e)
{
    memset(e, 0, sizeof *e);
    const char *tmp = getenv("TMPDIR");
    snprintf(e->dir, sizeof e->dir, "%s/kvp-snap-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(e->dir))
        return -1;
    snprintf(e->file, sizeof e->file, "%s/index", e->dir);
    if (master_up(e) != 0 || tp_store_start(&e->st, e->m.addr, NULL) != 0)
        return -1;
    char cfg[512], err[256];
    snprintf(cfg, sizeof cfg,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\", \"rpc_timeout\": \"2s\"}",
             e->m.addr);
    return kvp_client_open(cfg, &e->c, err, sizeof err);
}

static void env_down(env *e)
{
    kvp_client_close(e->c);
    tp_store_kill(&e->st);
    tp_master_kill(&e->m);
    char p[400];
    snprintf(p, sizeof p, "%s.tmp", e->file);
    unlink(p);
    unlink(e->file);
    rmdir(e->dir);
}

static uint8_t v[32768], back[32768];

static int put_all(env *e)
{
    char key[32];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "obj-%d", i);
        tp_fill(v, sizeof v, 500 + (uint64_t)i);
        if (kvp_client_put(e->c, key, v, sizeof v) != 0)
            return -1;
    }
    for (int i = 0; i < N; i += 10) {
        snprintf(key, sizeof key, "obj-%d", i);
        if (kvp_client_remove(e->c, key, 0) != 0)
            return -1;
    }
    return 0;
}

/* After a restart: every kept object byte-exact once the node remounted,
 * every removed one absent. Returns the objects lost (wrong bytes: -1). */
static int check_all(env *e, uint64_t t0, const char *what)
{
    int lost = 0;
    char key[32];
    /* the node remounts first (its next heartbeat finds the new master) */
    while (kvp_client_get(e->c, "obj-1", back, sizeof back) != (int64_t)sizeof back &&
           tp_now_ms() - t0 < 20000)
        tp_sleep_ms(50);
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "obj-%d", i);
        int64_t n = kvp_client_get(e->c, key, back, sizeof back);
        if (i % 10 == 0) {
            if (n != KVP_EOBJECT_NOT_FOUND)
                return -1;
            continue;
        }
        tp_fill(v, sizeof v, 500 + (uint64_t)i);
        if (n != (int64_t)sizeof v)
            lost++;
        else if (memcmp(v, back, sizeof v) != 0)
            return -1;
    }
    fprintf(stderr, "    %s: %d of %d lost, all read %llu ms after the restart began\n", what,
            lost, N - N / 10, (unsigned long long)(tp_now_ms() - t0));
    return lost;
}

TEST(snapshot_restart_after_kill)
{
    env e;
    if (env_up(&e) != 0) {
        th_fail(__FILE__, __LINE__, "setup failed");
        env_down(&e);
        return;
    }
    CHECK_EQ(put_all(&e), 0);
    tp_sleep_ms(100); /* one loop turn writes the last changes */
    uint64_t t0 = tp_now_ms();
    tp_master_kill(&e.m);
    if (master_up(&e) != 0)
        th_fail(__FILE__, __LINE__, "restart failed");
    else
        CHECK_EQ(check_all(&e, t0, "kill -9, restart"), 0);
    /* and new puts land around the adopted objects */
    tp_fill(v, sizeof v, 9);
    CHECK_EQ(kvp_client_put(e.c, "new", v, sizeof v), 0);
    CHECK_EQ(kvp_client_get(e.c, "new", back, sizeof back), (int64_t)sizeof v);
    CHECK(memcmp(v, back, sizeof v) == 0);
    CHECK_EQ(check_all(&e, tp_now_ms(), "after a new put"), 0);
    env_down(&e);
}

TEST(snapshot_restart_after_clean_stop_and_torn_tail)
{
    env e;
    if (env_up(&e) != 0) {
        th_fail(__FILE__, __LINE__, "setup failed");
        env_down(&e);
        return;
    }
    CHECK_EQ(put_all(&e), 0);
    uint64_t t0 = tp_now_ms();
    CHECK_EQ(tp_master_stop(&e.m), 0);
    /* a torn frame at the end, as a crash mid-write leaves */
    int fd = open(e.file, O_WRONLY | O_APPEND);
    CHECK(fd >= 0);
    static const uint8_t torn[] = {'K', 'V', 'P', '1', 28, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK_EQ(write(fd, torn, sizeof torn), (ssize_t)sizeof torn);
    close(fd);
    if (master_up(&e) != 0)
        th_fail(__FILE__, __LINE__, "restart failed");
    else
        CHECK_EQ(check_all(&e, t0, "clean stop, torn tail, restart"), 0);
    env_down(&e);
}
