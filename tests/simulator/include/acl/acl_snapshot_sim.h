/*
 * acl_snapshot_sim.h - the libascendcl subset implemented by the inferops.snapshot simulator.
 *
 * The declarations below use the names and signatures of the public CANN ACL API (acl.h,
 * acl_rt.h, acl_base.h), so code written against this header also builds against CANN.
 * Functions whose names start with "aclsim" exist only in the simulator (test hooks); the
 * real runtime has no equivalent public call.
 *
 * Environment knobs (read when used, so a test can set them per process):
 *   ACL_SIM_DEVICE_DIR        directory of the device memory files   (default /dev/shm/aclsim,
 *                             created with mode 0700; one file "device<N>" per device)
 *   ACL_SIM_DEVICE_MEM_BYTES  size of each device's memory            (default 1 GiB; K/M/G suffix
 *                             accepted; 4 KiB .. 1 TiB)
 *   ACL_SIM_DEVICE_PREALLOC   when a device file is created (or grown): "huge" (default) allocates
 *                             all of its memory at once and gathers it into 2 MiB pages where the
 *                             kernel can (MADV_COLLAPSE); "pages" allocates it in 4 KiB pages;
 *                             "none" leaves a sparse file (pages come on first use)
 *   ACL_SIM_COPY_GBPS         bandwidth of a copy between host and device memory, GB/s (10^9
 *                             bytes): backup, restore and host<->device aclrtMemcpy take at least
 *                             bytes / this (default 25: PCIe 4.0 x16 at 80 %; 0 = not modelled,
 *                             the host's memcpy speed; 0 .. 100000)
 *   ACL_SIM_DEVICE_COUNT      number of devices reported/allowed      (default 8, 1..64)
 *   ACL_SIM_LOCK_TIMEOUT_MS   how long Lock waits for registered background threads to park,
 *                             and Unlock for them to leave            (default 5000; the real
 *                             runtime waits 60 s)
 *   ACL_SIM_VERSION           "major.minor.patch" from aclrtGetVersion (default "9.1.0")
 *   ACL_SIM_LOG               0 errors/warnings only (default), 1 + events, 2 + info; to stderr
 *   ACL_SIM_DEVICE_NODES      directory of the device nodes (davinci<N>, davinci_manager or npu_device_cust,
 *                             devmm_svm, hisi_hdc) the process opens as the HAL opens them and holds until
 *                             it releases its devices -- through a backup too, as a real process does
 *                             (default "/dev", as the runtime: a container given them with docker run
 *                             --device, or the node's own from aclsim_ctl.py install --node; a host process
 *                             of the tests: the directory aclsim_ctl.py install made for its device
 *                             directory). See src/acl_sim_hal.h and docs/simulator.md
 *   ACL_SIM_STREAMS           streams per device, each a queue and a doorbell mapped (default 16, 0..1024)
 *   ACL_SIM_SVM_SEGMENTS      mappings the 8 TB SVM range is made of (default 256, 1..4096)
 *   ACL_SIM_DRIVER_DIR        where the driver's libascend_hal.so is (default /usr/local/Ascend/driver/lib64,
 *                             which an NPU container gets bind-mounted from the host): halGetAPIVersion is
 *                             its constant; without one, driver.conf's api_version
 *   ACL_SIM_RUNTIME_API_VERSION  what rtGetRuntimeVersion reports (default 10000)
 * Node control file ${ACL_SIM_DEVICE_DIR}/driver.conf (read when used; aclsim_ctl.py driver writes it):
 *   api_version=N             what halGetAPIVersion reports where no driver library is loaded (default 500)
 *   snapshot_feature=0|1      whether the driver supports the process device-memory snapshot the args
 *                             shape needs (default 1)
 *
 * Device memory model: device N's memory is the file ${ACL_SIM_DEVICE_DIR}/deviceN, mapped
 * MAP_SHARED (2 MiB-aligned) and held with an exclusive flock() while the process has the device
 * open; its memory is allocated once, when the file is created (ACL_SIM_DEVICE_PREALLOC). Device
 * pointers are NOT host addresses: they are ACL_SIM_DEVICE_VA_BASE + (N << 40) + offset and are
 * only meaningful to aclrtMemcpy/aclrtFree. Allocations are 512-byte aligned, first fit.
 *
 * Current device: per thread, as in the real runtime (aclrtSetDevice binds the calling thread).
 * Calls that need a current device (aclrtMalloc, aclrtGetDevice, aclrtGetMemInfo,
 * aclrtSynchronizeDevice and device memcpy kinds) fail with ACL_ERROR_RT_CONTEXT_NULL in a
 * thread that never called aclrtSetDevice. Devices are reference counted per process.
 *
 * Snapshot contract (enforced):
 *   RUNNING -Lock-> LOCKED -Backup-> BACKED_UP -Restore-> LOCKED; Unlock from LOCKED or
 *   BACKED_UP -> RUNNING. Other transitions fail with the stage's code, state unchanged.
 *   pid must be getpid() and reserve must be NULL (else ACL_ERROR_INVALID_PARAM). args: NULL is the
 *   older flow; non-NULL (not in a ACL_SIM_LEGACY_SNAPSHOT_API build, which refuses it) must hold flags 0
 *   or 1 (else ACL_ERROR_INVALID_PARAM), needs the driver's snapshot feature (else
 *   ACL_ERROR_RT_FEATURE_NOT_SUPPORT, no fallback); backup records the runtime and driver API versions,
 *   restore with args fails with ACL_ERROR_SNAPSHOT_RESTORE_FAILED unless they are the same now.
 *   aclrtSetDevice binds the chip through davinci_manager (ACL_SIM_DEVICE_NODES; npu_device_cust where the
 *   manager is not accessible) and fails with ACL_ERROR_RT_DEV_SETUP_ERROR without them or without the
 *   chip's node; restore first checks the held descriptors are on the manager at its path now, lets go
 *   of every descriptor and mapping and binds again (halDeviceClose); unlock maps the manager's first
 *   pages again where the process had them.
 *   While LOCKED/BACKED_UP, aclrtSetDevice/ResetDevice/Malloc/Free/Memcpy and aclFinalize block
 *   the calling thread until RUNNING; queries and aclrtSynchronizeDevice do not block.
 *   Callbacks: for every registered callback of a stage, in registration order, the callback is
 *   called once per device in use (set with aclrtSetDevice and not reset), ascending device id,
 *   with (deviceId, args). With no device in use no callback is called (the runtime iterates its
 *   open devices). A non-zero return fails the call with ACL_ERROR_SNAPSHOT_CALLBACK_FAILED.
 *   Order inside the calls (as in the runtime):
 *     Lock:    LOCK_PRE callbacks, state check, RUNNING->LOCKED, wait for background threads
 *              (timeout or failure -> back to RUNNING, blocked threads woken).
 *     Backup:  state check, BACKUP_PRE, copy device memory to host + release the devices
 *              (at least bytes / ACL_SIM_COPY_GBPS), BACKUP_POST, ->BACKED_UP. (A failing
 *              BACKUP_POST puts the data back: LOCKED.)
 *     Restore: state check, RESTORE_PRE, re-open devices + copy back (at least bytes /
 *              ACL_SIM_COPY_GBPS), RESTORE_POST, ->LOCKED.
 *     Unlock:  state check, (from BACKED_UP: re-open devices WITHOUT copying), ->RUNNING,
 *              wake blocked threads, wait for background threads to leave, UNLOCK_POST.
 *   A snapshot call made from inside a snapshot callback fails with that call's failure code.
 *   At process exit the state is forced back to RUNNING (like GlobalStateManager::ForceUnlocked).
 */
