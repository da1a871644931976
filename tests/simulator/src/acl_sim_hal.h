/*
 * acl_sim_hal.h - the simulator's driver side (the HAL, ascend_hal): the device files a process holds while it uses
 * NPUs, and through a backup, as a real Ascend process holds them. Included by acl_sim.c only, where its device
 * nodes section was (one translation unit; every function here runs with g_mu held).
 *
 * What CANN's driver source does (ascend_hal: inc/davinci_interface.h, svm/v2/common/devmm_svm_init.c,
 * pbl/commlib/drv_comm_intf.c, dms/drv_devmng/.../devdrv_manager_fd.c, hdc/pcie/hdc_pcie_drv.h), and so the simulator:
 *   - /dev/davinci_manager, or /dev/npu_device_cust where the manager is not accessible read-write
 *     (davinci_intf_get_dev_path), opened once per sub-module: svm (O_RDWR|O_SYNC|O_CLOEXEC), dms (O_RDWR|O_CLOEXEC),
 *     and per chip tsdrv and tsdrv_mmap (O_RDWR|O_SYNC|O_CLOEXEC), each bound to its sub-module and chip with an ioctl
 *     (DAVINCI_INTF_IOCTL_OPEN {module_name, device_id}). A chip is reached through the manager: no descriptor on
 *     /dev/davinci<N> is held, but a chip whose node the process lacks cannot be bound (the device cgroup and the
 *     driver find a container's chips by their nodes).
 *   - SVM: shared read-write segments of the manager at fixed addresses from 0x100000000000, 8 TB in all, MADV_DONTDUMP;
 *     per stream a submission queue and a doorbell mapped through tsdrv_mmap. All of it is still open and mapped
 *     after the backup; halDeviceClose(DEV_CLOSE_HOST_USER), "only used when process snapshot restore", runs in the
 *     restored process: it forgets the old descriptors and mappings and opens the devices afresh (hal_host_close).
 *   - /dev/devmm_svm (the older SVM's node) and /dev/hisi_hdc (HDC over PCIe) held open where the process has them.
 * What this kernel allows (docs/simulator.md "Why these nodes, on this kernel"): the manager is a loop block device (no
 * character device but /dev/zero and /dev/mem can be mapped here), the ioctl binding is the simulator's own table, a
 * segment maps the manager past its end (never touched: any access faults), devmm_svm and hisi_hdc are misc character
 * devices whose drivers open harmlessly (loop-control, fuse).
 */
#ifndef ACL_SIM_HAL_H
#define ACL_SIM_HAL_H

#define SIM_SVM_BYTES (8ULL << 40)   /* the SVM range: 8 TB from ACL_SIM_DEVICE_VA_BASE */
#define SIM_PAGE 4096ULL
#define SIM_MAPPED_PAST (SIM_MANAGER_BYTES / SIM_PAGE) /* page offset of the segments: past the manager's end */

typedef struct {
    int bound;            /* tsdrv and tsdrv_mmap opened and bound to this chip */
    dev_t chip;           /* the chip node's numbering when it was bound */
    int tsdrv_fd, tsdrv_mmap_fd;
    void **queues;        /* per stream: submission queue and doorbell */
    int nqueues;
} hal_dev_t;

static hal_dev_t g_hal_dev[SIM_MAX_DEVICES];
static struct {
    int open;             /* the process-wide part: svm, dms, the SVM range, devmm_svm and hisi_hdc */
    char manager[4096];   /* the manager's path: davinci_manager, or npu_device_cust */
    int svm_fd, dms_fd, devmm_fd, hdc_fd;
    void **segments;
    int nsegments;
} g_hal = {0, "", -1, -1, -1, -1, NULL, 0};

static const char *nodes_dir(void)
{
    const char *d = getenv("ACL_SIM_DEVICE_NODES");
    return (d == NULL || *d == '\0') ? SIM_DEFAULT_NODES : d;
}

