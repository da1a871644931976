/*
 * inferops_npu_plugin.c - CRIU plugin for the device files an Ascend NPU process still holds after
 * aclrtSnapShotProcessBackup: its descriptors on the nodes an Ascend container is given (davinci<N>, davinci_manager
 * or its fallback npu_device_cust, devmm_svm, hisi_hdc) and its mappings of them (SVM segments, per-stream queues).
 *
 * Part of the inferops.snapshot Ansible collection (GPL-3.0-or-later). Modelled on MindCluster's NPU plugin (a
 * CRIU tree's plugins/npu/npu_plugin.c, used by Ascend/mind-cluster's grus runtime) and CRIU's own device plugins
 * (plugins/cuda, plugins/amdgpu); see docs/simulator.md "The NPU plugin". Device memory never passes through it:
 * the ACL runtime copies it into the process's host memory at backup and back at aclrtSnapShotProcessRestore.
 *
 * CRIU hands a plugin what it cannot dump itself (criu/files.c dump_chrdev -> dump_unsupp_fd ->
 * DUMP_EXT_FILE; criu/proc_parse.c: a mapping that is neither a regular file nor /dev/zero -> HANDLE_DEVICE_VMA).
 *   DUMP_EXT_FILE      a descriptor on an NPU node: its path, open flags, type and major/minor, in the image
 *                      inferops-npu.img in CRIU's images directory (covered by the snapshot's checksums); the
 *                      plugin then names itself in CRIU's inventory, so that a restore without it fails at once
 *                      ("Missing required plugin")
 *   HANDLE_DEVICE_VMA  a mapping of an NPU node: accepted (CRIU keeps its address and path), recorded
 *   RESTORE_EXT_FILE   every node of this node's numbering (INFEROPS_NPU_DEVICES, the file inferops-npu-devices
 *                      in the images directory) made so, under a lock, whether the process held a descriptor on it
 *                      or not; the recorded node (else the host's node at the same path) opened with its flags
 *   UPDATE_VMA_MAP     a mapping of an NPU node becomes an empty memfd placeholder: the runtime closes the old
 *                      device and maps it again itself when it restores the process (the driver's mapping cannot
 *                      be made by anyone else)
 * Anything that is not an NPU node is left to CRIU and other plugins (-ENOTSUP). Every error line carries
 * INFEROPS_NPU_MARKER and names the device, so that the collection can tell the plugin's failure from CRIU's.
 * The image and the numbering are text in the one grammar of docs/simulator.md, "The plugin's text formats" (FORMATS),
 * which core/store/criu_images.py reads and core/store/device.py writes too (inferops_npu_format.h): anything outside
 * it is an error, never a guess. The records are as many as the process holds, up to MAX_RECORDS, counted at dump.
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

#define PLUGIN_NAME "inferops_npu"

/* criu's log (exported by the criu binary for its plugins; criu-log.h does not declare it) */
extern void print_on_level(unsigned int loglevel, const char *format, ...) __attribute__((format(printf, 2, 3)));
/* CRIU's inventory of the plugins a dump needed (criu/include/image.h, exported since 4.0; weak: an older CRIU lacks
 * them, and then a restore without the plugin fails only where it meets a descriptor) */
