/*
 * acl_sim.c - simulator of the Ascend ACL snapshot runtime: a drop-in libascendcl.so subset.
 *
 * Part of the inferops.snapshot collection's test tooling. It enforces the contract of the
 * CANN runtime's snapshot feature (GlobalStateManager + SnapshotCallbackManager): self-pid
 * only, the RUNNING/LOCKED/BACKED_UP state machine, blocking of resource-changing calls while
 * locked, background-thread parking with a timeout, stage callbacks, and the error codes.
 * Device memory lives outside the process (one shared-memory file per device) so that only a
 * backup into process memory followed by a restore brings it back after the device is reset.
 * Its costs are modelled on the device's: the memory is allocated once, when the device file is
 * created (as HBM is there before any process uses it), and a copy between host and device takes
 * at least bytes / ACL_SIM_COPY_GBPS (a DMA over the device's link), not the host's page faults.
 * See include/acl/acl_snapshot_sim.h for the documented behaviour and the environment knobs.
 */
#define _GNU_SOURCE
#include "acl/acl_snapshot_sim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define SIM_MAX_DEVICES 64
#define SIM_VA_SHIFT 40
#define SIM_VA_SPAN (1ULL << SIM_VA_SHIFT)
#define SIM_ALIGN 512ULL
#define SIM_MAX_CALLBACKS 64
#define SIM_STAGES 6
#define SIM_DEFAULT_DIR "/dev/shm/aclsim"
#define SIM_HUGE (2ULL << 20)          /* the 2 MiB pages device memory is gathered into */
#define SIM_DEFAULT_COPY_GBPS 25.0     /* see docs/simulator.md "The cost model" */
#define SIM_DEFAULT_NODES "/dev"       /* where the runtime finds davinci<N> and davinci_manager */
#define SIM_MANAGER_BYTES 65536        /* what the process maps of davinci_manager */
#define SIM_MANAGER_MAGIC "ACLSIM-DAVINCI-MANAGER" /* aclsim_ctl.py install writes it at offset 0 */
#define SIM_DEFAULT_RUNTIME_API 10000
#define SIM_DEFAULT_DRIVER_API 500
#define SIM_DEFAULT_DRIVER_DIR "/usr/local/Ascend/driver/lib64" /* the Ascend Docker Runtime mounts it from the host */

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux >= 6.1; older kernels answer EINVAL and keep 4 KiB pages */
#endif

enum { PREALLOC_NONE = 0, PREALLOC_PAGES = 1, PREALLOC_HUGE = 2 };
enum { COPY_NONE = 0, COPY_BACKUP = 1, COPY_RESTORE = 2 };

typedef struct {
    uint64_t off;
    uint64_t size;
} sim_alloc_t;

typedef struct {
    int refcount;         /* aclrtSetDevice calls minus aclrtResetDevice calls */
    int fd;               /* device file, flock'ed; -1 when closed */
    unsigned char *base;  /* MAP_SHARED mapping; NULL when not mapped */
    uint64_t size;        /* device memory size */
    sim_alloc_t *allocs;  /* sorted by offset */
    size_t nallocs;
    size_t cap;
    uint64_t used;
    unsigned char *saved; /* host copy made by backup, allocations concatenated */
    uint64_t saved_bytes;
    int has_saved;
} sim_device_t;

typedef struct {
    aclrtSnapShotCallBack cb;
    void *args;
} sim_cb_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* state, devices, counters */
static pthread_cond_t g_cv;                              /* every state/counter change */
static int g_state = ACL_SIM_STATE_RUNNING;
static uint32_t g_bg_registered;
static uint32_t g_bg_parked;
static uint32_t g_blocked;
static int g_inited;
static uint64_t g_backup_bytes;
static sim_device_t g_dev[SIM_MAX_DEVICES];
static aclsimCopyStats g_last_copy; /* the last backup or restore copy */
static int g_mgr_fd = -1;           /* the HAL's svm descriptor on davinci_manager (acl_sim_hal.h), or -1 */
static void *g_mgr_map;             /* its mapping of the manager's first pages (SIM_MANAGER_BYTES), or NULL */
static struct {                     /* what a backup with args recorded (snapshot.md: SnapShotVersionInfoBackup) */
    int has;
    uint32_t runtime_api;
    int driver_api;
    uint32_t flags;
} g_backup_info;

static pthread_mutex_t g_snap_mu = PTHREAD_MUTEX_INITIALIZER; /* serialises snapshot calls */
static __thread int t_in_snapshot;
static __thread int t_cur_dev = -1;

static pthread_mutex_t g_cb_mu = PTHREAD_MUTEX_INITIALIZER;
static sim_cb_t g_cbs[SIM_STAGES][SIM_MAX_CALLBACKS];
static size_t g_ncbs[SIM_STAGES];

static const char *const g_stage_names[SIM_STAGES] = {
    "ACL_RT_SNAPSHOT_LOCK_PRE",    "ACL_RT_SNAPSHOT_BACKUP_PRE",   "ACL_RT_SNAPSHOT_BACKUP_POST",
    "ACL_RT_SNAPSHOT_RESTORE_PRE", "ACL_RT_SNAPSHOT_RESTORE_POST", "ACL_RT_SNAPSHOT_UNLOCK_POST",
};

/* ------------------------------------------------------------------ helpers */

enum { LOG_WARN = -1, LOG_ERROR = 0, LOG_EVENT = 1, LOG_INFO = 2 };

static long long env_ll(const char *name, long long def, long long lo, long long hi)
{
    const char *s = getenv(name);
    if (s == NULL || *s == '\0') {
        return def;
    }
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s) {
        return def;
    }
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B' || *end == 'b') {
        end++;
    }
    if (v < lo) {
        v = lo;
    }
    if (v > hi) {
        v = hi;
    }
    return v;
}

static double env_double(const char *name, double def, double lo, double hi)
{
    const char *s = getenv(name);
    if (s == NULL || *s == '\0') {
        return def;
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || v != v) {
        return def;
    }
    return v < lo ? lo : v > hi ? hi : v;
}

static void sim_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sim_log(int level, const char *fmt, ...)
{
    if (level > 0 && level > (int)env_ll("ACL_SIM_LOG", 0, 0, 9)) {
        return;
    }
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *tag = level == LOG_WARN    ? "WARN"
                      : level == LOG_ERROR ? "ERROR"
                      : level == LOG_EVENT ? "EVENT"
                                           : "INFO";
    fprintf(stderr, "[aclsim][%s] pid=%d: %s\n", tag, (int)getpid(), msg);
    fflush(stderr);
}

static const char *state_name(int s)
{
    switch (s) {
    case ACL_SIM_STATE_RUNNING: return "RUNNING";
    case ACL_SIM_STATE_LOCKED: return "LOCKED";
    case ACL_SIM_STATE_BACKED_UP: return "BACKED_UP";
    default: return "UNKNOWN";
    }
}

static int device_count(void)
{
    return (int)env_ll("ACL_SIM_DEVICE_COUNT", 8, 1, SIM_MAX_DEVICES);
}

static uint64_t device_mem_bytes(void)
{
    return (uint64_t)env_ll("ACL_SIM_DEVICE_MEM_BYTES", 1LL << 30, 4096, 1LL << 40);
}

/* GB/s (10^9 bytes) of a copy between host and device memory; 0: not modelled (host speed). */
static double copy_gbps(void)
{
    return env_double("ACL_SIM_COPY_GBPS", SIM_DEFAULT_COPY_GBPS, 0.0, 100000.0);
}

static int prealloc_mode(void)
{
    const char *s = getenv("ACL_SIM_DEVICE_PREALLOC");
    if (s == NULL || *s == '\0' || strcmp(s, "huge") == 0 || strcmp(s, "2") == 0) {
        return PREALLOC_HUGE;
    }
    if (strcmp(s, "pages") == 0 || strcmp(s, "1") == 0) {
        return PREALLOC_PAGES;
    }
    if (strcmp(s, "none") == 0 || strcmp(s, "0") == 0) {
        return PREALLOC_NONE;
    }
    return PREALLOC_HUGE;
}

