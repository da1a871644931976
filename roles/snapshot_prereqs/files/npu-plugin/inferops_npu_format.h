/*
 * inferops_npu_format.h - the contract the collection's CRIU NPU plugin shares with the Python side: its names
 * (core/base/layout.py holds the same values; tests/unit/core/store/test_criu_images_npu_plugin.py ties them) and the
 * one grammar of its text formats, docs/simulator.md "The plugin's text formats" (FORMATS), as the plugin reads and
 * writes it. core/store/criu_images.py reads the image and core/store/device.py writes the numbering by the same
 * grammar. Included by inferops_npu_plugin.c only (one translation unit: static functions).
 *
 * Part of the inferops.snapshot Ansible collection (GPL-3.0-or-later).
 */
#ifndef INFEROPS_NPU_FORMAT_H
#define INFEROPS_NPU_FORMAT_H

#include <stdio.h>
#include <string.h>

#define INFEROPS_NPU_MARKER "[inferops-npu-plugin]"
#define IMAGE_NAME "inferops-npu.img"
#define TARGETS_FILE "inferops-npu-devices"
#define TARGETS_ENV "INFEROPS_NPU_DEVICES"
#define IMAGE_HEADER "inferops-npu-plugin v1\n"
/* the device files an Ascend container is given (the Ascend Docker Runtime's default mounts) and the HAL opens */
#define CHIP_PREFIX "davinci"             /* davinci<N>, one a chip */
#define MANAGER_NAME "davinci_manager"    /* the HAL's interface to every sub-module (svm, tsdrv, dms, ...) */
#define MANAGER_CUST_NAME "npu_device_cust" /* the HAL's fallback when the manager is not accessible */
#define SVM_NAME "devmm_svm"              /* shared virtual memory */
#define HDC_NAME "hisi_hdc"               /* host-device communication over PCIe */
#define RECREATE_LOCK "/run/inferops-npu-plugin.lock"
#define FORMATS "docs/simulator.md, \"The plugin's text formats\""
/* the grammar's limits (criu_images.py has them too) */
#define MAX_RECORDS 65536   /* records of the image: counted at dump, where one more fails the dump */
#define MAX_TARGETS 256     /* entries of one targets text */
#define PATH_TOKEN_MAX 4095 /* bytes of a path as written (escaped) */
#define TARGETS_MAX 16383   /* bytes of one targets text */

typedef struct {
    int kind;          /* 'f' descriptor, 'v' mapping, 't' target numbering of this node */
    unsigned int id;   /* descriptor: CRIU's file id */
    int flags;         /* descriptor: open flags */
    char type;         /* 'c' or 'b' */
    unsigned int major, minor;
    char *path;        /* allocated */
} record_t;

/* -- names ------------------------------------------------------------------------------------------------ */

static const char *base_name(const char *path)
{
    const char *base = strrchr(path, '/');
    return base ? base + 1 : path;
}

/* A chip's node: davinci<N> (by name, wherever its directory is). */
static int is_chip_path(const char *path)
{
    const char *base = base_name(path);
    size_t n = strlen(CHIP_PREFIX);
    if (strncmp(base, CHIP_PREFIX, n) != 0 || base[n] == '\0') {
        return 0;
    }
    for (const char *p = base + n; *p; p++) {
        if (*p < '0' || *p > '9') {
            return 0;
        }
    }
    return 1;
}

/* An NPU node: a chip, the manager or its fallback, devmm_svm, hisi_hdc (by name, wherever its directory is). */
static int is_npu_path(const char *path)
{
    const char *base = base_name(path);
    return is_chip_path(path) || strcmp(base, MANAGER_NAME) == 0 || strcmp(base, MANAGER_CUST_NAME) == 0 ||
           strcmp(base, SVM_NAME) == 0 || strcmp(base, HDC_NAME) == 0;
}

static int is_safe(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || (c && strchr("/._+-", c));
}

static int hex_upper(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* in as the grammar's path: every byte outside is_safe as %XX. 0, or -1 when that is over PATH_TOKEN_MAX bytes
 * (cut short, it would name another file at restore). */
static int escape(const char *in, char out[PATH_TOKEN_MAX + 1])
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
        if (o + (is_safe(*p) ? 1 : 3) > PATH_TOKEN_MAX) {
            return -1;
        }
        if (is_safe(*p)) {
            out[o++] = (char)*p;
        } else {
            o += (size_t)snprintf(out + o, 4, "%%%02X", *p);
        }
    }
    out[o] = '\0';
    return 0;
}

/* The grammar's path at p decoded into out: the end of it, or NULL where there is none (not starting with '/',
 * over PATH_TOKEN_MAX bytes, an escape not of the one spelling escape() writes). */
static const char *path_token(const char *p, char out[PATH_TOKEN_MAX + 1])
{
    const char *start = p;
    size_t o = 0;
    for (int hi, lo;; o++) {
        if (is_safe((unsigned char)*p)) {
            out[o] = *p++;
        } else if (*p == '%' && (hi = hex_upper(p[1])) >= 0 && (lo = hex_upper(p[2])) >= 0 && hi + lo > 0 &&
                   !is_safe(hi * 16 + lo)) {
            out[o] = (char)(hi * 16 + lo);
            p += 3;
        } else {
            break;
        }
        if (p - start > PATH_TOKEN_MAX) {
            return NULL;
        }
    }
    out[o] = '\0';
    return o > 0 && out[0] == '/' ? p : NULL;
}

/* The grammar's number at p, as printf's %u (base 10) or %x (base 16) writes one: no sign, no leading zero, lowercase,
 * under 2^32. The end of it, or NULL. */
static const char *number(const char *p, unsigned int base, unsigned int *out)
{
    unsigned long long value = 0;
    const char *start = p;
    for (;; p++) {
        int digit = *p >= '0' && *p <= '9' ? *p - '0' : base == 16 && *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 : -1;
        if (digit < 0) {
            break;
        }
        if ((p > start && *start == '0') || (value = value * base + (unsigned int)digit) > 0xffffffffULL) {
            return NULL;
        }
    }
    *out = (unsigned int)value;
    return p > start ? p : NULL;
}

/* One line of the image (the grammar's record, its LF included) into r, its path into path: 0, or -1. */
static int parse_record(const char *p, record_t *r, char path[PATH_TOKEN_MAX + 1])
{
    unsigned int flags = 0;
    if (strncmp(p, "fd ", 3) == 0) {
        r->kind = 'f';
        if (!(p = number(p + 3, 10, &r->id)) || *p++ != ' ' || !(p = number(p, 16, &flags)) || *p++ != ' ') {
            return -1;
        }
    } else if (strncmp(p, "vma ", 4) == 0) {
        r->kind = 'v';
        p += 4;
    } else {
        return -1;
    }
    r->flags = (int)flags;
    r->type = *p;
    if ((*p != 'c' && *p != 'b') || p[1] != ' ' || !(p = number(p + 2, 10, &r->major)) || *p++ != ' ' ||
        !(p = number(p, 10, &r->minor)) || *p++ != ' ' || !(p = path_token(p, path))) {
        return -1;
    }
    return strcmp(p, "\n") == 0 ? 0 : -1;
}

#endif