extern int add_inventory_plugin(const char *name) __attribute__((weak));
extern bool check_and_remove_inventory_plugin(const char *name, size_t n) __attribute__((weak));
#define LOG_ERROR 1
#define LOG_INFO 3
#define npu_err(fmt, ...) \
    print_on_level(LOG_ERROR, "Error (%s:%d): " INFEROPS_NPU_MARKER " " fmt "\n", __FILE__, __LINE__, ##__VA_ARGS__)
#define npu_info(fmt, ...) print_on_level(LOG_INFO, "inferops-npu: " fmt "\n", ##__VA_ARGS__)

#include "inferops_npu_nodes.h"

static unsigned int g_dumped;   /* records this dump wrote */
static int g_in_inventory;      /* this dump named the plugin in CRIU's inventory */
static int g_placeholder = -1;  /* the memfd every placeholder mapping is a descriptor of */

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

/* The plugin named in CRIU's inventory of this dump (once): a restore that does not load it then fails before it
 * touches anything ("Missing required plugin"), as CRIU's amdgpu and cuda plugins have it. 0, or -1 (logged). */
static int name_in_inventory(void)
{
    if (g_in_inventory) {
        return 0;
    }
    if (add_inventory_plugin == NULL) {
        npu_info("this CRIU keeps no inventory of plugins: a restore without this one fails at the first device");
    } else if (add_inventory_plugin(PLUGIN_NAME) != 0) {
        npu_err("cannot name the plugin %s in CRIU's inventory", PLUGIN_NAME);
        return -1;
    }
    g_in_inventory = 1;
    return 0;
}

/* The record "head path" (head: the fields before the path) appended to the image. 0, or -1 (logged): a record
 * over MAX_RECORDS fails the dump here, never the restore. */
static int image_append(const char *head, const char *path)
{
    char esc[PATH_TOKEN_MAX + 1], line[PATH_TOKEN_MAX + 64];
    if (g_dumped >= MAX_RECORDS) {
        npu_err("device %s: the process holds more than %d NPU descriptors and mappings, more than %s may hold "
                "(MAX_RECORDS): the checkpoint fails here rather than its restore", path, MAX_RECORDS, IMAGE_NAME);
        return -1;
    }
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
    g_dumped++;
    return name_in_inventory();
}

static int load_image(void)
{
    char line[PATH_TOKEN_MAX + 64], path[PATH_TOKEN_MAX + 1];
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
        record_t parsed = {0}, *r;
        if (n > MAX_RECORDS) {
            npu_err("%s holds more than %d records", IMAGE_NAME, MAX_RECORDS);
            rc = -1;
        } else if (parse_record(line, &parsed, path) != 0) {
            int len = (int)strcspn(line, "\n");
            npu_err("%s: record %zu is malformed (%s), truncated, or not this plugin's: \"%.*s\"", IMAGE_NAME, n,
                    FORMATS, len > 300 ? 300 : len, line);
            rc = -1;
        } else if ((r = add_record(parsed.kind, path)) == NULL) {
            rc = -1;
        } else {
            parsed.path = r->path;
            *r = parsed;
        }
    }
    if (rc == 0 && ferror(f)) {
        npu_err("cannot read %s: %s", IMAGE_NAME, strerror(errno));
        rc = -1;
    }
    fclose(f);
    return rc;
}

/* This node's numbering from TARGETS_FILE beside the images, when there is one: 0, or -1 (logged). */
static int load_targets_file(void)
{
    int fd = openat(criu_get_image_dir(), TARGETS_FILE, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) {
            return 0;
        }
        npu_err("cannot read %s: %s", TARGETS_FILE, strerror(errno));
        return -1;
    }
    char buf[TARGETS_MAX + 2];
    size_t len = 0;
    ssize_t got = 0;
    while (len < sizeof(buf) - 1 && (got = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0) {
        len += (size_t)got;
    }
    close(fd);
    buf[len] = '\0';
    if (got < 0) {
        npu_err("cannot read %s: %s", TARGETS_FILE, strerror(errno));
        return -1;
    }
    return parse_targets(buf, len, TARGETS_FILE);
}

/* -- hooks ------------------------------------------------------------------------------------------------- */

