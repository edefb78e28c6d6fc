/* mini_ro: minimal read-only FUSE low-level server for the figure-2 transport
 * test. Serves SOURCE at MOUNTPOINT; keeps a path per inode (no O_PATH fd per
 * inode, unlike passthrough_hp, so 50,000 files fit under a 20,000 fd limit).
 * Like locafs's default mode: entry/attr timeout 1 day, keep_cache, FOPEN_NOFLUSH
 * on read-only opens, no writeback cache, no FUSE passthrough. A warm file costs
 * OPEN + RELEASE. Usage: mini_ro SOURCE MOUNTPOINT [libfuse options, e.g. -f
 * -o io_uring -o io_uring_q_depth=N --max-threads=8]
 */
#define FUSE_USE_VERSION FUSE_MAKE_VERSION(3, 18)
#define _GNU_SOURCE
#include <fuse_lowlevel.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TMO 86400.0
/* nodeid -> path table; nodeid = source st_ino (root = 1). Open hash. */
struct ent { fuse_ino_t ino; char *path; };
static struct ent *tab; static size_t tabsz = 1 << 20; static pthread_rwlock_t lk = PTHREAD_RWLOCK_INITIALIZER;
static char *root;

static char *get_path(fuse_ino_t ino) {
    if (ino == FUSE_ROOT_ID) return root;
    char *p = NULL; pthread_rwlock_rdlock(&lk);
    for (size_t h = (ino * 0x9E3779B97F4A7C15ull) & (tabsz - 1); tab[h].ino; h = (h + 1) & (tabsz - 1))
        if (tab[h].ino == ino) { p = tab[h].path; break; }
    pthread_rwlock_unlock(&lk); return p;
}
static void put_path(fuse_ino_t ino, const char *path) {
    pthread_rwlock_wrlock(&lk);
    size_t h = (ino * 0x9E3779B97F4A7C15ull) & (tabsz - 1);
    for (; tab[h].ino; h = (h + 1) & (tabsz - 1)) if (tab[h].ino == ino) goto out;
    tab[h].ino = ino; tab[h].path = strdup(path);
out: pthread_rwlock_unlock(&lk);
}
static void ro_init(void *ud, struct fuse_conn_info *conn) {
    (void)ud;
    fuse_set_conn_flag(conn, FUSE_CONN_FLAG_SINGLE_ISSUER); /* replies inline, as passthrough_hp */
    fuse_unset_feature_flag(conn, FUSE_CAP_WRITEBACK_CACHE);
    fuse_unset_feature_flag(conn, FUSE_CAP_PASSTHROUGH);
}
static void ro_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    char *pp = get_path(parent), p[4096]; struct fuse_entry_param e = {0};
    if (!pp) { fuse_reply_err(req, ESTALE); return; }
    snprintf(p, sizeof p, "%s/%s", pp, name);
    if (lstat(p, &e.attr)) { fuse_reply_err(req, errno); return; }
    if (e.attr.st_ino == FUSE_ROOT_ID) { fuse_reply_err(req, EIO); return; }
    put_path(e.attr.st_ino, p);
    e.ino = e.attr.st_ino; e.attr_timeout = e.entry_timeout = TMO;
    fuse_reply_entry(req, &e);
}
static void ro_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi; struct stat st; char *p = get_path(ino);
    if (!p) { fuse_reply_err(req, ESTALE); return; }
    if (lstat(p, &st)) { fuse_reply_err(req, errno); return; }
    st.st_ino = ino; fuse_reply_attr(req, &st, TMO);
}
static void ro_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    char *p = get_path(ino);
    if (!p) { fuse_reply_err(req, ESTALE); return; }
    if ((fi->flags & O_ACCMODE) != O_RDONLY) { fuse_reply_err(req, EROFS); return; }
    int fd = open(p, O_RDONLY);
    if (fd < 0) { fuse_reply_err(req, errno); return; }
    fi->fh = fd; fi->keep_cache = 1; fi->noflush = 1;
    fuse_reply_open(req, fi);
}
static void ro_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)ino; char *b = malloc(size); ssize_t r = pread(fi->fh, b, size, off);
    if (r < 0) fuse_reply_err(req, errno); else fuse_reply_buf(req, b, r);
    free(b);
}
static void ro_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino; close(fi->fh); fuse_reply_err(req, 0);
}
static void ro_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    char *p = get_path(ino); DIR *d = p ? opendir(p) : NULL;
    if (!d) { fuse_reply_err(req, p ? errno : ESTALE); return; }
    fi->fh = (uintptr_t)d; fi->cache_readdir = 1; fuse_reply_open(req, fi);
}
static void ro_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)ino; DIR *d = (DIR *)(uintptr_t)fi->fh; char *b = malloc(size); size_t n = 0;
    seekdir(d, off); struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st = { .st_ino = e->d_ino, .st_mode = (mode_t)e->d_type << 12 };
        size_t l = fuse_add_direntry(req, b + n, size - n, e->d_name, &st, telldir(d));
        if (l > size - n) break;
        n += l;
    }
    fuse_reply_buf(req, b, n); free(b);
}
static void ro_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino; closedir((DIR *)(uintptr_t)fi->fh); fuse_reply_err(req, 0);
}
static const struct fuse_lowlevel_ops ops = {
    .init = ro_init, .lookup = ro_lookup, .getattr = ro_getattr, .open = ro_open, .read = ro_read,
    .release = ro_release, .opendir = ro_opendir, .readdir = ro_readdir, .releasedir = ro_releasedir,
};
int main(int argc, char *argv[]) {
    if (argc < 3) { fprintf(stderr, "usage: %s SOURCE MOUNTPOINT [options]\n", argv[0]); return 2; }
    root = realpath(argv[1], NULL); tab = calloc(tabsz, sizeof *tab);
    if (!root || !tab) { perror("source"); return 1; }
    argv[1] = argv[0];
    struct fuse_args args = FUSE_ARGS_INIT(argc - 1, argv + 1);
    struct fuse_cmdline_opts o;
    if (fuse_parse_cmdline(&args, &o) || !o.mountpoint) { fprintf(stderr, "bad options\n"); return 2; }
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se || fuse_set_signal_handlers(se) || fuse_session_mount(se, o.mountpoint)) return 1;
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(cfg, o.max_threads);
    fuse_loop_cfg_set_clone_fd(cfg, o.clone_fd);
    int ret = o.singlethread ? fuse_session_loop(se) : fuse_session_loop_mt(se, cfg);
    fuse_session_unmount(se); fuse_remove_signal_handlers(se); fuse_session_destroy(se);
    return ret ? 1 : 0;
}
