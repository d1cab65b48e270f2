/* opts.c -- shared flag and config-file handling for subcommands. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/log.h"
#include "kvpool.h"

static int own_index(const char *const *own, const char *name, size_t len, int *is_bool)
{
    for (int i = 0; own && own[i]; i++) {
        size_t ol = strlen(own[i]);
        int b = ol && own[i][ol - 1] == '!';
        if (b)
            ol--;
        if (ol == len && strncmp(own[i], name, len) == 0) {
            *is_bool = b;
            return i;
        }
    }
    return -1;
}

int kvp_cli_parse(int argc, char **argv, kvp_config *cfg, const char *const *own,
                  const char **own_vals)
{
    char err[KVP_CONFIG_ERRLEN];
    const char *file = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return 1;
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kvpool %s: flag --config needs a file name\n", argv[0]);
                return -1;
            }
            file = argv[++i];
        } else if (!strncmp(argv[i], "--config=", 9)) {
            file = argv[i] + 9;
        }
    }
    if (!file)
        file = getenv("KVPOOL_CONFIG");
    if (!file || !*file)
        file = getenv("MOONCAKE_CONFIG_PATH");
    if (file && *file && kvp_config_load_file(cfg, file, err, sizeof err) != 0) {
        fprintf(stderr, "kvpool %s: %s\n", argv[0], err);
        return -1;
    }
    const char *env_master = getenv("KVPOOL_MASTER");
    if (env_master && *env_master &&
        kvp_config_set(cfg, "master", env_master, err, sizeof err) != 0) {
        fprintf(stderr, "kvpool %s: KVPOOL_MASTER: %s\n", argv[0], err);
        return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        if (!strncmp(a, "--config=", 9))
            continue;
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            fprintf(stderr, "kvpool %s: unexpected argument \"%s\" (flags are --name value)\n",
                    argv[0], a);
            return -1;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nl = eq ? (size_t)(eq - name) : strlen(name);
        int is_bool = 0;
        int oi = own_index(own, name, nl, &is_bool);
        const char *val = NULL;
        if (eq)
            val = eq + 1;
        else if (!is_bool) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kvpool %s: flag --%.*s needs a value\n", argv[0], (int)nl, name);
                return -1;
            }
            val = argv[++i];
        } else {
            val = "1";
        }
        if (oi >= 0) {
            own_vals[oi] = val;
            continue;
        }
        char key[128];
        if (nl >= sizeof key) {
            fprintf(stderr, "kvpool %s: unknown flag --%.*s\n", argv[0], (int)nl, name);
            return -1;
        }
        memcpy(key, name, nl);
        key[nl] = '\0';
        if (kvp_config_set(cfg, key, val, err, sizeof err) != 0) {
            fprintf(stderr, "kvpool %s: flag --%s: %s\n", argv[0], key, err);
            return -1;
        }
    }
    if (kvp_config_validate(cfg, err, sizeof err) != 0) {
        fprintf(stderr, "kvpool %s: %s\n", argv[0], err);
        return -1;
    }
    kvp_log_set_level(cfg->log_level);
    return 0;
}

pid_t kvp_cli_spawn_self(const char *const *args, int wait_ms, char *addr, size_t addrlen)
{
    char pf[] = "/tmp/kvpool-spawn-XXXXXX";
    int fd = mkstemp(pf);
    if (fd < 0)
        return -1;
    close(fd);
    unlink(pf);
    const char *argv[32];
    int n = 0;
    argv[n++] = "kvpool";
    for (int i = 0; args[i] && n < 26; i++)
        argv[n++] = args[i];
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--port-file";
    argv[n++] = pf;
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execv("/proc/self/exe", (char *const *)argv);
        _exit(127);
    }
    if (pid < 0)
        return -1;
    for (int t = 0; t < wait_ms; t += 10) {
        FILE *f = fopen(pf, "r");
        unsigned port = 0;
        if (f) {
            int ok = fscanf(f, "%u", &port) == 1;
            fclose(f);
            if (ok) {
                unlink(pf);
                snprintf(addr, addrlen, "127.0.0.1:%u", port);
                return pid;
            }
        }
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return -1;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    unlink(pf);
    return -1;
}