static long long lock_timeout_ms(void)
{
    return env_ll("ACL_SIM_LOCK_TIMEOUT_MS", 5000, 0, 24LL * 3600 * 1000);
}

static const char *device_dir(void)
{
    const char *d = getenv("ACL_SIM_DEVICE_DIR");
    return (d != NULL && *d != '\0') ? d : SIM_DEFAULT_DIR;
}

static int device_path(int dev, char *buf, size_t n)
{
    int r = snprintf(buf, n, "%s/device%d", device_dir(), dev);
    return (r > 0 && (size_t)r < n) ? 0 : -1;
}

static int mkdir_p(const char *dir)
{
    char tmp[4096];
    size_t len = strlen(dir);
    if (len == 0 || len >= sizeof(tmp)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(tmp, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (tmp[i] == '/' || tmp[i] == '\0') {
            char c = tmp[i];
            tmp[i] = '\0';
            if (mkdir(tmp, 0700) != 0 && errno != EEXIST) {
                return -1;
            }
            tmp[i] = c;
        }
    }
    return 0;
}

static uint64_t va_of(int dev, uint64_t off)
{
    return ACL_SIM_DEVICE_VA_BASE + ((uint64_t)dev << SIM_VA_SHIFT) + off;
}

static int is_device_va(const void *p)
{
    uint64_t v = (uint64_t)(uintptr_t)p;
    return v >= ACL_SIM_DEVICE_VA_BASE &&
           v < ACL_SIM_DEVICE_VA_BASE + ((uint64_t)SIM_MAX_DEVICES << SIM_VA_SHIFT);
}

static void deadline_after_ms(struct timespec *ts, long long ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)((ms % 1000) * 1000000L);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000L;
    }
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Seconds the device takes to move `bytes` between host and device memory (0: not modelled). */
static double modelled_seconds(uint64_t bytes)
{
    double gbps = copy_gbps();
    return gbps > 0.0 ? (double)bytes / (gbps * 1e9) : 0.0;
}

/* Called without g_mu: sleeps until `t0 + modelled`, so that a copy the host did faster than the
 * device would takes as long as the device's. A slower host copy is not shortened. */
static void pace_until(double t0, double modelled)
{
    double target = t0 + modelled;
    if (modelled <= 0.0 || mono_now() >= target) {
        return;
    }
    struct timespec ts;
    ts.tv_sec = (time_t)target;
    ts.tv_nsec = (long)((target - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec += 1;
        ts.tv_nsec -= 1000000000L;
    }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* g_mu held: remembers a backup or restore copy (aclsimGetLastCopy); total is filled in later. */
static void note_copy(int kind, int ndev, uint64_t bytes, double copy_s)
{
    g_last_copy.kind = kind;
    g_last_copy.devices = ndev;
    g_last_copy.bytes = bytes;
    g_last_copy.copySeconds = copy_s;
    g_last_copy.modelledSeconds = modelled_seconds(bytes);
    g_last_copy.totalSeconds = copy_s;
    g_last_copy.gbps = copy_gbps();
}

/* After pace_until: the copy's duration as the caller saw it. */
static void note_copy_total(double t0)
{
    pthread_mutex_lock(&g_mu);
    g_last_copy.totalSeconds = mono_now() - t0;
    pthread_mutex_unlock(&g_mu);
}

/* g_mu held. Blocks the calling thread while the process is locked (GLOBAL_STATE_WAIT_IF_LOCKED). */
static void wait_if_locked(const char *fn)
{
    if (g_state == ACL_SIM_STATE_RUNNING) {
        return;
    }
    sim_log(LOG_INFO, "%s wait until unlocked.", fn);
    g_blocked++;
    pthread_cond_broadcast(&g_cv);
    while (g_state != ACL_SIM_STATE_RUNNING) {
        pthread_cond_wait(&g_cv, &g_mu);
    }
    g_blocked--;
    sim_log(LOG_INFO, "%s wait finish.", fn);
}

/* g_mu held: the calling thread's current device, or -1. */
static int current_device(void)
{
    int d = t_cur_dev;
    if (d < 0 || d >= SIM_MAX_DEVICES || g_dev[d].refcount <= 0) {
        return -1;
    }
    return d;
}

/* ------------------------------------------------------------------ devices (g_mu held) */

static uint64_t device_extent(const sim_device_t *d)
{
    if (d->nallocs == 0) {
        return 0;
    }
    return d->allocs[d->nallocs - 1].off + d->allocs[d->nallocs - 1].size;
}

/* Maps `size` bytes of the device file shared, at a 2 MiB-aligned address, so that memory held in
 * 2 MiB pages is mapped 2 MiB at a time (one fault, not 512). MAP_FAILED on failure. */
static void *map_device(int fd, uint64_t size)
{
    size_t span = (size_t)size + (size_t)SIM_HUGE;
    void *reserve = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reserve == MAP_FAILED) {
        return MAP_FAILED;
    }
    uintptr_t lo = (uintptr_t)reserve;
    uintptr_t at = (lo + (uintptr_t)SIM_HUGE - 1) & ~((uintptr_t)SIM_HUGE - 1);
    void *p = mmap((void *)at, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        munmap(reserve, span);
        errno = e;
        return MAP_FAILED;
    }
    if (at > lo) {
        munmap(reserve, at - lo);
    }
    uintptr_t end = at + (uintptr_t)size;
    uintptr_t reserve_end = lo + span;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    end = (end + page - 1) & ~((uintptr_t)page - 1);
    if (reserve_end > end) {
        munmap((void *)end, reserve_end - end);
    }
    return p;
}

/* Allocates the device's memory once, as a device's HBM exists before any process uses it: every
 * page of the file (fallocate: on tmpfs, zeroed RAM), then, for PREALLOC_HUGE, gathered into
 * 2 MiB pages (MADV_COLLAPSE), as the runtime's allocator hands out huge pages first
 * (ACL_MEM_MALLOC_HUGE_FIRST). Where the filesystem or the kernel cannot, the file keeps what it
 * got (logged at level 2). Returns 0, or -1 with errno when the memory cannot be allocated. */
static int device_prealloc(int dev, int fd, uint64_t size, int mode)
{
    if (mode == PREALLOC_NONE || size == 0) {
        return 0;
    }
    double t0 = mono_now();
    if (fallocate(fd, 0, 0, (off_t)size) != 0) {
        if (errno == EOPNOTSUPP || errno == ENOSYS) {
            sim_log(LOG_INFO, "device %d: the filesystem cannot pre-allocate (%s); pages come on first use", dev,
                    strerror(errno));
            return 0;
        }
        return -1;
    }
    const char *huge = "not asked";
    if (mode == PREALLOC_HUGE) {
        void *p = map_device(fd, size);
        if (p == MAP_FAILED) {
            huge = "no (cannot map)";
        } else {
            huge = madvise(p, (size_t)size, MADV_COLLAPSE) == 0 ? "yes" : errno == EINVAL ? "no (not supported here)"
                                                                                           : "partly (memory fragmented)";
            munmap(p, (size_t)size);
        }
    }
    sim_log(LOG_INFO, "device %d: %llu bytes of device memory allocated in %.3f s (2 MiB pages: %s)", dev,
            (unsigned long long)size, mono_now() - t0, huge);
    return 0;
}

/* Opens/creates, flocks and maps the device file. min_size: the device must be at least this
 * large (restore of a backup). busy_code: returned when another process holds the device. */
static aclError device_open(int dev, uint64_t min_size, aclError busy_code, aclError fail_code)
{
    sim_device_t *d = &g_dev[dev];
    char path[4096];
    uint64_t size = device_mem_bytes();
    if (size < min_size) {
        sim_log(LOG_ERROR, "device %d has %llu bytes of memory, the backup needs %llu", dev,
                (unsigned long long)size, (unsigned long long)min_size);
        return fail_code;
    }
    if (device_path(dev, path, sizeof(path)) != 0 || mkdir_p(device_dir()) != 0) {
        sim_log(LOG_ERROR, "cannot create device directory %s: %s", device_dir(), strerror(errno));
        return fail_code;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        sim_log(LOG_ERROR, "cannot open device %d (%s): %s", dev, path, strerror(errno));
        return fail_code;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        if (e == EWOULDBLOCK) {
            sim_log(LOG_ERROR, "device %d is busy: %s is held by another process", dev, path);
            return busy_code;
        }
        sim_log(LOG_ERROR, "cannot lock device %d (%s): %s", dev, path, strerror(e));
        return fail_code;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || ((uint64_t)st.st_size != size && ftruncate(fd, (off_t)size) != 0)) {
        sim_log(LOG_ERROR, "cannot size device %d (%s): %s", dev, path, strerror(errno));
        close(fd);
        return fail_code;
    }
    /* First open of a new (or resized) device: its memory is allocated now, once. */
    if ((uint64_t)st.st_blocks * 512ULL < size && device_prealloc(dev, fd, size, prealloc_mode()) != 0) {
        sim_log(LOG_ERROR, "cannot allocate the %llu bytes of device %d (%s): %s", (unsigned long long)size, dev,
                path, strerror(errno));
        close(fd);
        return fail_code;
    }
    void *p = map_device(fd, size);
    if (p == MAP_FAILED) {
        sim_log(LOG_ERROR, "cannot map device %d (%s): %s", dev, path, strerror(errno));
        close(fd);
        return fail_code;
    }
    d->fd = fd;
    d->base = (unsigned char *)p;
    d->size = size;
    sim_log(LOG_INFO, "device %d opened: %s (%llu bytes)", dev, path, (unsigned long long)size);
    return ACL_SUCCESS;
}

static void device_close(sim_device_t *d)
{
    if (d->base != NULL) {
        munmap(d->base, (size_t)d->size);
        d->base = NULL;
    }
    if (d->fd >= 0) {
        close(d->fd); /* releases the flock */
        d->fd = -1;
    }
}

static void device_drop_saved(sim_device_t *d)
{
    free(d->saved);
    d->saved = NULL;
    d->saved_bytes = 0;
    d->has_saved = 0;
}

/* ------------------------------------------------------------------ the driver's side (g_mu held) */

#include "acl_sim_hal.h"

/* ------------------------------------------------------------------ API versions and the driver's features */

/* key=value from ${ACL_SIM_DEVICE_DIR}/driver.conf (the node's driver, written by aclsim_ctl.py driver). */
static long long driver_conf(const char *key, long long def)
{
    char path[4096], line[256];
    if (snprintf(path, sizeof(path), "%s/driver.conf", device_dir()) >= (int)sizeof(path)) {
        return def;
    }
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        return def;
    }
    long long v = def;
    size_t klen = strlen(key);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, key, klen) == 0 && line[klen] == '=') {
            v = strtoll(line + klen + 1, NULL, 10);
        }
    }
    fclose(f);
    return v;
}

