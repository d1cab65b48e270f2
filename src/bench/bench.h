/*
 * bench.h -- `kvpool bench ...`: the benchmarks, one file each (bench.c the
 * dispatcher, the master benchmark and the helpers they share). They are
 * tools beside the product: they use the public API (kvpool.h,
 * kvpool_connector.h) and a few internals, and the command-line parser of
 * src/cli (cli.h). Each entry returns the process exit status.
 */
#ifndef KVP_BENCH_H
#define KVP_BENCH_H

#include <stddef.h>
#include <stdint.h>

struct kvp_client;

/* `kvpool bench NAME ...`; argv[0] is "bench". */
int kvp_bench_main(int argc, char **argv);
/* `kvpool bench store` (bench_store.c); argv[0] is "bench store". */
int kvp_bench_store(int argc, char **argv);
/* `kvpool bench connector` (bench_connector.c); argv[0] is "bench connector". */
int kvp_bench_connector(int argc, char **argv);
/* `kvpool bench sim` (bench_sim.c); argv[0] is "bench sim". */
int kvp_bench_sim(int argc, char **argv);
/* `kvpool bench gpu` (bench_gpu.c); argv[0] is "bench gpu". */
int kvp_bench_gpu(int argc, char **argv);
/* Shared by the benchmarks (bench.c): s as the body of a JSON string
 * (quotes and backslashes escaped, controls dropped); a standalone-store
 * client of master (token "" or NULL = none), TCP-only when force_tcp, NULL
 * with the reason in why; and a probe put of 4096 bytes of val under key
 * probe, retried up to 10 s while the node mounts, which records the
 * transport the client uses ("shm", "tcp") and removes the key: 0, or -1
 * with why. */
void kvp_bench_json_escape(char *out, size_t cap, const char *s);
/* qsort order of uint64_t; every byte of p to fd (EINTR retried): 0 or -1;
 * the "label shape round r/rounds" line on a terminal's stderr (r < 0:
 * warm-up), and its erasure over width columns. */
int kvp_bench_cmp_u64(const void *a, const void *b);
int kvp_bench_write_all(int fd, const void *p, size_t n);
void kvp_bench_progress(const char *label, int lw, const char *shape, int sw, int r, int rounds);
void kvp_bench_progress_clear(int width);
struct kvp_client *kvp_bench_client_open(const char *master, const char *token, int force_tcp,
                                         char *why, size_t wl);
/* The same from a whole client configuration (JSON text). */
struct kvp_client *kvp_bench_client_open_conf(const char *conf, int force_tcp, char *why,
                                              size_t wl);
int kvp_bench_client_probe(struct kvp_client *c, const char *probe, const void *val,
                           char *transport, char *why, size_t wl);
/* `kvpool bench segment` (bench_segment.c): a fresh `kvpool serve`'s ready
 * time, a fresh client's shm attach, puts during and after the segment's
 * prefault; argv[0] is "bench segment". */
int kvp_bench_segment(int argc, char **argv);
/* `kvpool bench disk`: bench_disk.c */
int kvp_bench_disk(int argc, char **argv);
/* `kvpool bench ha` (bench_ha.c): a leader + standby against one master,
 * failovers; argv[0] is "bench ha". */
int kvp_bench_ha(int argc, char **argv);
#endif
