/*
 * hal_lib.c - libascend_hal.so of the simulated NPU driver: the driver's user-space library, which an NPU node has in
 * /usr/local/Ascend/driver/lib64 and the Ascend Docker Runtime bind-mounts read-only into every NPU container. As in
 * CANN (ascend_hal.h: __HAL_API_VERSION), halGetAPIVersion is a constant of the library: a driver upgrade on the node
 * is another library, of another version and another size, under the same path. libascendcl.so (acl_sim.c) loads it
 * from ACL_SIM_DRIVER_DIR (default /usr/local/Ascend/driver/lib64) and keeps it mapped, as a real process does.
 * build.sh builds the node's driver (ACL_SIM_HAL_API_VERSION 500) and an upgrade of it (501, larger).
 */
#ifndef ACL_SIM_HAL_API_VERSION
#define ACL_SIM_HAL_API_VERSION 500
#endif
#ifndef ACL_SIM_HAL_BYTES
#define ACL_SIM_HAL_BYTES 4096 /* the rest of the driver's code: another release is another size */
#endif

__attribute__((visibility("default"))) int halGetAPIVersion(int *apiVersion)
{
    if (apiVersion == 0) {
        return 1;
    }
    *apiVersion = ACL_SIM_HAL_API_VERSION;
    return 0;
}

__attribute__((used)) static const unsigned char g_rest[ACL_SIM_HAL_BYTES] = {ACL_SIM_HAL_API_VERSION & 0xff};