static int node_path(char *buf, size_t n, const char *name)
{
    int r = snprintf(buf, n, "%s/%s", nodes_dir(), name);
    return (r > 0 && (size_t)r < n) ? 0 : -1;
}

static int manager_mapped_ok(const void *p)
{
    return memcmp(p, SIM_MANAGER_MAGIC, sizeof(SIM_MANAGER_MAGIC) - 1) == 0;
}

static int hal_streams(void)
{
    return (int)env_ll("ACL_SIM_STREAMS", 16, 0, 1024);
}

static int hal_segments(void)
{
    return (int)env_ll("ACL_SIM_SVM_SEGMENTS", 256, 1, 4096);
}

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

/* open(path, flags) logged on failure: the descriptor or -1. */
static int hal_open_node(const char *path, int flags, const char *what)
{
    int fd = open(path, flags);
    if (fd < 0) {
        sim_log(LOG_ERROR, "cannot open %s for %s: %s (install the simulated driver: aclsim_ctl.py install; in a "
                "container: docker run --device)", path, what, strerror(errno));
    }
    return fd;
}

/* The mappings the HAL left in this process (the driver's, or CRIU's placeholders for them) unmapped. */
static void hal_unmap_process(void)
{
    for (int i = 0; i < g_hal.nsegments; i++) {
        munmap(g_hal.segments[i], (size_t)(SIM_SVM_BYTES / (uint64_t)g_hal.nsegments));
    }
    free(g_hal.segments);
    g_hal.segments = NULL;
    g_hal.nsegments = 0;
    if (g_mgr_map != NULL) {
        munmap(g_mgr_map, SIM_MANAGER_BYTES);
        g_mgr_map = NULL;
    }
}

static void hal_close_process(void)
{
    hal_unmap_process();
    close_fd(&g_hal.svm_fd);
    close_fd(&g_hal.dms_fd);
    close_fd(&g_hal.devmm_fd);
    close_fd(&g_hal.hdc_fd);
    g_mgr_fd = -1; /* svm_fd's */
    g_hal.open = 0;
}

/* The process-wide part, once: the manager (or its fallback) for svm and dms, the SVM range mapped, devmm_svm and
 * hisi_hdc where the process has them. 0, or -1 (logged; nothing left open). */