#ifndef ACL_SNAPSHOT_SIM_H
#define ACL_SNAPSHOT_SIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef ACL_FUNC_VISIBILITY
#define ACL_FUNC_VISIBILITY __attribute__((visibility("default")))
#endif

typedef int aclError;

/* ---- error codes (values and names as in CANN's acl_base.h / acl_rt.h) ---------------- */
#define ACL_SUCCESS 0                           /* success */
#define ACL_ERROR_INVALID_PARAM 100000          /* bad argument: NULL/zero where not allowed,
                                                   snapshot pid != getpid() ("cross-process
                                                   operation is not supported"), non-NULL
                                                   reserve/args, bad memcpy kind, count >
                                                   destMax, unknown or out-of-range device
                                                   pointer, resetting a device not set */
#define ACL_ERROR_REPEAT_INITIALIZE 100002      /* aclInit called twice */
#define ACL_ERROR_INVALID_FILE 100003           /* aclInit config path does not exist */
#define ACL_ERROR_REPEAT_FINALIZE 100037        /* aclFinalize without aclInit */
#define ACL_ERROR_RT_PARAM_INVALID 107000       /* unregistering a callback that is not
                                                   registered (or bad stage / NULL callback) */
#define ACL_ERROR_RT_INVALID_DEVICEID 107001    /* device id < 0 or >= ACL_SIM_DEVICE_COUNT */
#define ACL_ERROR_RT_CONTEXT_NULL 107002        /* calling thread has no current device */
#define ACL_ERROR_RT_FEATURE_NOT_SUPPORT 207000 /* args shape: the driver lacks the process device-memory
                                                   snapshot feature (driver.conf snapshot_feature=0) */
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001   /* out of device memory (or host memory) */
#define ACL_ERROR_RT_DEV_SETUP_ERROR 507033     /* device cannot be opened: busy (another
                                                   process holds its flock), or the device
                                                   file cannot be created/mapped, or the
                                                   device was released (not re-opened) */