static uint32_t runtime_api_version(void)
{
    return (uint32_t)env_ll("ACL_SIM_RUNTIME_API_VERSION", SIM_DEFAULT_RUNTIME_API, 0, 0x7fffffff);
}

/* The driver's libascend_hal.so, loaded once (sim_init) from ACL_SIM_DRIVER_DIR and mapped for the process's life,
 * as libruntime's dependency on it keeps it; NULL where the directory has none. */
static int (*g_hal_api)(int *);

static void driver_library_load(void)
{
    char path[4096];
    const char *dir = getenv("ACL_SIM_DRIVER_DIR");
    snprintf(path, sizeof(path), "%s/libascend_hal.so", dir != NULL && *dir != '\0' ? dir : SIM_DEFAULT_DRIVER_DIR);
    if (access(path, F_OK) != 0) {
        return;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    g_hal_api = lib != NULL ? (int (*)(int *))dlsym(lib, "halGetAPIVersion") : NULL;
    if (g_hal_api == NULL) {
        sim_log(LOG_ERROR, "the driver library %s cannot be loaded or has no halGetAPIVersion: %s", path, dlerror());
    }
}

/* halGetAPIVersion: the driver library's constant; without one, driver.conf's api_version (a host process of the
 * tests that is given no driver directory). */
static int driver_api_version(void)
{
    int v = 0;
    if (g_hal_api != NULL && g_hal_api(&v) == 0) {
        return v;
    }
    return (int)driver_conf("api_version", SIM_DEFAULT_DRIVER_API);
}

static __attribute__((unused)) int driver_has_snapshot_feature(void) /* unused in a legacy-API build */
{
    return driver_conf("snapshot_feature", 1) != 0;
}

static void device_release(int dev)
{
    sim_device_t *d = &g_dev[dev];
    device_close(d);
    hal_unbind(dev);
    device_drop_saved(d);
    free(d->allocs);
    d->allocs = NULL;
    d->nallocs = d->cap = 0;
    d->used = 0;
    d->refcount = 0;
}

/* Finds the device and host address of [p, p+len) inside one allocation. */
static aclError resolve_device_ptr(const void *p, uint64_t len, unsigned char **host, const char *fn)
{
    if (!is_device_va(p)) {
        sim_log(LOG_ERROR, "%s: %p is not a device pointer", fn, p);
        return ACL_ERROR_INVALID_PARAM;
    }
    uint64_t rel = (uint64_t)(uintptr_t)p - ACL_SIM_DEVICE_VA_BASE;
    int dev = (int)(rel >> SIM_VA_SHIFT);
    uint64_t off = rel & (SIM_VA_SPAN - 1);
    sim_device_t *d = &g_dev[dev];
    if (d->refcount <= 0) {
        sim_log(LOG_ERROR, "%s: %p belongs to device %d, which is not set", fn, p, dev);
        return ACL_ERROR_INVALID_PARAM;
    }
    for (size_t i = 0; i < d->nallocs; i++) {
        const sim_alloc_t *a = &d->allocs[i];
        if (off >= a->off && off < a->off + a->size) {
            if (len > a->off + a->size - off) {
                sim_log(LOG_ERROR, "%s: %p + %llu runs past its allocation (%llu bytes)", fn, p,
                        (unsigned long long)len, (unsigned long long)a->size);
                return ACL_ERROR_INVALID_PARAM;
            }
            if (d->base == NULL) {
                sim_log(LOG_ERROR, "%s: device %d memory is not mapped", fn, dev);
                return ACL_ERROR_RT_DEV_SETUP_ERROR;
            }
            *host = d->base + off;
            return ACL_SUCCESS;
        }
    }
    sim_log(LOG_ERROR, "%s: %p is not an allocated device address", fn, p);
    return ACL_ERROR_INVALID_PARAM;
}

/* Re-opens every device in use that is not mapped. copy: put the backup back (the time from the
 * first open to the last byte is noted for aclsimGetLastCopy; the caller paces it). host_close: the restore's
 * halDeviceClose first (acl_sim_hal.h), else the process goes on with the device files it holds. On failure the
 * devices opened by this call are closed again and the backups are kept. */
static aclError reopen_devices(int copy, int host_close, aclError busy_code, aclError fail_code)
{
    int opened[SIM_MAX_DEVICES];
    int nopened = 0;
    double t0 = mono_now();
    if ((host_close ? hal_host_close(fail_code) : hal_reattach(fail_code)) != ACL_SUCCESS) {
        return fail_code;
    }
    for (int dev = 0; dev < SIM_MAX_DEVICES; dev++) {
        sim_device_t *d = &g_dev[dev];
        if (d->refcount <= 0 || d->base != NULL) {
            continue;
        }
        aclError rc = device_open(dev, device_extent(d), busy_code, fail_code);
        if (rc != ACL_SUCCESS) {
            for (int i = 0; i < nopened; i++) {
                device_close(&g_dev[opened[i]]);
            }
            return rc;
        }
        opened[nopened++] = dev;
    }
    uint64_t total = 0;
    int ncopied = 0;
    for (int i = 0; i < nopened; i++) {
        sim_device_t *d = &g_dev[opened[i]];
        if (copy && d->has_saved) {
            uint64_t pos = 0;
            for (size_t k = 0; k < d->nallocs; k++) {
                memcpy(d->base + d->allocs[k].off, d->saved + pos, (size_t)d->allocs[k].size);
                pos += d->allocs[k].size;
            }
            total += d->saved_bytes;
            ncopied++;
            sim_log(LOG_EVENT, "device %d restored: %llu bytes copied back", opened[i],
                    (unsigned long long)d->saved_bytes);
        }
        device_drop_saved(d);
    }
    if (copy) {
        note_copy(COPY_RESTORE, ncopied, total, mono_now() - t0);
    }
    return ACL_SUCCESS;
}

/* Copies every allocation of every open device in use into process memory, then releases the
 * devices (munmap + close, which drops the flock). All or nothing. */
static aclError backup_devices(void)
{
    int copied[SIM_MAX_DEVICES];
    int ncopied = 0;
    uint64_t total = 0;
    uint64_t moved = 0; /* bytes this call copied off the devices */
    int ndev = 0;
    double t0 = mono_now();
    for (int dev = 0; dev < SIM_MAX_DEVICES; dev++) {
        sim_device_t *d = &g_dev[dev];
        if (d->refcount <= 0) {
            continue;
        }
        ndev++;
        if (d->base == NULL) {
            total += d->saved_bytes; /* already held in host memory */
            continue;
        }
        uint64_t bytes = 0;
        for (size_t k = 0; k < d->nallocs; k++) {
            bytes += d->allocs[k].size;
        }
        unsigned char *buf = malloc(bytes > 0 ? (size_t)bytes : 1);
        if (buf == NULL) {
            sim_log(LOG_ERROR, "backup: cannot allocate %llu bytes of host memory for device %d",
                    (unsigned long long)bytes, dev);
            for (int i = 0; i < ncopied; i++) {
                device_drop_saved(&g_dev[copied[i]]);
            }
            return ACL_ERROR_SNAPSHOT_BACKUP_FAILED;
        }
        uint64_t pos = 0;
        for (size_t k = 0; k < d->nallocs; k++) {
            memcpy(buf + pos, d->base + d->allocs[k].off, (size_t)d->allocs[k].size);
            pos += d->allocs[k].size;
        }
        d->saved = buf;
        d->saved_bytes = bytes;
        d->has_saved = 1;
        copied[ncopied++] = dev;
        total += bytes;
        moved += bytes;
    }
    for (int i = 0; i < ncopied; i++) {
        device_close(&g_dev[copied[i]]);
    }
    note_copy(COPY_BACKUP, ncopied, moved, mono_now() - t0);
    g_backup_bytes = total;
    sim_log(LOG_EVENT, "backup: %llu bytes of %d device(s) copied to host memory",
            (unsigned long long)total, ndev);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------------------ callbacks */

static aclError invoke_callbacks(aclrtSnapShotStage stage)
{
    sim_cb_t list[SIM_MAX_CALLBACKS];
    size_t n;
    pthread_mutex_lock(&g_cb_mu);
    n = g_ncbs[stage];
    memcpy(list, g_cbs[stage], n * sizeof(sim_cb_t));
    pthread_mutex_unlock(&g_cb_mu);
    if (n == 0) {
        return ACL_SUCCESS;
    }
    int devs[SIM_MAX_DEVICES];
    int ndevs = 0;
    pthread_mutex_lock(&g_mu);
    for (int dev = 0; dev < SIM_MAX_DEVICES; dev++) {
        if (g_dev[dev].refcount > 0) {
            devs[ndevs++] = dev;
        }
    }
    pthread_mutex_unlock(&g_mu);
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < ndevs; k++) {
            uint32_t r = list[i].cb((int32_t)devs[k], list[i].args);
            if (r != 0) {
                sim_log(LOG_ERROR,
                        "snapshot call back func execution failed, devId=%d, stage:%s, error=%#x",
                        devs[k], g_stage_names[stage], r);
                return ACL_ERROR_SNAPSHOT_CALLBACK_FAILED;
            }
        }
    }
    return ACL_SUCCESS;
}