static int hal_open_process(void)
{
    char path[4096];
    if (g_hal.open) {
        return 0;
    }
    if (node_path(g_hal.manager, sizeof(g_hal.manager), "davinci_manager") != 0 ||
        (access(g_hal.manager, R_OK | W_OK) != 0 &&
         node_path(g_hal.manager, sizeof(g_hal.manager), "npu_device_cust") != 0)) {
        return -1;
    }
    if ((g_hal.svm_fd = hal_open_node(g_hal.manager, O_RDWR | O_SYNC | O_CLOEXEC, "svm")) < 0) {
        return -1;
    }
    void *p = mmap(NULL, SIM_MANAGER_BYTES, PROT_READ, MAP_SHARED, g_hal.svm_fd, 0);
    if (p == MAP_FAILED || !manager_mapped_ok(p)) {
        sim_log(LOG_ERROR, "%s is not the simulator's manager device (%s)", g_hal.manager,
                p == MAP_FAILED ? strerror(errno) : "no manager header");
        if (p != MAP_FAILED) {
            munmap(p, SIM_MANAGER_BYTES);
        }
        close_fd(&g_hal.svm_fd);
        return -1;
    }
    g_mgr_map = p;
    g_mgr_fd = g_hal.svm_fd;
    g_hal.open = 1;
    if ((g_hal.dms_fd = hal_open_node(g_hal.manager, O_RDWR | O_CLOEXEC, "dms")) < 0) {
        hal_close_process();
        return -1;
    }
    int n = hal_segments();
    uint64_t each = SIM_SVM_BYTES / (uint64_t)n;
    if ((g_hal.segments = calloc((size_t)n, sizeof(void *))) == NULL) {
        hal_close_process();
        return -1;
    }
    for (int i = 0; i < n; i++) {
        void *want = (void *)(uintptr_t)(ACL_SIM_DEVICE_VA_BASE + (uint64_t)i * each);
        void *seg = mmap(want, (size_t)each, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, g_hal.svm_fd,
                         (off_t)(SIM_MAPPED_PAST * SIM_PAGE));
        if (seg != want) {
            sim_log(LOG_ERROR, "cannot map SVM segment %d of %s at %p: %s", i, g_hal.manager, want,
                    seg == MAP_FAILED ? strerror(errno) : "the range is taken");
            if (seg != MAP_FAILED) {
                munmap(seg, (size_t)each);
            }
            hal_close_process();
            return -1;
        }
        madvise(seg, (size_t)each, MADV_DONTDUMP);
        g_hal.segments[g_hal.nsegments++] = seg;
    }
    if (node_path(path, sizeof(path), "devmm_svm") == 0 && access(path, F_OK) == 0 &&
        (g_hal.devmm_fd = hal_open_node(path, O_RDWR | O_SYNC | O_CLOEXEC, "the older SVM")) < 0) {
        hal_close_process();
        return -1;
    }
    if (node_path(path, sizeof(path), "hisi_hdc") == 0 && access(path, F_OK) == 0 &&
        (g_hal.hdc_fd = hal_open_node(path, O_RDWR | O_CLOEXEC, "HDC")) < 0) {
        hal_close_process();
        return -1;
    }
    sim_log(LOG_INFO, "HAL: %s open for svm and dms, %d SVM segments mapped at %#llx", g_hal.manager, n,
            (unsigned long long)ACL_SIM_DEVICE_VA_BASE);
    return 0;
}

static void hal_unmap_device(hal_dev_t *h)
{
    for (int i = 0; i < h->nqueues; i++) {
        munmap(h->queues[i], (size_t)SIM_PAGE);
    }
    free(h->queues);
    h->queues = NULL;
    h->nqueues = 0;
}

static void hal_close_device(hal_dev_t *h)
{
    hal_unmap_device(h);
    close_fd(&h->tsdrv_fd);
    close_fd(&h->tsdrv_mmap_fd);
    h->bound = 0;
}

/* Chip dev bound (tsdrv, tsdrv_mmap, its streams' queues mapped), the process-wide part first; its node must be
 * there. ACL_SUCCESS or fail_code (logged; what this call opened is closed again). */
static aclError hal_bind(int dev, aclError fail_code)
{
    char path[4096], name[32];
    hal_dev_t *h = &g_hal_dev[dev];
    struct stat st;
    if (h->bound) {
        return ACL_SUCCESS;
    }
    snprintf(name, sizeof(name), "davinci%d", dev);
    if (node_path(path, sizeof(path), name) != 0 || stat(path, &st) != 0 || !S_ISCHR(st.st_mode)) {
        sim_log(LOG_ERROR, "device %d: no device node %s: install the simulated driver (aclsim_ctl.py install), or "
                "give the container the device (docker run --device)", dev, path);
        return fail_code;
    }
    int opened_process = !g_hal.open;
    if (hal_open_process() != 0) {
        return fail_code;
    }
    h->chip = st.st_rdev;
    h->tsdrv_fd = hal_open_node(g_hal.manager, O_RDWR | O_SYNC | O_CLOEXEC, "tsdrv");
    h->tsdrv_mmap_fd = h->tsdrv_fd < 0 ? -1 : hal_open_node(g_hal.manager, O_RDWR | O_SYNC | O_CLOEXEC, "tsdrv_mmap");
    int n = 2 * hal_streams();
    h->queues = h->tsdrv_mmap_fd < 0 ? NULL : calloc((size_t)n + 1, sizeof(void *));
    for (int i = 0; h->queues != NULL && i < n; i++) {
        /* offsets two pages apart past the manager's end: adjacent queues stay mappings of their own */
        off_t at = (off_t)((SIM_MAPPED_PAST + 2 * (uint64_t)(dev * n + i)) * SIM_PAGE);
        void *q = mmap(NULL, (size_t)SIM_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, h->tsdrv_mmap_fd, at);
        if (q == MAP_FAILED) {
            sim_log(LOG_ERROR, "device %d: cannot map stream queue %d: %s", dev, i, strerror(errno));
            break;
        }
        h->queues[h->nqueues++] = q;
    }
    if (h->nqueues != n) {
        hal_close_device(h);
        if (opened_process) {
            hal_close_process();
        }
        return fail_code;
    }
    h->bound = 1;
    sim_log(LOG_INFO, "device %d: bound through %s (chip %s, c %u:%u), %d stream queues mapped", dev, g_hal.manager,
            path, major(st.st_rdev), minor(st.st_rdev), n);
    return ACL_SUCCESS;
}

