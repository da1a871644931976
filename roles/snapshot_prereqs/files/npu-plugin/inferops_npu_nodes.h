/*
 * inferops_npu_nodes.h - the NPU plugin's records and this node's numbering of the devices: the records the plugin
 * holds while CRIU runs (grown as needed: a dump is never cut short by a fixed table), the targets of docs/simulator.md's
 * grammar ("The plugin's text formats": this node's numbering, from INFEROPS_NPU_DEVICES or the file beside the
 * images), and the re-creation of a node whose
 * numbering is not this node's. Included by inferops_npu_plugin.c only, after its log macros (one translation unit).
 *
 * Part of the inferops.snapshot Ansible collection (GPL-3.0-or-later).
 */
#ifndef INFEROPS_NPU_NODES_H
#define INFEROPS_NPU_NODES_H

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static record_t *g_records;
static size_t g_nrecords, g_capacity;

/* A new record of path (copied), zeroed otherwise: NULL when there is no memory for it (logged). */
static record_t *add_record(int kind, const char *path)
{
    if (g_nrecords == g_capacity) {
        size_t more = g_capacity ? 2 * g_capacity : 64;
        record_t *grown = realloc(g_records, more * sizeof(record_t));
        if (grown == NULL) {
            npu_err("no memory for %zu device records", more);
            return NULL;
        }
        g_records = grown;
        g_capacity = more;
    }
    record_t *r = &g_records[g_nrecords];
    memset(r, 0, sizeof(*r));
    if ((r->path = strdup(path)) == NULL) {
        npu_err("no memory for the device record of %s", path);
        return NULL;
    }
    r->kind = kind;
    g_nrecords++;
    return r;
}

static void drop_records(void)
{
    for (size_t i = 0; i < g_nrecords; i++) {
        free(g_records[i].path);
    }
    free(g_records);
    g_records = NULL;
    g_nrecords = g_capacity = 0;
}

static const record_t *find(int kind, unsigned int id, const char *path)
{
    for (size_t i = 0; i < g_nrecords; i++) {
        if (g_records[i].kind == kind && (path ? strcmp(g_records[i].path, path) == 0 : g_records[i].id == id)) {
            return &g_records[i];
        }
    }
    return NULL;
}

/* The grammar's targets (this node's numbering of the devices, by the path the process sees) from source into 't'
 * records: 0, or -1 naming what is wrong -- a numbering dropped would re-create a node with the old one. */
static int parse_targets(const char *text, size_t len, const char *source)
{
    size_t first = g_nrecords;
    char path[PATH_TOKEN_MAX + 1];
    const char *end = len > 0 && text[len - 1] == '\n' ? text + len - 1 : text + len;
    if (len > TARGETS_MAX || memchr(text, '\0', len) != NULL) {
        npu_err("%s: over %d bytes, or a NUL byte in it (%s)", source, TARGETS_MAX, FORMATS);
        return -1;
    }
    for (const char *p = text, *entry = text; end > text; entry = ++p) { /* after a comma, always an entry */
        unsigned int major = 0, minor = 0;
        if (g_nrecords - first >= MAX_TARGETS) {
            npu_err("%s: more than %d entries", source, MAX_TARGETS);
            return -1;
        }
        p = path_token(entry, path);
        char type = p && *p == '=' && (p[1] == 'c' || p[1] == 'b') && p[2] == ':' ? p[1] : 0;
        if (type == 0 || !(p = number(p + 3, 10, &major)) || *p++ != ':' || !(p = number(p, 10, &minor)) ||
            (p != end && *p != ',')) {
            size_t n = strcspn(entry, ",");
            n = entry + n > end ? (size_t)(end - entry) : n;
            npu_err("%s: malformed entry \"%.*s\": each entry is PATH=c:MAJOR:MINOR or PATH=b:MAJOR:MINOR, PATH "
                    "%%XX-escaped, comma-separated (%s); the restore cannot know this node's numbering", source,
                    n > 300 ? 300 : (int)n, entry, FORMATS);
            return -1;
        }
        for (size_t i = first; i < g_nrecords; i++) {
            if (strcmp(g_records[i].path, path) == 0) {
                npu_err("%s: %s is given two numberings", source, path);
                return -1;
            }
        }
        record_t *r = add_record('t', path);
        if (r == NULL) {
            return -1;
        }
        r->type = type;
        r->major = major;
        r->minor = minor;
        npu_info("target %s = %c %u:%u (%s)", r->path, r->type, r->major, r->minor, source);
        if (p == end) {
            break;
        }
    }
    return 0;
}

/* The node at path made c/b major:minor (was: what the checkpointed process had there, for the log), under a
 * lock: another task of this restore may be doing the same. 0, or -1 (logged). */
static int make_node(const char *path, char type, unsigned int major, unsigned int minor, const char *was)
{
    struct stat now;
    dev_t want = makedev(major, minor);
    int exists = lstat(path, &now) == 0;
    if (exists && now.st_rdev == want && (type == 'c' ? S_ISCHR(now.st_mode) : S_ISBLK(now.st_mode))) {
        return 0;
    }
    /* lock or fail: unlocked, two tasks could unlink each other's node and leave one without it */
    int lock = open(RECREATE_LOCK, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock < 0 || flock(lock, LOCK_EX) != 0) {
        npu_err("device %s: cannot take the lock %s to re-create it as %c %u:%u: %s (it must be a file root can "
                "create and lock)", path, RECREATE_LOCK, type, major, minor, strerror(errno));
        if (lock >= 0) {
            close(lock);
        }
        return -1;
    }
    exists = lstat(path, &now) == 0; /* another task may have made it meanwhile */
    int rc = 0;
    if (exists && now.st_rdev == want && (type == 'c' ? S_ISCHR(now.st_mode) : S_ISBLK(now.st_mode))) {
        close(lock);
        return 0;
    }
    mode_t mode = exists ? (now.st_mode & 07777) : 0666;
    if ((exists && unlink(path) != 0 && errno != ENOENT) ||
        mknod(path, (type == 'c' ? S_IFCHR : S_IFBLK) | mode, want) != 0) {
        npu_err("device %s: cannot re-create it as %c %u:%u (%s): %s", path, type, major, minor, was,
                strerror(errno));
        rc = -1;
    } else {
        if (exists && chown(path, now.st_uid, now.st_gid) != 0) {
            npu_info("device %s: cannot give it back its owner: %s", path, strerror(errno));
        }
        npu_info("device %s re-created as %c %u:%u (%s)", path, type, major, minor, was);
    }
    close(lock); /* and with it the lock */
    return rc;
}

/* Every node this node numbers (the targets) made so in the restored process's mount namespace, once per task:
 * its /dev may have come back from the images with the checkpointed node's numbering, and the driver finds a
 * container's chips by them whether or not the process holds a descriptor on one (the HAL reaches a chip through
 * davinci_manager and an ioctl). 0, or -1 (logged). */
static int make_every_target(void)
{
    static int done;
    if (done) {
        return 0;
    }
    for (size_t i = 0; i < g_nrecords; i++) {
        const record_t *t = &g_records[i];
        if (t->kind == 't' && make_node(t->path, t->type, t->major, t->minor, "this node's numbering") != 0) {
            return -1;
        }
    }
    done = 1;
    return 0;
}

/* The node of a recorded descriptor ready to be opened: this node's numbering where one is known (the targets, made
 * already), else the node at its path as it is. 0, or -1 (logged). */
static int node_ready(const record_t *r)
{
    struct stat now;
    if (find('t', 0, r->path) != NULL) {
        return 0;
    }
    if (lstat(r->path, &now) != 0) {
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

#endif
