/*
 * CRIU's side of the collection's NPU plugin, for test_criu_images_npu_plugin.py: the plugin's own source, compiled
 * with build.sh's warnings, given an images directory and a log the way CRIU gives them, and driven through the hooks
 * it registers (CR_PLUGIN_DESC).
 *   npu_plugin_harness restore DIR [ID]  init(RESTORE); prints the records it then holds, one a line: "f ID FLAGS
 *                                        TYPE MAJOR MINOR PATH", "v TYPE MAJOR MINOR PATH", "t TYPE MAJOR MINOR PATH"
 *                                        (PATH in hex); with ID, then RESTORE_EXT_FILE(ID): "opened TYPE MAJOR MINOR"
 *   npu_plugin_harness dump DIR PATH     init(DUMP), then DUMP_EXT_FILE and HANDLE_DEVICE_VMA of PATH opened
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
    int dump = argc == 4 && strcmp(argv[1], "dump") == 0, rc = 0;
    if ((argc != 3 && argc != 4) || (!dump && strcmp(argv[1], "restore") != 0) ||
        (g_image_dir = open(argv[2], O_RDONLY | O_DIRECTORY)) < 0) {
        fprintf(stderr, "usage: %s restore DIR [ID] | dump DIR PATH\n", argv[0]);
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
        rc = dump_file(fd, 27) != 0 || dump_vma(fd, &st) != 0;
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
