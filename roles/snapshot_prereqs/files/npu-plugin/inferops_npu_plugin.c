/*
 * inferops_npu_plugin.c - CRIU plugin for the descriptors and mappings an Ascend NPU process still holds after
 * aclrtSnapShotProcessBackup: its device nodes (/dev/davinci<N>, /dev/davinci_manager) and its mappings of them.
 *
 * Part of the inferops.snapshot Ansible collection (GPL-3.0-or-later). Modelled on MindCluster's NPU plugin (a
 * CRIU tree's plugins/npu/npu_plugin.c, used by Ascend/mind-cluster's grus runtime) and CRIU's own device plugins
 * (plugins/cuda, plugins/amdgpu); see docs/simulator.md "The NPU plugin". Device memory never passes through it:
 * the ACL runtime copies it into the process's host memory at backup and back at aclrtSnapShotProcessRestore.
 *
 * CRIU hands a plugin what it cannot dump itself (criu/files.c dump_chrdev -> dump_unsupp_fd ->
 * DUMP_EXT_FILE; criu/proc_parse.c: a mapping that is neither a regular file nor /dev/zero -> HANDLE_DEVICE_VMA).
 *   DUMP_EXT_FILE      a descriptor on an NPU node: its path, open flags, type and major/minor, in the image
 *                      inferops-npu.img in CRIU's images directory (covered by the snapshot's checksums)
 *   HANDLE_DEVICE_VMA  a mapping of an NPU node: accepted (CRIU keeps its address and path), recorded
 *   RESTORE_EXT_FILE   the node at the recorded path re-created, under a lock, when its numbering is not this
 *                      node's (INFEROPS_NPU_DEVICES, the file inferops-npu-devices in the images directory, or
 *                      the same path on the host), then opened with the recorded flags
 *   UPDATE_VMA_MAP     a mapping of davinci_manager becomes an empty memfd placeholder: the runtime maps the
 *                      manager again itself when it restores the process (the driver's mapping cannot be made
 *                      by anyone else)
 * Anything that is not an NPU node is left to CRIU and other plugins (-ENOTSUP). Every error line carries
 * INFEROPS_NPU_MARKER and names the device, so that the collection can tell the plugin's failure from CRIU's.
 * The image and the numbering are text in the one grammar of docs/simulator.md, "The plugin's text formats" (FORMATS),
 * which core/store/criu_images.py reads and core/store/device.py writes too (inferops_npu_format.h): anything outside
 * it is an error, never a guess.
 */
#define _GNU_SOURCE
#include <criu-plugin.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <unistd.h>

#include "inferops_npu_format.h"