static void hal_unbind(int dev)
{
    if (!g_hal_dev[dev].bound) {
        return;
    }
    hal_close_device(&g_hal_dev[dev]);
    for (int d = 0; d < SIM_MAX_DEVICES; d++) {
        if (g_hal_dev[d].bound) {
            return;
        }
    }
    hal_close_process();
}

/* Unlock from BACKED_UP without a restore: the process goes on with what it holds; the manager's first pages are
 * mapped again where they were (over CRIU's placeholder in a restored process). ACL_SUCCESS or fail_code. */
static aclError hal_reattach(aclError fail_code)
{
    if (g_mgr_fd >= 0 && g_mgr_map != NULL) {
        void *p = mmap(g_mgr_map, SIM_MANAGER_BYTES, PROT_READ, MAP_SHARED | MAP_FIXED, g_mgr_fd, 0);
        if (p == MAP_FAILED || !manager_mapped_ok(p)) {
            sim_log(LOG_ERROR, "cannot map the manager device again at %p: %s", g_mgr_map,
                    p == MAP_FAILED ? strerror(errno) : "no manager header");
            return fail_code;
        }
    }
    return ACL_SUCCESS;
}

/* aclrtSnapShotProcessRestore's halDeviceClose(DEV_CLOSE_HOST_USER) and the reopen after it. The descriptors this
 * process holds must be the ones CRIU's NPU plugin opened again by path -- on this node's manager -- or the restore
 * fails; then every old descriptor and mapping (the plugin's placeholders, in a restored process) is let go and
 * every chip in use bound afresh, through the manager and the chip nodes as they are here now. ACL_SUCCESS or
 * fail_code (logged). */
static aclError hal_host_close(aclError fail_code)
{
    struct stat held, now;
    int devs[SIM_MAX_DEVICES], ndevs = 0;
    if (g_hal.open && (fstat(g_hal.svm_fd, &held) != 0 || stat(g_hal.manager, &now) != 0 ||
                       held.st_rdev != now.st_rdev)) {
        sim_log(LOG_ERROR, "the HAL's descriptor on %s is not that node now: the NPU CRIU plugin did not restore the "
                "process's device files", g_hal.manager);
        return fail_code;
    }
    for (int dev = 0; dev < SIM_MAX_DEVICES; dev++) {
        if (g_hal_dev[dev].bound) {
            devs[ndevs++] = dev;
            hal_close_device(&g_hal_dev[dev]);
        }
    }
    hal_close_process();
    for (int i = 0; i < ndevs; i++) {
        if (hal_bind(devs[i], fail_code) != ACL_SUCCESS) {
            return fail_code;
        }
    }
    sim_log(LOG_EVENT, "HAL: host close, %d device(s) opened again", ndevs);
    return ACL_SUCCESS;
}

static void hal_init(void)
{
    for (int i = 0; i < SIM_MAX_DEVICES; i++) {
        g_hal_dev[i].tsdrv_fd = g_hal_dev[i].tsdrv_mmap_fd = -1;
    }
}

#endif
