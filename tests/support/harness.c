/* harness.c -- fork-per-test runner; see harness.h. */
#include "harness.h"

#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TH_MAX 512
#define TH_SKIP_EXIT 77

static struct { const char *name; void (*fn)(void); } tests[TH_MAX];
static int ntests;
static int failed_in_child;

void th_register(const char *name, void (*fn)(void))
{
    if (ntests < TH_MAX) {
        tests[ntests].name = name;
        tests[ntests].fn = fn;
        ntests++;
    }
}

void th_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "    %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    failed_in_child = 1;
}

int th_failed(void) { return failed_in_child; }

void th_skip(const char *reason)
{
    printf("    skip reason: %s\n", reason);
    fflush(stdout);
    exit(TH_SKIP_EXIT);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* No arguments: every test. "name": the named ones. "-name": every test
 * but the ones so named. */
static int selected(int argc, char **argv, const char *name)
{
    int only = 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-' && strcmp(argv[i] + 1, name) == 0)
            return 0;
        only |= argv[i][0] != '-';
    }
    for (int i = 1; only && i < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return 1;
    return !only;
}

#if defined(__SANITIZE_THREAD__)
/* ThreadSanitizer: a test that speaks ZeroMQ itself (a KV-events consumer)
 * reads messages libzmq's I/O thread filled, handed over through libzmq's
 * lock-free pipes that TSan cannot see (the library is not instrumented):
 * what libzmq calls is ignored, as in the kvpool binary (kvev.c, whose
 * definition wins where a test links it: this one is weak). */
const char *__tsan_default_suppressions(void);
__attribute__((weak)) const char *__tsan_default_suppressions(void)
{
    return "called_from_lib:libzmq.so\n";
}
#endif

int main(int argc, char **argv)
{
    int timeout = 300;
    const char *t = getenv("KVP_TEST_TIMEOUT");
    if (t && atoi(t) > 0)
        timeout = atoi(t);
    int passed = 0, failed = 0, skipped = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < ntests; i++) {
        if (!selected(argc, argv, tests[i].name))
            continue;
        double t0 = now_ms();
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            setpgid(0, 0); /* so a timeout kills what the test started too */
            alarm((unsigned)timeout);
            tests[i].fn();
            fflush(stdout);
            exit(failed_in_child ? 1 : 0);
        }
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) < 0) {
            printf("FAIL %s: cannot run (fork/wait)\n", tests[i].name);
            failed++;
            continue;
        }
        if (pid > 0)
            kill(-pid, SIGKILL); /* reap stragglers of the test's group */
        double ms = now_ms() - t0;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            printf("ok   %s (%.0f ms)\n", tests[i].name, ms);
            passed++;
        } else if (WIFEXITED(st) && WEXITSTATUS(st) == TH_SKIP_EXIT) {
            printf("skip %s\n", tests[i].name);
            skipped++;
        } else {
            if (WIFSIGNALED(st))
                printf("FAIL %s (signal %d%s, %.0f ms)\n", tests[i].name, WTERMSIG(st),
                       WTERMSIG(st) == SIGALRM ? ": timeout" : "", ms);
            else
                printf("FAIL %s (exit %d, %.0f ms)\n", tests[i].name, WEXITSTATUS(st), ms);
            failed++;
        }
    }
    printf("RESULT %d %d %d\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
