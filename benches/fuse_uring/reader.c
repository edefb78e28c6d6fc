/* Figure-2 reader: N threads open, read whole (256 KiB reads), close every file
 * of a tree in a new shuffled order per pass. One untimed warm-up pass, then
 * P timed passes; prints files/s per pass and the median, plus CPU per file of
 * this process and (optionally) of a daemon pid.
 * usage: reader ROOT [threads=8] [passes=3] [daemon_pid=0]
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static char **files; static size_t nfiles, cap;
static size_t *order; static atomic_size_t next_idx; static atomic_ullong bytes_total;
static atomic_int errors;

static void add(const char *p) {
    if (nfiles == cap) { cap = cap ? cap * 2 : 65536; files = realloc(files, cap * sizeof *files); }
    files[nfiles++] = strdup(p);
}
static void walk(const char *dir) {
    DIR *d = opendir(dir); if (!d) { perror(dir); exit(1); }
    struct dirent *e; char p[4096];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (e->d_type == DT_DIR) walk(p); else add(p);
    }
    closedir(d);
}
static void *worker(void *arg) {
    (void)arg; char *buf = aligned_alloc(4096, 256 * 1024); unsigned long long b = 0;
    for (;;) {
        size_t i = atomic_fetch_add(&next_idx, 1);
        if (i >= nfiles) break;
        int fd = open(files[order[i]], O_RDONLY);
        if (fd < 0) { atomic_fetch_add(&errors, 1); continue; }
        ssize_t r;
        while ((r = read(fd, buf, 256 * 1024)) > 0) b += r;
        if (r < 0) atomic_fetch_add(&errors, 1);
        close(fd);
    }
    atomic_fetch_add(&bytes_total, b); free(buf); return NULL;
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static double self_cpu(void) { struct rusage u; getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6; }
static double pid_cpu(int pid) {
    if (!pid) return 0; char p[64], s[4096]; snprintf(p, sizeof p, "/proc/%d/stat", pid);
    FILE *f = fopen(p, "r"); if (!f) return 0; size_t n = fread(s, 1, sizeof s - 1, f); fclose(f); s[n] = 0;
    char *q = strrchr(s, ')'); unsigned long ut = 0, st = 0;
    /* fields after ')': state(3) ... utime(14) stime(15) */
    sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st);
    return (ut + st) / (double)sysconf(_SC_CLK_TCK);
}
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s ROOT [threads] [passes] [daemon_pid]\n", argv[0]); return 2; }
    int nt = argc > 2 ? atoi(argv[2]) : 8, np = argc > 3 ? atoi(argv[3]) : 3, dpid = argc > 4 ? atoi(argv[4]) : 0;
    walk(argv[1]);
    order = malloc(nfiles * sizeof *order);
    for (size_t i = 0; i < nfiles; i++) order[i] = i;
    srand48(12345);
    double rates[64];
    for (int pass = 0; pass <= np; pass++) {
        for (size_t i = nfiles - 1; i > 0; i--) { size_t j = lrand48() % (i + 1); size_t t = order[i]; order[i] = order[j]; order[j] = t; }
        atomic_store(&next_idx, 0); atomic_store(&bytes_total, 0); atomic_store(&errors, 0);
        pthread_t th[256]; double c0 = self_cpu(), d0 = pid_cpu(dpid), t0 = now();
        for (int i = 0; i < nt; i++) pthread_create(&th[i], NULL, worker, NULL);
        for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
        double dt = now() - t0, c = self_cpu() - c0, d = pid_cpu(dpid) - d0;
        double rate = nfiles / dt;
        printf("%s pass %d: %zu files %.2f GiB in %.3f s = %.0f files/s; reader cpu %.1f us/file%s",
               pass ? "timed" : "warm-up", pass, nfiles, atomic_load(&bytes_total) / 1073741824.0, dt, rate,
               c / nfiles * 1e6, dpid ? "" : "\n");
        if (dpid) printf(", daemon cpu %.1f us/file\n", d / nfiles * 1e6);
        if (atomic_load(&errors)) printf("  ERRORS: %d\n", atomic_load(&errors));
        fflush(stdout);
        if (pass) rates[pass - 1] = rate;
    }
    qsort(rates, np, sizeof *rates, cmp);
    printf("median files/s: %.0f\n", rates[np / 2]);
    return 0;
}