/* ------------------------------------------------------------------ snapshot API */

/* args of Backup/Restore: NULL (the older flow) or, in the args shape, flags 0 or 1 and a driver with the
 * snapshot feature. *with_args is set when the args flow applies. */
static aclError check_snapshot_args(const char *fn, const void *args, uint32_t flags, int *with_args)
{
    *with_args = 0;
    if (args == NULL) {
        return ACL_SUCCESS;
    }
#ifdef ACL_SIM_LEGACY_SNAPSHOT_API
    (void)flags;
    sim_log(LOG_ERROR, "%s: args is a reserved parameter and must be nullptr", fn);
    return ACL_ERROR_INVALID_PARAM;
#else
    if (flags > ACL_SNAPSHOT_FLAGS_REQUIRED_AND_OPTIONAL) {
        sim_log(LOG_ERROR, "%s: invalid flags %u: 0 (required) or 1 (required and optional)", fn, flags);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (!driver_has_snapshot_feature()) {
        sim_log(LOG_ERROR, "%s: the driver does not support FEATURE_SVM_PROCESS_DEVICE_MEM_SNAPSHOT", fn);
        return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
    }
    *with_args = 1;
    return ACL_SUCCESS;
#endif
}

static aclError check_pid_and_reserved(const char *fn, int pid, const void *reserved, const char *what)
{
    if (pid != (int)getpid()) {
        sim_log(LOG_ERROR,
                "%s: invalid pid %d: pid must be current process pid, cross-process operation is "
                "not supported",
                fn, pid);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (reserved != NULL) {
        sim_log(LOG_ERROR, "%s: %s is a reserved parameter and must be nullptr", fn, what);
        return ACL_ERROR_INVALID_PARAM;
    }
    return ACL_SUCCESS;
}

static aclError snap_enter(const char *fn, aclError fail_code)
{
    if (t_in_snapshot) {
        sim_log(LOG_ERROR, "%s called from a snapshot callback: re-entrant snapshot calls are not "
                           "supported", fn);
        return fail_code;
    }
    pthread_mutex_lock(&g_snap_mu);
    t_in_snapshot = 1;
    return ACL_SUCCESS;
}

static void snap_leave(void)
{
    t_in_snapshot = 0;
    pthread_mutex_unlock(&g_snap_mu);
}

ACL_FUNC_VISIBILITY aclError aclrtSnapShotProcessLock(int pid, void *reserve)
{
    aclError rc = check_pid_and_reserved(__func__, pid, reserve, "reserve");
    if (rc != ACL_SUCCESS || (rc = snap_enter(__func__, ACL_ERROR_SNAPSHOT_LOCK_FAILED)) != ACL_SUCCESS) {
        return rc;
    }
    rc = invoke_callbacks(ACL_RT_SNAPSHOT_LOCK_PRE);
    if (rc == ACL_SUCCESS) {
        pthread_mutex_lock(&g_mu);
        if (g_state != ACL_SIM_STATE_RUNNING) {
            sim_log(LOG_ERROR, "current state is not the running state, current state is %s",
                    state_name(g_state));
            rc = ACL_ERROR_SNAPSHOT_LOCK_FAILED;
        } else {
            g_state = ACL_SIM_STATE_LOCKED;
            pthread_cond_broadcast(&g_cv);
            struct timespec deadline;
            deadline_after_ms(&deadline, lock_timeout_ms());
            while (g_bg_parked < g_bg_registered) {
                if (g_state != ACL_SIM_STATE_LOCKED) {
                    sim_log(LOG_ERROR, "State changed during background thread waiting, now state is %s",
                            state_name(g_state));
                    rc = ACL_ERROR_SNAPSHOT_LOCK_FAILED;
                    break;
                }
                int w = pthread_cond_timedwait(&g_cv, &g_mu, &deadline);
                if (w == ETIMEDOUT && g_bg_parked < g_bg_registered) {
                    sim_log(LOG_ERROR, "Timeout: only %u/%u background threads locked", g_bg_parked,
                            g_bg_registered);
                    rc = ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT;
                    break;
                }
            }
            if (rc != ACL_SUCCESS) {
                g_state = ACL_SIM_STATE_RUNNING;
                pthread_cond_broadcast(&g_cv); /* wake every blocked thread */
            } else {
                sim_log(LOG_EVENT, "locked success.");
            }
        }
        pthread_mutex_unlock(&g_mu);
    }
    snap_leave();
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtSnapShotProcessUnlock(int pid, void *reserve)
{
    aclError rc = check_pid_and_reserved(__func__, pid, reserve, "reserve");
    if (rc != ACL_SUCCESS || (rc = snap_enter(__func__, ACL_ERROR_SNAPSHOT_UNLOCK_FAILED)) != ACL_SUCCESS) {
        return rc;
    }
    pthread_mutex_lock(&g_mu);
    if (g_state != ACL_SIM_STATE_LOCKED && g_state != ACL_SIM_STATE_BACKED_UP) {
        sim_log(LOG_ERROR, "current state is not the LOCKED or BACKED_UP state, current state is %s",
                state_name(g_state));
        rc = ACL_ERROR_SNAPSHOT_UNLOCK_FAILED;
    } else {
        /* Unlock without restore: the devices come back as they are now (no copy). */
        rc = reopen_devices(0, 0, ACL_ERROR_SNAPSHOT_UNLOCK_FAILED, ACL_ERROR_SNAPSHOT_UNLOCK_FAILED);
        if (rc != ACL_SUCCESS) {
            sim_log(LOG_ERROR, "unlock: cannot re-open the devices; state stays %s", state_name(g_state));
        } else {
            g_state = ACL_SIM_STATE_RUNNING;
            pthread_cond_broadcast(&g_cv);
            struct timespec deadline;
            deadline_after_ms(&deadline, lock_timeout_ms());
            while (g_bg_parked != 0 && g_state == ACL_SIM_STATE_RUNNING) {
                if (pthread_cond_timedwait(&g_cv, &g_mu, &deadline) == ETIMEDOUT && g_bg_parked != 0) {
                    sim_log(LOG_ERROR, "There are still %u threads in the locked state.", g_bg_parked);
                    rc = ACL_ERROR_SNAPSHOT_UNLOCK_FAILED;
                    break;
                }
            }
            if (rc == ACL_SUCCESS) {
                sim_log(LOG_EVENT, "unlocked success.");
            }
        }
    }
    pthread_mutex_unlock(&g_mu);
    if (rc == ACL_SUCCESS) {
        rc = invoke_callbacks(ACL_RT_SNAPSHOT_UNLOCK_POST);
    }
    snap_leave();
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtSnapShotProcessBackup(int pid, aclrtSnapShotBackupArgs *args)
{
    int with_args = 0;
#ifdef ACL_SIM_LEGACY_SNAPSHOT_API
    uint32_t flags = 0;
#else
    uint32_t flags = args != NULL ? args->backupFlags : 0;
#endif
    aclError rc = check_pid_and_reserved(__func__, pid, NULL, "args");
    if (rc == ACL_SUCCESS) {
        rc = check_snapshot_args(__func__, args, flags, &with_args);
    }
    if (rc != ACL_SUCCESS || (rc = snap_enter(__func__, ACL_ERROR_SNAPSHOT_BACKUP_FAILED)) != ACL_SUCCESS) {
        return rc;
    }
    pthread_mutex_lock(&g_mu);
    if (g_state != ACL_SIM_STATE_LOCKED) {
        sim_log(LOG_ERROR, "current state is not the locked state, current state is %s", state_name(g_state));
        rc = ACL_ERROR_SNAPSHOT_BACKUP_FAILED;
    }
    pthread_mutex_unlock(&g_mu);
    if (rc == ACL_SUCCESS) {
        rc = invoke_callbacks(ACL_RT_SNAPSHOT_BACKUP_PRE);
    }
    if (rc == ACL_SUCCESS) {
        pthread_mutex_lock(&g_mu);
        double t0 = mono_now();
        rc = backup_devices();
        double modelled = g_last_copy.modelledSeconds;
        pthread_mutex_unlock(&g_mu);
        if (rc == ACL_SUCCESS) {
            pace_until(t0, modelled); /* the device's DMA into host memory */
            note_copy_total(t0);
            rc = invoke_callbacks(ACL_RT_SNAPSHOT_BACKUP_POST);
            pthread_mutex_lock(&g_mu);
            if (rc == ACL_SUCCESS) {
                g_state = ACL_SIM_STATE_BACKED_UP;
                /* the args flow records the versions the restore must find again */
                g_backup_info.has = with_args;
                g_backup_info.runtime_api = runtime_api_version();
                g_backup_info.driver_api = driver_api_version();
                g_backup_info.flags = flags;
            } else if (reopen_devices(1, 0, ACL_ERROR_SNAPSHOT_BACKUP_FAILED, ACL_ERROR_SNAPSHOT_BACKUP_FAILED) !=
                       ACL_SUCCESS) {
                sim_log(LOG_ERROR, "backup: could not put the device memory back after the failed "
                                   "BACKUP_POST callback; it stays in host memory");
            }
            pthread_mutex_unlock(&g_mu);
        }
    }
    snap_leave();
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtSnapShotProcessRestore(int pid, aclrtSnapShotRestoreArgs *args)
{
    int with_args = 0;
#ifdef ACL_SIM_LEGACY_SNAPSHOT_API
    uint32_t flags = 0;
#else
    uint32_t flags = args != NULL ? args->restoreFlags : 0;
#endif
    aclError rc = check_pid_and_reserved(__func__, pid, NULL, "args");
    if (rc == ACL_SUCCESS) {
        rc = check_snapshot_args(__func__, args, flags, &with_args);
    }
    if (rc != ACL_SUCCESS || (rc = snap_enter(__func__, ACL_ERROR_SNAPSHOT_RESTORE_FAILED)) != ACL_SUCCESS) {
        return rc;
    }
    pthread_mutex_lock(&g_mu);
    if (g_state != ACL_SIM_STATE_BACKED_UP) {
        sim_log(LOG_ERROR, "current state is not the BACKED_UP state, current state is %s",
                state_name(g_state));
        rc = ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    } else if (with_args && !g_backup_info.has) {
        sim_log(LOG_ERROR, "restore with args: the backup recorded no version information (it was taken "
                           "without args)");
        rc = ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    } else if (with_args && (g_backup_info.runtime_api != runtime_api_version() ||
                             g_backup_info.driver_api != driver_api_version())) {
        sim_log(LOG_ERROR, "restore with args: version mismatch: backed up with runtime API %u and driver API %d, "
                "this node has runtime API %u and driver API %d", g_backup_info.runtime_api,
                g_backup_info.driver_api, runtime_api_version(), driver_api_version());
        rc = ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    }
    pthread_mutex_unlock(&g_mu);
    if (rc == ACL_SUCCESS) {
        rc = invoke_callbacks(ACL_RT_SNAPSHOT_RESTORE_PRE);
    }
    if (rc == ACL_SUCCESS) {
        pthread_mutex_lock(&g_mu);
        sim_log(LOG_EVENT, "start to restore resource");
        double t0 = mono_now();
        rc = reopen_devices(1, 1, ACL_ERROR_SNAPSHOT_RESTORE_FAILED, ACL_ERROR_SNAPSHOT_RESTORE_FAILED);
        double modelled = g_last_copy.modelledSeconds;
        pthread_mutex_unlock(&g_mu);
        if (rc == ACL_SUCCESS) {
            pace_until(t0, modelled); /* the device's DMA from host memory */
            note_copy_total(t0);
            pthread_mutex_lock(&g_mu);
            sim_log(LOG_EVENT, "restore copy: %llu bytes in %.3f s (host copy %.3f s, modelled %.3f s at %g GB/s)",
                    (unsigned long long)g_last_copy.bytes, g_last_copy.totalSeconds, g_last_copy.copySeconds,
                    g_last_copy.modelledSeconds, g_last_copy.gbps);
            pthread_mutex_unlock(&g_mu);
            sim_log(LOG_EVENT, "the resource is restored successfully");
            rc = invoke_callbacks(ACL_RT_SNAPSHOT_RESTORE_POST);
        }
        if (rc == ACL_SUCCESS) {
            pthread_mutex_lock(&g_mu);
            g_state = ACL_SIM_STATE_LOCKED;
            pthread_mutex_unlock(&g_mu);
        }
    }
    snap_leave();
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtSnapShotCallbackRegister(aclrtSnapShotStage stage, aclrtSnapShotCallBack callback,
                                                           void *args)
{
    if ((int)stage < 0 || (int)stage >= SIM_STAGES) {
        sim_log(LOG_ERROR, "aclrtSnapShotCallbackRegister: invalid stage %d, valid range [0, 5]", (int)stage);
        return ACL_ERROR_SNAPSHOT_REGISTER_CALLBACK_FAILED;
    }
    if (callback == NULL) {
        sim_log(LOG_ERROR, "aclrtSnapShotCallbackRegister: callback is NULL");
        return ACL_ERROR_SNAPSHOT_REGISTER_CALLBACK_FAILED;
    }
    aclError rc = ACL_SUCCESS;
    pthread_mutex_lock(&g_cb_mu);
    for (size_t i = 0; i < g_ncbs[stage]; i++) {
        if (g_cbs[stage][i].cb == callback) {
            sim_log(LOG_ERROR, "Callback function %p has been registered in the %s phase.",
                    (void *)(uintptr_t)callback, g_stage_names[stage]);
            rc = ACL_ERROR_SNAPSHOT_REGISTER_CALLBACK_FAILED;
            break;
        }
    }
    if (rc == ACL_SUCCESS && g_ncbs[stage] >= SIM_MAX_CALLBACKS) {
        sim_log(LOG_ERROR, "too many callbacks registered in the %s phase", g_stage_names[stage]);
        rc = ACL_ERROR_SNAPSHOT_REGISTER_CALLBACK_FAILED;
    }
    if (rc == ACL_SUCCESS) {
        g_cbs[stage][g_ncbs[stage]].cb = callback;
        g_cbs[stage][g_ncbs[stage]].args = args;
        g_ncbs[stage]++;
        sim_log(LOG_EVENT, "register snapshot callback finish, stage:%s", g_stage_names[stage]);
    }
    pthread_mutex_unlock(&g_cb_mu);
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtSnapShotCallbackUnregister(aclrtSnapShotStage stage, aclrtSnapShotCallBack callback)
{
    if ((int)stage < 0 || (int)stage >= SIM_STAGES || callback == NULL) {
        sim_log(LOG_ERROR, "aclrtSnapShotCallbackUnregister: invalid stage %d or NULL callback", (int)stage);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    aclError rc = ACL_ERROR_RT_PARAM_INVALID;
    pthread_mutex_lock(&g_cb_mu);
    for (size_t i = 0; i < g_ncbs[stage]; i++) {
        if (g_cbs[stage][i].cb == callback) {
            memmove(&g_cbs[stage][i], &g_cbs[stage][i + 1], (g_ncbs[stage] - i - 1) * sizeof(sim_cb_t));
            g_ncbs[stage]--;
            rc = ACL_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&g_cb_mu);
    if (rc != ACL_SUCCESS) {
        sim_log(LOG_ERROR, "Callback function %p has not been registered in the %s phase.",
                (void *)(uintptr_t)callback, g_stage_names[stage]);
    }
    return rc;
}

#ifndef ACL_SIM_LEGACY_SNAPSHOT_API
ACL_FUNC_VISIBILITY aclError rtSnapShotProcessBackupWithArgs(int pid, aclrtSnapShotBackupArgs *args)
{
    return aclrtSnapShotProcessBackup(pid, args);
}

ACL_FUNC_VISIBILITY aclError rtSnapShotProcessRestoreWithArgs(int pid, aclrtSnapShotRestoreArgs *args)
{
    return aclrtSnapShotProcessRestore(pid, args);
}
#endif

ACL_FUNC_VISIBILITY aclError rtGetRuntimeVersion(uint32_t *runtimeVersion)
{
    if (runtimeVersion == NULL) {
        return ACL_ERROR_INVALID_PARAM;
    }
    *runtimeVersion = runtime_api_version();
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY int halGetAPIVersion(int *apiVersion)
{
    if (apiVersion == NULL) {
        return ACL_ERROR_INVALID_PARAM;
    }
    *apiVersion = driver_api_version();
    return 0;
}

/* ------------------------------------------------------------------ ordinary ACL calls */

ACL_FUNC_VISIBILITY aclError aclInit(const char *configPath)
{
    if (configPath != NULL && *configPath != '\0' && access(configPath, R_OK) != 0) {
        sim_log(LOG_ERROR, "aclInit: cannot read config file %s: %s", configPath, strerror(errno));
        return ACL_ERROR_INVALID_FILE;
    }
    aclError rc = ACL_SUCCESS;
    pthread_mutex_lock(&g_mu);
    if (g_inited) {
        sim_log(LOG_ERROR, "aclInit: repeated initialization");
        rc = ACL_ERROR_REPEAT_INITIALIZE;
    } else {
        g_inited = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclFinalize(void)
{
    aclError rc = ACL_SUCCESS;
    pthread_mutex_lock(&g_mu);
    wait_if_locked(__func__);
    if (!g_inited) {
        sim_log(LOG_ERROR, "aclFinalize: not initialized");
        rc = ACL_ERROR_REPEAT_FINALIZE;
    } else {
        for (int dev = 0; dev < SIM_MAX_DEVICES; dev++) {
            if (g_dev[dev].refcount > 0) {
                device_release(dev);
            }
        }
        t_cur_dev = -1;
        g_inited = 0;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtSetDevice(int32_t deviceId)
{
    if (deviceId < 0 || deviceId >= device_count()) {
        sim_log(LOG_ERROR, "aclrtSetDevice: invalid device id %d (device count %d)", deviceId, device_count());
        return ACL_ERROR_RT_INVALID_DEVICEID;
    }
    aclError rc = ACL_SUCCESS;
    pthread_mutex_lock(&g_mu);
    wait_if_locked(__func__);
    sim_device_t *d = &g_dev[deviceId];
    rc = hal_bind(deviceId, ACL_ERROR_RT_DEV_SETUP_ERROR);
    if (rc == ACL_SUCCESS && d->base == NULL) {
        rc = device_open(deviceId, device_extent(d), ACL_ERROR_RT_DEV_SETUP_ERROR, ACL_ERROR_RT_DEV_SETUP_ERROR);
        if (rc == ACL_SUCCESS) {
            device_drop_saved(d);
        }
    }
    if (rc != ACL_SUCCESS && d->refcount == 0) {
        hal_unbind(deviceId);
    }
    if (rc == ACL_SUCCESS) {
        d->refcount++;
        t_cur_dev = deviceId;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtResetDevice(int32_t deviceId)
{
    if (deviceId < 0 || deviceId >= device_count()) {
        sim_log(LOG_ERROR, "aclrtResetDevice: invalid device id %d", deviceId);
        return ACL_ERROR_RT_INVALID_DEVICEID;
    }
    aclError rc = ACL_SUCCESS;
    pthread_mutex_lock(&g_mu);
    wait_if_locked(__func__);
    sim_device_t *d = &g_dev[deviceId];
    if (d->refcount <= 0) {
        sim_log(LOG_ERROR, "aclrtResetDevice: device %d is not set in this process", deviceId);
        rc = ACL_ERROR_INVALID_PARAM;
    } else {
        d->refcount--;
        if (d->refcount == 0) {
            device_release(deviceId);
        }
        if (t_cur_dev == deviceId) {
            t_cur_dev = -1;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtGetDevice(int32_t *deviceId)
{
    if (deviceId == NULL) {
        return ACL_ERROR_INVALID_PARAM;
    }
    pthread_mutex_lock(&g_mu);
    int dev = current_device();
    pthread_mutex_unlock(&g_mu);
    if (dev < 0) {
        sim_log(LOG_ERROR, "aclrtGetDevice: no current device in this thread (call aclrtSetDevice)");
        return ACL_ERROR_RT_CONTEXT_NULL;
    }
    *deviceId = dev;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtGetDeviceCount(uint32_t *count)
{
    if (count == NULL) {
        return ACL_ERROR_INVALID_PARAM;
    }
    *count = (uint32_t)device_count();
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    (void)policy;
    if (devPtr == NULL || size == 0) {
        sim_log(LOG_ERROR, "aclrtMalloc: devPtr must not be NULL and size must be > 0");
        return ACL_ERROR_INVALID_PARAM;
    }
    aclError rc = ACL_SUCCESS;
    pthread_mutex_lock(&g_mu);
    wait_if_locked(__func__);
    int dev = current_device();
    if (dev < 0) {
        sim_log(LOG_ERROR, "aclrtMalloc: no current device in this thread (call aclrtSetDevice)");
        rc = ACL_ERROR_RT_CONTEXT_NULL;
        goto out;
    }
    sim_device_t *d = &g_dev[dev];
    if (d->base == NULL) {
        sim_log(LOG_ERROR, "aclrtMalloc: device %d memory is not mapped", dev);
        rc = ACL_ERROR_RT_DEV_SETUP_ERROR;
        goto out;
    }
    uint64_t asize = ((uint64_t)size + SIM_ALIGN - 1) & ~(SIM_ALIGN - 1);
    if (asize < (uint64_t)size || asize > d->size) {
        rc = ACL_ERROR_RT_MEMORY_ALLOCATION;
    } else {
        uint64_t prev_end = 0;
        size_t at = d->nallocs;
        int found = 0;
        for (size_t i = 0; i < d->nallocs; i++) {
            if (d->allocs[i].off - prev_end >= asize) {
                at = i;
                found = 1;
                break;
            }
            prev_end = d->allocs[i].off + d->allocs[i].size;
        }
        if (!found && d->size - prev_end >= asize) {
            at = d->nallocs;
            found = 1;
        }
        if (!found) {
            rc = ACL_ERROR_RT_MEMORY_ALLOCATION;
        } else {
            if (d->nallocs == d->cap) {
                size_t ncap = d->cap ? d->cap * 2 : 16;
                sim_alloc_t *na = realloc(d->allocs, ncap * sizeof(sim_alloc_t));
                if (na == NULL) {
                    rc = ACL_ERROR_RT_MEMORY_ALLOCATION;
                    goto out;
                }
                d->allocs = na;
                d->cap = ncap;
            }
            memmove(&d->allocs[at + 1], &d->allocs[at], (d->nallocs - at) * sizeof(sim_alloc_t));
            d->allocs[at].off = prev_end;
            d->allocs[at].size = asize;
            d->nallocs++;
            d->used += asize;
            *devPtr = (void *)(uintptr_t)va_of(dev, prev_end);
        }
    }
    if (rc == ACL_ERROR_RT_MEMORY_ALLOCATION) {
        sim_log(LOG_ERROR, "aclrtMalloc: out of device memory on device %d: %zu bytes requested, %llu free",
                dev, size, (unsigned long long)(d->size - d->used));
    }
out:
    pthread_mutex_unlock(&g_mu);
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtFree(void *devPtr)
{
    if (devPtr == NULL) {
        return ACL_ERROR_INVALID_PARAM;
    }
    aclError rc = ACL_ERROR_INVALID_PARAM;
    pthread_mutex_lock(&g_mu);
    wait_if_locked(__func__);
    if (is_device_va(devPtr)) {
        uint64_t rel = (uint64_t)(uintptr_t)devPtr - ACL_SIM_DEVICE_VA_BASE;
        sim_device_t *d = &g_dev[rel >> SIM_VA_SHIFT];
        uint64_t off = rel & (SIM_VA_SPAN - 1);
        for (size_t i = 0; d->refcount > 0 && i < d->nallocs; i++) {
            if (d->allocs[i].off == off) {
                d->used -= d->allocs[i].size;
                memmove(&d->allocs[i], &d->allocs[i + 1], (d->nallocs - i - 1) * sizeof(sim_alloc_t));
                d->nallocs--;
                rc = ACL_SUCCESS;
                break;
            }
        }
    }
    if (rc != ACL_SUCCESS) {
        sim_log(LOG_ERROR, "aclrtFree: %p is not the start of a device allocation", devPtr);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
                                         aclrtMemcpyKind kind)
{
    if (dst == NULL || src == NULL) {
        sim_log(LOG_ERROR, "aclrtMemcpy: dst and src must not be NULL");
        return ACL_ERROR_INVALID_PARAM;
    }
    if (count > destMax) {
        sim_log(LOG_ERROR, "aclrtMemcpy: count %zu exceeds destMax %zu", count, destMax);
        return ACL_ERROR_INVALID_PARAM;
    }
    if ((int)kind < ACL_MEMCPY_HOST_TO_HOST || (int)kind > ACL_MEMCPY_DEVICE_TO_DEVICE) {
        sim_log(LOG_ERROR, "aclrtMemcpy: invalid kind %d", (int)kind);
        return ACL_ERROR_INVALID_PARAM;
    }
    aclError rc = ACL_SUCCESS;
    unsigned char *hd = NULL;
    unsigned char *hs = NULL;
    double t0 = 0.0;
    pthread_mutex_lock(&g_mu);
    wait_if_locked(__func__);
    if (kind != ACL_MEMCPY_HOST_TO_HOST && current_device() < 0) {
        sim_log(LOG_ERROR, "aclrtMemcpy: no current device in this thread (call aclrtSetDevice)");
        rc = ACL_ERROR_RT_CONTEXT_NULL;
        goto out;
    }
    if (kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_DEVICE_TO_DEVICE) {
        rc = resolve_device_ptr(dst, count, &hd, "aclrtMemcpy(dst)");
    } else if (is_device_va(dst)) {
        sim_log(LOG_ERROR, "aclrtMemcpy: dst %p is a device pointer but kind %d copies to host", dst, (int)kind);
        rc = ACL_ERROR_INVALID_PARAM;
    } else {
        hd = dst;
    }
    if (rc != ACL_SUCCESS) {
        goto out;
    }
    if (kind == ACL_MEMCPY_DEVICE_TO_HOST || kind == ACL_MEMCPY_DEVICE_TO_DEVICE) {
        rc = resolve_device_ptr(src, count, &hs, "aclrtMemcpy(src)");
    } else if (is_device_va(src)) {
        sim_log(LOG_ERROR, "aclrtMemcpy: src %p is a device pointer but kind %d copies from host", src, (int)kind);
        rc = ACL_ERROR_INVALID_PARAM;
    } else {
        hs = (unsigned char *)(uintptr_t)src;
    }
    t0 = mono_now();
    if (rc == ACL_SUCCESS && count > 0) {
        memmove(hd, hs, count);
    }
out:
    pthread_mutex_unlock(&g_mu);
    if (rc == ACL_SUCCESS && (kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_DEVICE_TO_HOST)) {
        pace_until(t0, modelled_seconds(count)); /* over the device's link, as the DMA would */
    }
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total)
{
    if (free == NULL || total == NULL || (int)attr < ACL_DDR_MEM || (int)attr > ACL_HBM_MEM_P2P_NORMAL) {
        return ACL_ERROR_INVALID_PARAM;
    }
    aclError rc = ACL_SUCCESS;
    pthread_mutex_lock(&g_mu);
    int dev = current_device();
    if (dev < 0) {
        sim_log(LOG_ERROR, "aclrtGetMemInfo: no current device in this thread (call aclrtSetDevice)");
        rc = ACL_ERROR_RT_CONTEXT_NULL;
    } else {
        *total = (size_t)g_dev[dev].size;
        *free = (size_t)(g_dev[dev].size - g_dev[dev].used);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion, int32_t *patchVersion)
{
    if (majorVersion == NULL || minorVersion == NULL || patchVersion == NULL) {
        return ACL_ERROR_INVALID_PARAM;
    }
    const char *v = getenv("ACL_SIM_VERSION");
    int ma = 9, mi = 1, pa = 0;
    if (v != NULL && *v != '\0') {
        ma = mi = pa = 0;
        if (sscanf(v, "%d.%d.%d", &ma, &mi, &pa) < 1) {
            ma = mi = pa = 0;
        }
    }
    *majorVersion = ma;
    *minorVersion = mi;
    *patchVersion = pa;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtSynchronizeDevice(void)
{
    pthread_mutex_lock(&g_mu);
    int dev = current_device();
    pthread_mutex_unlock(&g_mu);
    if (dev < 0) {
        sim_log(LOG_ERROR, "aclrtSynchronizeDevice: no current device in this thread (call aclrtSetDevice)");
        return ACL_ERROR_RT_CONTEXT_NULL;
    }
    return ACL_SUCCESS; /* no asynchronous work in the simulator */
}

/* ------------------------------------------------------------------ simulator-only */

ACL_FUNC_VISIBILITY void aclsimBackgroundThreadRegister(const char *name)
{
    pthread_mutex_lock(&g_mu);
    g_bg_registered++;
    sim_log(LOG_INFO, "%s thread needs to be locked. Total:%u.", name ? name : "?", g_bg_registered);
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

ACL_FUNC_VISIBILITY void aclsimBackgroundThreadUnregister(const char *name)
{
    pthread_mutex_lock(&g_mu);
    if (g_bg_registered > 0) {
        g_bg_registered--;
    } else {
        sim_log(LOG_ERROR, "%s: unregistering a background thread that was not registered", name ? name : "?");
    }
    sim_log(LOG_INFO, "%s thread does not need to be locked. Total:%u", name ? name : "?", g_bg_registered);
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

ACL_FUNC_VISIBILITY void aclsimBackgroundThreadWaitIfLocked(const char *name)
{
    pthread_mutex_lock(&g_mu);
    if (g_state != ACL_SIM_STATE_RUNNING) {
        sim_log(LOG_INFO, "%s background thread wait until unlocked.", name ? name : "?");
        g_bg_parked++;
        pthread_cond_broadcast(&g_cv);
        while (g_state != ACL_SIM_STATE_RUNNING) {
            pthread_cond_wait(&g_cv, &g_mu);
        }
        g_bg_parked--;
        pthread_cond_broadcast(&g_cv);
        sim_log(LOG_INFO, "%s background thread wait finish.", name ? name : "?");
    }
    pthread_mutex_unlock(&g_mu);
}

ACL_FUNC_VISIBILITY aclError aclsimDeviceReset(int32_t deviceId)
{
    char path[4096];
    char fresh[4200];
    if (deviceId < 0 || deviceId >= SIM_MAX_DEVICES) {
        return ACL_ERROR_RT_INVALID_DEVICEID;
    }
    if (device_path(deviceId, path, sizeof(path)) != 0) {
        return ACL_ERROR_INVALID_PARAM;
    }
    struct stat st;
    int existed = stat(path, &st) == 0;
    if (unlink(path) != 0 && errno != ENOENT) {
        sim_log(LOG_ERROR, "aclsimDeviceReset: cannot remove %s: %s", path, strerror(errno));
        return ACL_ERROR_RT_DRV_INTERNAL_ERROR;
    }
    int mode = prealloc_mode();
    if (!existed || st.st_size <= 0 || mode == PREALLOC_NONE) {
        sim_log(LOG_EVENT, "device %d reset: %s removed", deviceId, path);
        return ACL_SUCCESS;
    }
    /* The memory is wiped, the device stays: a new zeroed file of the same size, allocated now
     * (not by the restore that comes next), put in place only once complete. */
    snprintf(fresh, sizeof(fresh), "%s/.device%d.reset.%d", device_dir(), (int)deviceId, (int)getpid());
    int fd = open(fresh, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int ok = fd >= 0 && ftruncate(fd, st.st_size) == 0 && device_prealloc(deviceId, fd, (uint64_t)st.st_size, mode) == 0;
    if (fd >= 0) {
        close(fd);
    }
    if (ok && link(fresh, path) != 0 && errno != EEXIST) { /* EEXIST: a process created a fresh one meanwhile */
        ok = 0;
    }
    unlink(fresh);
    sim_log(LOG_EVENT, "device %d reset: %s wiped%s", deviceId, path,
            ok ? " (zeroed, its memory allocated again)" : " (removed; the next open creates it)");
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclsimGetLastCopy(aclsimCopyStats *stats)
{
    if (stats == NULL) {
        return ACL_ERROR_INVALID_PARAM;
    }
    pthread_mutex_lock(&g_mu);
    *stats = g_last_copy;
    pthread_mutex_unlock(&g_mu);
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY int aclsimGetState(void)
{
    pthread_mutex_lock(&g_mu);
    int s = g_state;
    pthread_mutex_unlock(&g_mu);
    return s;
}

ACL_FUNC_VISIBILITY uint64_t aclsimGetBackupBytes(void)
{
    pthread_mutex_lock(&g_mu);
    uint64_t b = g_backup_bytes;
    pthread_mutex_unlock(&g_mu);
    return b;
}

ACL_FUNC_VISIBILITY uint32_t aclsimGetBlockedThreadCount(void)
{
    pthread_mutex_lock(&g_mu);
    uint32_t n = g_blocked;
    pthread_mutex_unlock(&g_mu);
    return n;
}

/* ------------------------------------------------------------------ process lifetime */

/* Like GlobalStateManager::ForceUnlocked at exit: wake every thread blocked on the lock. */
static void sim_force_unlock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    int locked = pthread_mutex_timedlock(&g_mu, &ts) == 0;
    if (g_state != ACL_SIM_STATE_RUNNING) {
        sim_log(LOG_WARN, "process exit: forcing state transition from %s to RUNNING", state_name(g_state));
        g_state = ACL_SIM_STATE_RUNNING;
        pthread_cond_broadcast(&g_cv);
    }
    if (locked) {
        pthread_mutex_unlock(&g_mu);
    }
}

__attribute__((constructor)) static void sim_init(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g_cv, &attr);
    pthread_condattr_destroy(&attr);
    for (int i = 0; i < SIM_MAX_DEVICES; i++) {
        g_dev[i].fd = -1;
    }
    hal_init();
    driver_library_load();
    atexit(sim_force_unlock);
}