/* criu's log (exported by the criu binary for its plugins; criu-log.h does not declare it) */
extern void print_on_level(unsigned int loglevel, const char *format, ...) __attribute__((format(printf, 2, 3)));
#define LOG_ERROR 1
#define LOG_INFO 3
#define npu_err(fmt, ...) \
    print_on_level(LOG_ERROR, "Error (%s:%d): " INFEROPS_NPU_MARKER " " fmt "\n", __FILE__, __LINE__, ##__VA_ARGS__)
#define npu_info(fmt, ...) print_on_level(LOG_INFO, "inferops-npu: " fmt "\n", ##__VA_ARGS__)


static record_t *g_records;
static size_t g_nrecords;

static const record_t *find(int kind, unsigned int id, const char *path);

static int fd_path(int fd, char *buf, size_t n)
{
    char link[64];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t len = readlink(link, buf, n - 1);
    if (len < 0 || (size_t)len >= n - 1) {
        return -1;
    }
    buf[len] = '\0';
    return 0;
}

/* -- the image --------------------------------------------------------------------------------------------- */

/* The record "head path" (head: the fields before the path) appended to the image. 0, or -1 (logged). */
static int image_append(const char *head, const char *path)
{
    char esc[PATH_TOKEN_MAX + 1], line[PATH_TOKEN_MAX + 64];
    if (escape(path, esc) != 0) {
        npu_err("device %s: its path is over %d bytes escaped, more than %s holds", path, PATH_TOKEN_MAX, IMAGE_NAME);
        return -1;
    }
    snprintf(line, sizeof(line), "%s %s\n", head, esc);
    int fd = openat(criu_get_image_dir(), IMAGE_NAME, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        npu_err("cannot write %s for %s: %s", IMAGE_NAME, path, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    size_t hlen = strlen(IMAGE_HEADER), llen = strlen(line);
    int ok = (st.st_size > 0 || write(fd, IMAGE_HEADER, hlen) == (ssize_t)hlen) && write(fd, line, llen) == (ssize_t)llen;
    if (!ok || close(fd) != 0) {
        npu_err("cannot write %s for %s: %s", IMAGE_NAME, path, strerror(errno));
        return -1;
    }
    return 0;
}

static record_t *add_record(void)
{
    if (g_nrecords == CAPACITY || (g_records == NULL && (g_records = calloc(CAPACITY, sizeof(record_t))) == NULL)) {
        npu_err("no room for another device record (%d at most)", CAPACITY);
        return NULL;
    }
    record_t *r = &g_records[g_nrecords++];
    memset(r, 0, sizeof(*r));
    return r;
}

/* The grammar's targets (this node's numbering of the devices, by the path the process sees) from source into 't'
 * records: 0, or -1 naming what is wrong -- a numbering dropped would re-create a node with the old one. */
static int parse_targets(const char *text, size_t len, const char *source)
{
    size_t first = g_nrecords;
    const char *end = len > 0 && text[len - 1] == '\n' ? text + len - 1 : text + len;
    if (len > TARGETS_MAX || memchr(text, '\0', len) != NULL) {
        npu_err("%s: over %d bytes, or a NUL byte in it (%s)", source, TARGETS_MAX, FORMATS);
        return -1;
    }
    for (const char *p = text, *entry = text; end > text; entry = ++p) { /* after a comma, always an entry */
        record_t *r = g_nrecords - first < MAX_RECORDS ? add_record() : NULL;
        if (r == NULL) {
            npu_err("%s: more than %d entries, or no room for them", source, MAX_RECORDS);
            return -1;
        }
        p = path_token(entry, r->path);
        r->kind = 't';
        r->type = p && *p == '=' && (p[1] == 'c' || p[1] == 'b') && p[2] == ':' ? p[1] : 0;
        if (r->type == 0 || !(p = number(p + 3, 10, &r->major)) || *p++ != ':' || !(p = number(p, 10, &r->minor)) ||
            (p != end && *p != ',')) {
            size_t n = strcspn(entry, ",");
            n = entry + n > end ? (size_t)(end - entry) : n;
            npu_err("%s: malformed entry \"%.*s\": each entry is PATH=c:MAJOR:MINOR or PATH=b:MAJOR:MINOR, PATH "
                    "%%XX-escaped, comma-separated (%s); the restore cannot know this node's numbering", source,
                    n > 300 ? 300 : (int)n, entry, FORMATS);
            return -1;
        }
        for (size_t i = first; i + 1 < g_nrecords; i++) {
            if (strcmp(g_records[i].path, r->path) == 0) {
                npu_err("%s: %s is given two numberings", source, r->path);
                return -1;
            }
        }
        npu_info("target %s = %c %u:%u (%s)", r->path, r->type, r->major, r->minor, source);
        if (p == end) {
            break;
        }
    }
    return 0;
}

static int load_image(void)
{
    char line[PATH_TOKEN_MAX + 64];
    int rc = 0, fd = openat(criu_get_image_dir(), IMAGE_NAME, O_RDONLY | O_CLOEXEC);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (f == NULL) {
        if (fd < 0 && errno == ENOENT) {
            return 0; /* a process without NPU devices */
        }
        npu_err("cannot read %s: %s", IMAGE_NAME, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    if (fgets(line, sizeof(line), f) == NULL || strcmp(line, IMAGE_HEADER) != 0) {
        npu_err("%s is not an image this plugin wrote (header)", IMAGE_NAME);
        rc = -1;
    }
    for (size_t n = 1; rc == 0 && fgets(line, sizeof(line), f) != NULL; n++) {
        record_t *r = n <= MAX_RECORDS ? add_record() : NULL;
        if (r == NULL) {
            npu_err("%s holds more than %d records, or there is no room for them", IMAGE_NAME, MAX_RECORDS);
            rc = -1;
        } else if (parse_record(line, r) != 0) {
            int len = (int)strcspn(line, "\n");
            npu_err("%s: record %zu is malformed (%s), truncated, or not this plugin's: \"%.*s\"", IMAGE_NAME, n,
                    FORMATS, len > 300 ? 300 : len, line);
            rc = -1;
        }
    }
    if (rc == 0 && ferror(f)) {
        npu_err("cannot read %s: %s", IMAGE_NAME, strerror(errno));
        rc = -1;
    }
    fclose(f);
    return rc;
}

/* -- hooks ------------------------------------------------------------------------------------------------- */

static int npu_init(int stage)
{
    g_nrecords = 0;
    if (stage != CR_PLUGIN_STAGE__RESTORE) {
        return 0;
    }
    if (load_image() != 0) {
        return -1;
    }
    /* the numbering of this node's devices: what the caller says, else the host's node at the same path */
    const char *env = getenv(TARGETS_ENV);
    if (env != NULL && parse_targets(env, strlen(env), TARGETS_ENV) != 0) {
        return -1;
    }
    int fd = openat(criu_get_image_dir(), TARGETS_FILE, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno != ENOENT) {
        npu_err("cannot read %s: %s", TARGETS_FILE, strerror(errno));
        return -1;
    }
    if (fd >= 0) {
        char buf[TARGETS_MAX + 2];
        size_t len = 0;
        ssize_t got = 0;
        while (len < sizeof(buf) - 1 && (got = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0) {
            len += (size_t)got;
        }
        close(fd);
        buf[len] = '\0';
        if (got < 0 || parse_targets(buf, len, TARGETS_FILE) != 0) {
            if (got < 0) {
                npu_err("cannot read %s: %s", TARGETS_FILE, strerror(errno));
            }
            return -1;
        }
    }
    /* MindCluster's way, where nothing was said: the host's node at the same path (CRIU is still in the host's
     * mount namespace here), for a container whose /dev came back from the images with the old numbering */
    size_t recorded = g_nrecords;
    for (size_t i = 0; i < recorded; i++) {
        struct stat st;
        record_t *r = &g_records[i], *t;
        if (r->kind != 'f' || find('t', 0, r->path) != NULL || stat(r->path, &st) != 0 ||
            !(S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))) {
            continue;
        }
        if ((t = add_record()) == NULL) {
            return -1;
        }
        t->kind = 't';
        t->type = S_ISCHR(st.st_mode) ? 'c' : 'b';
        t->major = major(st.st_rdev);
        t->minor = minor(st.st_rdev);
        snprintf(t->path, sizeof(t->path), "%s", r->path);
    }
    return 0;
}

static void npu_fini(int stage, int ret)
{
    (void)stage;
    (void)ret;
    free(g_records);
    g_records = NULL;
    g_nrecords = 0;
}

CR_PLUGIN_REGISTER("inferops_npu", npu_init, npu_fini)

static int npu_dump_ext_file(int fd, int id)
{
    char path[4096], head[64];
    struct stat st;
    if (fstat(fd, &st) != 0 || !(S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))) {
        return -ENOTSUP;
    }
    if (fd_path(fd, path, sizeof(path)) != 0) {
        return -ENOTSUP;
    }
    if (!is_npu_path(path)) {
        return -ENOTSUP;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0) {
        npu_err("device %s (%c %u:%u, file id %#x): cannot read its open flags: %s", path,
                S_ISCHR(st.st_mode) ? 'c' : 'b', major(st.st_rdev), minor(st.st_rdev), id, strerror(errno));
        return -1;
    }
    snprintf(head, sizeof(head), "fd %u %x %c %u %u", (unsigned int)id, (unsigned int)flags,
             S_ISCHR(st.st_mode) ? 'c' : 'b', major(st.st_rdev), minor(st.st_rdev));
    if (image_append(head, path) != 0) {
        return -1;
    }
    npu_info("dumped descriptor of %s (%c %u:%u, flags %#x) as file %#x", path, S_ISCHR(st.st_mode) ? 'c' : 'b',
             major(st.st_rdev), minor(st.st_rdev), (unsigned int)flags, id);
    return 0;
}
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__DUMP_EXT_FILE, npu_dump_ext_file)

static int npu_handle_device_vma(int fd, const struct stat *st)
{
    char path[4096], head[64];
    if (!(S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)) || fd_path(fd, path, sizeof(path)) != 0 ||
        !is_npu_path(path)) {
        return -ENOTSUP;
    }
    snprintf(head, sizeof(head), "vma %c %u %u", S_ISCHR(st->st_mode) ? 'c' : 'b', major(st->st_rdev),
             minor(st->st_rdev));
    if (image_append(head, path) != 0) {
        return -1;
    }
    npu_info("accepted a mapping of %s", path);
    return 0;
}
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA, npu_handle_device_vma)

static const record_t *find(int kind, unsigned int id, const char *path)
{
    for (size_t i = 0; i < g_nrecords; i++) {
        if (g_records[i].kind == kind && (path ? strcmp(g_records[i].path, path) == 0 : g_records[i].id == id)) {
            return &g_records[i];
        }
    }
    return NULL;
}

/* The node at r->path made this node's device (its target numbering), under a lock: another task of this
 * restore may be doing the same. 0, or -1 (logged). */
static int recreate_node(const record_t *r)
{
    char type = r->type;
    unsigned int major = r->major, minor = r->minor;
    const record_t *t = find('t', 0, r->path);
    struct stat now;
    int exists = lstat(r->path, &now) == 0;
    if (t == NULL) {  /* nothing says otherwise: the node at the path is this node's device */
        if (!exists) {
            npu_err("device %s (%c %u:%u) is missing here and this node's numbering for it is unknown (%s)", r->path,
                    r->type, r->major, r->minor, TARGETS_ENV);
            return -1;
        }
        if (now.st_rdev != makedev(r->major, r->minor)) {
            npu_info("device %s is %u:%u here, %u:%u when checkpointed: opening it as it is", r->path,
                     major(now.st_rdev), minor(now.st_rdev), r->major, r->minor);
        }
        return 0;
    }
    type = t->type;
    major = t->major;
    minor = t->minor;
    dev_t want = makedev(major, minor);
    int want_chr = type == 'c';
    if (exists && now.st_rdev == want && (want_chr ? S_ISCHR(now.st_mode) : S_ISBLK(now.st_mode))) {
        return 0;
    }
    /* lock or fail: unlocked, two tasks could unlink each other's node and leave one without it */
    int lock = open(RECREATE_LOCK, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock < 0 || flock(lock, LOCK_EX) != 0) {
        npu_err("device %s: cannot take the lock %s to re-create it as %c %u:%u: %s (it must be a file root can "
                "create and lock)", r->path, RECREATE_LOCK, type, major, minor, strerror(errno));
        if (lock >= 0) {
            close(lock);
        }
        return -1;
    }
    mode_t mode = exists ? (now.st_mode & 07777) : 0666;
    int rc = 0;
    if ((exists && unlink(r->path) != 0 && errno != ENOENT) ||
        mknod(r->path, (want_chr ? S_IFCHR : S_IFBLK) | mode, want) != 0) {
        npu_err("device %s: cannot re-create it as %c %u:%u (recorded %c %u:%u): %s", r->path, type, major, minor,
                r->type, r->major, r->minor, strerror(errno));
        rc = -1;
    } else {
        if (exists && chown(r->path, now.st_uid, now.st_gid) != 0) {
            npu_info("device %s: cannot give it back its owner: %s", r->path, strerror(errno));
        }
        npu_info("device %s re-created as %c %u:%u (it was %c %u:%u when checkpointed)", r->path, type, major, minor,
                 r->type, r->major, r->minor);
    }
    close(lock); /* and with it the lock */
    return rc;
}

static int npu_restore_ext_file(int id)
{
    const record_t *r = find('f', (unsigned int)id, NULL);
    if (r == NULL) {
        return -ENOTSUP;
    }
    if (recreate_node(r) != 0) {
        return -1;
    }
    int fd = open(r->path, r->flags & ~(O_CREAT | O_TRUNC | O_EXCL));
    if (fd < 0) {
        npu_err("device %s (%c %u:%u, file id %#x): cannot open it again with flags %#x: %s", r->path, r->type, r->major,
                r->minor, r->id, (unsigned int)r->flags, strerror(errno));
        return -1;
    }
    npu_info("restored descriptor of %s (file %#x) as fd %d", r->path, r->id, fd);
    return fd;
}
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__RESTORE_EXT_FILE, npu_restore_ext_file)

static int npu_update_vma_map(const char *path, const uint64_t addr, const uint64_t old_pgoff, uint64_t *new_pgoff,
                              int *plugin_fd)
{
    if (path == NULL || !is_npu_path(path)) {
        return -ENOTSUP;
    }
    if (!is_manager_path(path)) {
        npu_err("device %s: a mapping at %#llx of a device other than davinci_manager cannot be restored", path,
                (unsigned long long)addr);
        return -1;
    }
    int fd = memfd_create("inferops-npu-manager-placeholder", MFD_CLOEXEC);
    if (fd < 0) {
        npu_err("device %s: no placeholder for its mapping at %#llx: memfd_create: %s", path, (unsigned long long)addr,
                strerror(errno));
        return -1;
    }
    *new_pgoff = 0;
    *plugin_fd = fd;
    npu_info("mapping of %s at %#llx (offset %#llx) restored as an empty placeholder; the runtime maps the manager "
             "again at aclrtSnapShotProcessRestore", path, (unsigned long long)addr, (unsigned long long)old_pgoff);
    return 1;
}
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__UPDATE_VMA_MAP, npu_update_vma_map)
