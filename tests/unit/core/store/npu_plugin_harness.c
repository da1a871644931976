/*
 * CRIU's side of the collection's NPU plugin, for test_criu_images_npu_plugin.py: the plugin's own source, compiled
 * with build.sh's warnings, given an images directory and a log the way CRIU gives them, and driven through the hooks
 * it registers (CR_PLUGIN_DESC).
 *   npu_plugin_harness restore DIR [ID]  init(RESTORE); prints the records it then holds, one a line: "f ID FLAGS
 *                                        TYPE MAJOR MINOR PATH", "v TYPE MAJOR MINOR PATH", "t TYPE MAJOR MINOR PATH"
 *                                        (PATH in hex); with ID, then RESTORE_EXT_FILE(ID): "opened TYPE MAJOR MINOR"
 *   npu_plugin_harness dump DIR PATH [N] init(DUMP), then DUMP_EXT_FILE of PATH opened and N times (default 1)
 *                                        HANDLE_DEVICE_VMA of it
 *   npu_plugin_harness map DIR PATH..    init(RESTORE), then UPDATE_VMA_MAP of each PATH: "placeholder PATH" when the
 *                                        plugin gives a descriptor of an empty memfd and offset 0, "left PATH" when it
 *                                        leaves the mapping to others (-ENOTSUP)
 * CRIU's inventory of plugins: "inventory + NAME" when the plugin names itself at dump, "inventory - NAME" when it
 * takes itself off at restore (both on stdout).
 * Exit 0 when every hook succeeds, 1 when one fails (its error lines on stderr, CRIU's log), 2 on a bad call.
 */
#include "inferops_npu_plugin.c"

static int g_image_dir = -1;

int criu_get_image_dir(void)
{
    return g_image_dir;
}

void print_on_level(unsigned int loglevel, const char *format, ...)
{
    va_list args;
    (void)loglevel;
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
}

int add_inventory_plugin(const char *name)
{
    printf("inventory + %s\n", name);
    return 0;
}

bool check_and_remove_inventory_plugin(const char *name, size_t n)
{
    printf("inventory - %.*s\n", (int)n, name);
    return true;
}

static int map_placeholders(int argc, char **argv)
{
    int (*update)(const char *, const uint64_t, const uint64_t, uint64_t *, int *) =
        CR_PLUGIN_DESC.hooks[CR_PLUGIN_HOOK__UPDATE_VMA_MAP];
    for (int i = 3; i < argc; i++) {
        uint64_t pgoff = 99;
        int fd = -1, rc = update(argv[i], 0x100000000000ULL, 7, &pgoff, &fd);
        char link[64], target[256] = "";
        snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
        if (rc == 1 && fd >= 0 && pgoff == 0 && readlink(link, target, sizeof(target) - 1) > 0 &&
            strstr(target, "memfd:") != NULL && lseek(fd, 0, SEEK_END) == 0) {
            printf("placeholder %s\n", argv[i]);
        } else if (rc == -ENOTSUP && fd == -1) {
            printf("left %s\n", argv[i]);
        } else {
            return 1;
        }
    }
    return 0;
}

static void print_record(const record_t *r)
{
    if (r->kind == 'f') {
        printf("f %u %x ", r->id, (unsigned int)r->flags);
    } else {
        printf("%c ", r->kind);
    }
    printf("%c %u %u ", r->type, r->major, r->minor);
    for (const char *p = r->path; *p; p++) {
        printf("%02x", (unsigned char)*p);
    }
    printf("\n");
}

int main(int argc, char **argv)
{
    int dump = (argc == 4 || argc == 5) && strcmp(argv[1], "dump") == 0, rc = 0;
    int map = argc >= 3 && strcmp(argv[1], "map") == 0;
    if ((argc < 3 || (!dump && !map && argc > 4)) || (!dump && !map && strcmp(argv[1], "restore") != 0) ||
        (g_image_dir = open(argv[2], O_RDONLY | O_DIRECTORY)) < 0) {
        fprintf(stderr, "usage: %s restore DIR [ID] | dump DIR PATH [N] | map DIR PATH..\n", argv[0]);
        return 2;
    }
    if (CR_PLUGIN_DESC.init(dump ? CR_PLUGIN_STAGE__DUMP : CR_PLUGIN_STAGE__RESTORE) != 0) {
        return 1;
    }
    if (dump) {
        int (*dump_file)(int, int) = CR_PLUGIN_DESC.hooks[CR_PLUGIN_HOOK__DUMP_EXT_FILE];
        int (*dump_vma)(int, const struct stat *) = CR_PLUGIN_DESC.hooks[CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA];
        struct stat st;
        int fd = open(argv[3], O_RDWR);
        if (fd < 0 || fstat(fd, &st) != 0) {
            perror(argv[3]);
            return 2;
        }
        rc = dump_file(fd, 27) != 0;
        for (long i = 0, n = argc == 5 ? atol(argv[4]) : 1; !rc && i < n; i++) {
            rc = dump_vma(fd, &st) != 0;
        }
    } else if (map) {
        rc = map_placeholders(argc, argv);
    } else {
        for (size_t i = 0; i < g_nrecords; i++) {
            print_record(&g_records[i]);
        }
        if (argc == 4) {
            int (*restore_file)(int) = CR_PLUGIN_DESC.hooks[CR_PLUGIN_HOOK__RESTORE_EXT_FILE];
            struct stat st;
            int fd = restore_file(atoi(argv[3]));
            rc = fd < 0 || fstat(fd, &st) != 0;
            if (!rc) {
                printf("opened %c %u %u\n", S_ISCHR(st.st_mode) ? 'c' : 'b', major(st.st_rdev), minor(st.st_rdev));
            }
        }
    }
    CR_PLUGIN_DESC.exit(dump ? CR_PLUGIN_STAGE__DUMP : CR_PLUGIN_STAGE__RESTORE, rc);
    return rc;
}