static int npu_init(int stage)
{
    drop_records();
    g_dumped = 0;
    g_in_inventory = 0;
    if (stage != CR_PLUGIN_STAGE__RESTORE) {
        return 0;
    }
    /* off the inventory's list of plugins the images need, or CRIU fails the restore for want of this one */
    if (check_and_remove_inventory_plugin != NULL) {
        (void)check_and_remove_inventory_plugin(PLUGIN_NAME, strlen(PLUGIN_NAME));
    }
    if (load_image() != 0) {
        return -1;
    }
    /* the numbering of this node's devices: what the caller says, else the host's node at the same path */
    const char *env = getenv(TARGETS_ENV);
    if ((env != NULL && parse_targets(env, strlen(env), TARGETS_ENV) != 0) || load_targets_file() != 0) {
        return -1;
    }
    /* MindCluster's way, where nothing was said: the host's node at the same path (CRIU is still in the host's
     * mount namespace here), for a container whose /dev came back from the images with the old numbering */
    size_t recorded = g_nrecords;
    for (size_t i = 0; i < recorded; i++) {
        struct stat st;
        const record_t *r = &g_records[i];
        if (r->kind != 'f' || find('t', 0, r->path) != NULL || stat(r->path, &st) != 0 ||
            !(S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))) {
            continue;
        }
        record_t *t = add_record('t', g_records[i].path); /* may move g_records: r is not used after it */
        if (t == NULL) {
            return -1;
        }
        t->type = S_ISCHR(st.st_mode) ? 'c' : 'b';
        t->major = major(st.st_rdev);
        t->minor = minor(st.st_rdev);
    }
    return 0;
}

static void npu_fini(int stage, int ret)
{
    (void)stage;
    (void)ret;
    drop_records();
    if (g_placeholder >= 0) {
        close(g_placeholder);
        g_placeholder = -1;
    }
}

CR_PLUGIN_REGISTER(PLUGIN_NAME, npu_init, npu_fini)

/* The path (in the process) and stat of an NPU node fd is open on: 0, or -ENOTSUP for anything else. */
static int npu_node_of(int fd, const struct stat *st, char *path, size_t n)
{
    if (!(S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)) || fd_path(fd, path, n) != 0 || !is_npu_path(path)) {
        return -ENOTSUP;
    }
    return 0;
}

static int npu_dump_ext_file(int fd, int id)
{
    char path[4096], head[64];
    struct stat st;
    if (fstat(fd, &st) != 0 || npu_node_of(fd, &st, path, sizeof(path)) != 0) {
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
    if (npu_node_of(fd, st, path, sizeof(path)) != 0) {
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

static int npu_restore_ext_file(int id)
{
    const record_t *r = find('f', (unsigned int)id, NULL);
    if (r == NULL) {
        return -ENOTSUP;
    }
    if (make_every_target() != 0 || node_ready(r) != 0) {
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

/* A mapping of an NPU node: an empty placeholder where it was. The descriptor is a new one each time, as CRIU's
 * amdgpu plugin gives them: CRIU maps the first of a run of mappings of one file with it and closes it after the
 * last; the others of the run stay open (close-on-exec) in the restored process. */
static int npu_update_vma_map(const char *path, const uint64_t addr, const uint64_t old_pgoff, uint64_t *new_pgoff,
                              int *plugin_fd)
{
    if (path == NULL || !is_npu_path(path)) {
        return -ENOTSUP;
    }
    if (g_placeholder < 0 && (g_placeholder = memfd_create("inferops-npu-placeholder", MFD_CLOEXEC)) < 0) {
        npu_err("device %s: no placeholder for its mapping at %#llx: memfd_create: %s", path, (unsigned long long)addr,
                strerror(errno));
        return -1;
    }
    int fd = fcntl(g_placeholder, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        npu_err("device %s: no placeholder for its mapping at %#llx: %s", path, (unsigned long long)addr,
                strerror(errno));
        return -1;
    }
    *new_pgoff = 0;
    *plugin_fd = fd;
    npu_info("mapping of %s at %#llx (offset %#llx) restored as an empty placeholder; the runtime maps the device "
             "again at aclrtSnapShotProcessRestore", path, (unsigned long long)addr, (unsigned long long)old_pgoff);
    return 1;
}
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__UPDATE_VMA_MAP, npu_update_vma_map)