#define ACL_ERROR_RT_DRV_INTERNAL_ERROR 507899  /* aclsimDeviceReset could not remove the file */
#define ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT 507905  /* background threads did not park in time */
#define ACL_ERROR_SNAPSHOT_LOCK_FAILED 507906   /* Lock: state is not RUNNING */
#define ACL_ERROR_SNAPSHOT_UNLOCK_FAILED 507907 /* Unlock: state is not LOCKED/BACKED_UP, or a
                                                   device could not be re-opened (state
                                                   unchanged), or background threads did not
                                                   leave the parked state in time */
#define ACL_ERROR_SNAPSHOT_BACKUP_FAILED 507908 /* Backup: state is not LOCKED, or the host copy
                                                   could not be allocated */
#define ACL_ERROR_SNAPSHOT_RESTORE_FAILED 507909 /* Restore: state is not BACKED_UP, or a device
                                                   cannot be re-opened (busy: held by another
                                                   process) or is smaller than the backup */
#define ACL_ERROR_SNAPSHOT_CALLBACK_FAILED 507912 /* a snapshot callback returned non-zero */
#define ACL_ERROR_SNAPSHOT_REGISTER_CALLBACK_FAILED 507913 /* duplicate (stage, callback),
                                                   NULL callback, bad stage, or table full */

/* ---- snapshot API (acl_rt.h) ------------------------------------------------------------ */
typedef enum {
    ACL_RT_SNAPSHOT_LOCK_PRE = 0,
    ACL_RT_SNAPSHOT_BACKUP_PRE,
    ACL_RT_SNAPSHOT_BACKUP_POST,
    ACL_RT_SNAPSHOT_RESTORE_PRE,
    ACL_RT_SNAPSHOT_RESTORE_POST,
    ACL_RT_SNAPSHOT_UNLOCK_POST,
} aclrtSnapShotStage;

typedef uint32_t (*aclrtSnapShotCallBack)(int32_t deviceId, void *args);
#ifdef ACL_SIM_LEGACY_SNAPSHOT_API
/* An older CANN runtime: the snapshot calls take no arguments (only NULL is accepted). */
typedef struct aclrtSnapShotBackupArgs aclrtSnapShotBackupArgs;
typedef struct aclrtSnapShotRestoreArgs aclrtSnapShotRestoreArgs;
#else
/* The args shape (hicann/runtime docs/zh/design/features/snapshot.md, 2.4): flags 0 = memory tagged required
 * only, 1 = required + optional; reserved is unused. NULL args keep the older no-argument behaviour. */
#define ACL_SNAPSHOT_FLAGS_REQUIRED 0U
#define ACL_SNAPSHOT_FLAGS_REQUIRED_AND_OPTIONAL 1U
typedef struct aclrtSnapShotBackupArgs {
    uint32_t backupFlags;
    char reserved[60];
} aclrtSnapShotBackupArgs;
typedef struct aclrtSnapShotRestoreArgs {
    uint32_t restoreFlags;
    char reserved[60];
} aclrtSnapShotRestoreArgs;
#endif

ACL_FUNC_VISIBILITY aclError aclrtSnapShotProcessLock(int pid, void *reserve);
ACL_FUNC_VISIBILITY aclError aclrtSnapShotProcessBackup(int pid, aclrtSnapShotBackupArgs *args);
ACL_FUNC_VISIBILITY aclError aclrtSnapShotProcessRestore(int pid, aclrtSnapShotRestoreArgs *args);
ACL_FUNC_VISIBILITY aclError aclrtSnapShotProcessUnlock(int pid, void *reserve);
ACL_FUNC_VISIBILITY aclError aclrtSnapShotCallbackRegister(aclrtSnapShotStage stage,
                                                           aclrtSnapShotCallBack callback, void *args);
ACL_FUNC_VISIBILITY aclError aclrtSnapShotCallbackUnregister(aclrtSnapShotStage stage,
                                                             aclrtSnapShotCallBack callback);
#ifndef ACL_SIM_LEGACY_SNAPSHOT_API
/* The runtime-layer entry points of the args shape (libruntime's rtSnapShotProcessBackupWithArgs /
 * RestoreWithArgs): a library that exports them takes args; the binding probes for them. */
ACL_FUNC_VISIBILITY aclError rtSnapShotProcessBackupWithArgs(int pid, aclrtSnapShotBackupArgs *args);
ACL_FUNC_VISIBILITY aclError rtSnapShotProcessRestoreWithArgs(int pid, aclrtSnapShotRestoreArgs *args);
#endif
/* The versions the args shape records at backup and compares at restore: the runtime's API version
 * (rtGetRuntimeVersion, libruntime) and the driver's (halGetAPIVersion, libascend_hal). */
ACL_FUNC_VISIBILITY aclError rtGetRuntimeVersion(uint32_t *runtimeVersion);
ACL_FUNC_VISIBILITY int halGetAPIVersion(int *apiVersion);

/* ---- ordinary ACL calls ------------------------------------------------------------------ */
typedef enum {
    ACL_MEM_MALLOC_HUGE_FIRST = 0,
    ACL_MEM_MALLOC_HUGE_ONLY,
    ACL_MEM_MALLOC_NORMAL_ONLY,
    ACL_MEM_MALLOC_HUGE_FIRST_P2P,
    ACL_MEM_MALLOC_HUGE_ONLY_P2P,
    ACL_MEM_MALLOC_NORMAL_ONLY_P2P,
} aclrtMemMallocPolicy; /* accepted and ignored */

typedef enum {
    ACL_MEMCPY_HOST_TO_HOST = 0,
    ACL_MEMCPY_HOST_TO_DEVICE = 1,
    ACL_MEMCPY_DEVICE_TO_HOST = 2,
    ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
} aclrtMemcpyKind;

typedef enum {
    ACL_DDR_MEM = 0, ACL_HBM_MEM, ACL_DDR_MEM_HUGE, ACL_DDR_MEM_NORMAL, ACL_HBM_MEM_HUGE,
    ACL_HBM_MEM_NORMAL, ACL_DDR_MEM_P2P_HUGE, ACL_DDR_MEM_P2P_NORMAL, ACL_HBM_MEM_P2P_HUGE,
    ACL_HBM_MEM_P2P_NORMAL,
} aclrtMemAttr; /* all report the device's single memory pool */

ACL_FUNC_VISIBILITY aclError aclInit(const char *configPath);  /* NULL/"" or an existing file */
ACL_FUNC_VISIBILITY aclError aclFinalize(void);                /* resets every device; blocks */
ACL_FUNC_VISIBILITY aclError aclrtSetDevice(int32_t deviceId);   /* blocks while locked */
ACL_FUNC_VISIBILITY aclError aclrtResetDevice(int32_t deviceId); /* blocks while locked */
ACL_FUNC_VISIBILITY aclError aclrtGetDevice(int32_t *deviceId);
ACL_FUNC_VISIBILITY aclError aclrtGetDeviceCount(uint32_t *count);
ACL_FUNC_VISIBILITY aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
ACL_FUNC_VISIBILITY aclError aclrtFree(void *devPtr);
ACL_FUNC_VISIBILITY aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
                                         aclrtMemcpyKind kind);
ACL_FUNC_VISIBILITY aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total);
ACL_FUNC_VISIBILITY aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion,
                                             int32_t *patchVersion);
ACL_FUNC_VISIBILITY aclError aclrtSynchronizeDevice(void);

/* ---- simulator-only exports (no public equivalent in CANN) -------------------------------- */
#define ACL_SIM_DEVICE_VA_BASE 0x100000000000ULL /* device N pointers: base + (N << 40) + off */
#define ACL_SIM_STATE_RUNNING 0
#define ACL_SIM_STATE_LOCKED 1
#define ACL_SIM_STATE_BACKED_UP 2

/* Mirrors GlobalStateManager::IncBackgroundThreadCount / BackgroundThreadWaitIfLocked /
 * DecBackgroundThreadCount: a registered thread must call WaitIfLocked periodically; while the
 * process is locked it parks there until unlock. Lock waits until every registered thread is
 * parked. */
ACL_FUNC_VISIBILITY void aclsimBackgroundThreadRegister(const char *name);
ACL_FUNC_VISIBILITY void aclsimBackgroundThreadWaitIfLocked(const char *name);
ACL_FUNC_VISIBILITY void aclsimBackgroundThreadUnregister(const char *name);
/* "Pod deleted": wipes device <N>. Its file ${ACL_SIM_DEVICE_DIR}/device<N> is removed and, when it
 * existed and ACL_SIM_DEVICE_PREALLOC is not "none", replaced by a zeroed one of the same size
 * whose memory is allocated now (the device stays; only its content is gone). Without a file, the
 * next open creates a zeroed one. A process that still has the old file mapped keeps its (now
 * orphaned) mapping. */
ACL_FUNC_VISIBILITY aclError aclsimDeviceReset(int32_t deviceId);
/* The last backup or restore copy: kind 0 none yet, 1 backup, 2 restore; devices and bytes
 * copied; copySeconds: the host's copy (device open and map included); modelledSeconds: bytes /
 * ACL_SIM_COPY_GBPS; totalSeconds: the copy as the caller waited for it, max(copy, modelled)
 * plus scheduling; gbps: the rate in effect (0: not modelled). */
typedef struct {
    int32_t kind;
    int32_t devices;
    uint64_t bytes;
    double copySeconds;
    double modelledSeconds;
    double totalSeconds;
    double gbps;
} aclsimCopyStats;
ACL_FUNC_VISIBILITY aclError aclsimGetLastCopy(aclsimCopyStats *stats);
/* Tests only: 0 RUNNING, 1 LOCKED, 2 BACKED_UP (callers of the real runtime track state). */
ACL_FUNC_VISIBILITY int aclsimGetState(void);
/* Bytes copied to host memory by the last successful backup (0 before any). */
ACL_FUNC_VISIBILITY uint64_t aclsimGetBackupBytes(void);
/* Number of threads currently blocked in a resource-changing call because of the lock. */
ACL_FUNC_VISIBILITY uint32_t aclsimGetBlockedThreadCount(void);

#ifdef __cplusplus
}
#endif
#endif /* ACL_SNAPSHOT_SIM_H */
