# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CRIU images the collection reads (and the one it rewrites), parsed without CRIU.
PRIVATE to the inferops.snapshot collection.

As in CRIU's ``lib/pycriu/images/images.py``: ``IMAGE ::= [COMMON or SERVICE magic] MAGIC { SIZE MESSAGE }``, and
a table (``HANDLERS``) keyed by the image's magic says which file holds it and how one entry is decoded. Only the
images the collection needs are in it, with enough of protobuf's wire format for their entries; anything else is a
ValueError naming the file. The NPU plugin's image (``layout.NPU_PLUGIN_IMAGE``) is text, not protobuf: its own
reader is at the end. The CRIU binary, its logs and work dirs are ``clients/criu_cli.py``'s.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import struct

from ..base import layout
from ..base.protowire import fields as _pb_fields, varint as _varint

# criu/include/magic.h
IMG_COMMON_MAGIC = 0x54564319
IMG_SERVICE_MAGIC = 0x55105940
PSTREE_MAGIC = 0x50273030
FILE_LOCKS_MAGIC = 0x54323616
FILES_MAGIC = 0x56303138
PSTREE_IMAGE = "pstree.img"
FILE_LOCKS_IMAGE = "filelocks.img"
FILES_IMAGE = "files.img"
# criu/include/file-lock.h: the lock's style (flag) and, for POSIX locks, fcntl's F_RDLCK / F_WRLCK (type)
FL_POSIX = 1
F_RDLCK, F_WRLCK = 0, 1
FD_TYPE_INETSK = 4          # fdinfo.proto fd_types
AF_INET, AF_INET6 = 2, 10


# -- protobuf's wire format, as much as CRIU's entries need (read by base/protowire.py) ----------------------

def _signed(value):
    """A protobuf int32/int64 read as a varint: negative values are two's complement on 64 bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _pb_varint(value):
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _pb_encode(fields):
    """(number, wire type, value) back into a protobuf message (the inverse of _pb_fields)."""
    out = bytearray()
    for number, wire, value in fields:
        out += _pb_varint(number << 3 | wire)
        if wire == 0:
            out += _pb_varint(value)
        elif wire == 2:
            out += _pb_varint(len(value)) + value
        else:
            out += value
    return bytes(out)


# -- one entry of each image we read ------------------------------------------------------------------

def _pstree_entry(message):
    """One pstree_entry, as (pid, [thread ids])."""
    pid, threads = None, []
    for number, wire, value in _pb_fields(message):
        if number == 1 and wire == 0:  # pstree_entry.pid
            pid = value
        elif number == 5 and wire == 0:  # pstree_entry.threads, one by one
            threads.append(value)
        elif number == 5 and wire == 2:  # ... or packed
            offset = 0
            while offset < len(value):
                tid, offset = _varint(value, offset)
                threads.append(tid)
    if not pid:
        raise ValueError("%s has an entry without a pid" % PSTREE_IMAGE)
    return pid, threads


def _file_lock_entry(message):
    """One file_lock_entry, as {flag, type, pid, fd, start, len} (the signed ones as such)."""
    entry = dict((number, value) for number, wire, value in _pb_fields(message) if wire == 0)
    if not {1, 2, 3, 4, 5, 6} <= set(entry):
        raise ValueError("%s has an entry without all of flag, type, pid, fd, start and len" % FILE_LOCKS_IMAGE)
    return {"flag": entry[1], "type": entry[2], "pid": _signed(entry[3]), "fd": _signed(entry[4]),
            "start": _signed(entry[5]), "len": _signed(entry[6])}


class Handler:
    """One kind of image: the file that holds it, what it holds (for errors), how one entry is decoded."""

    def __init__(self, name, what, entry):
        self.name, self.what, self.entry = name, what, entry


HANDLERS = {
    PSTREE_MAGIC: Handler(PSTREE_IMAGE, "pstree", _pstree_entry),
    FILE_LOCKS_MAGIC: Handler(FILE_LOCKS_IMAGE, "file locks", _file_lock_entry),
    FILES_MAGIC: Handler(FILES_IMAGE, "files", lambda message: list(_pb_fields(message))),
}


def _messages(data, magic):
    """(header bytes, [protobuf messages]) of an image's bytes that must carry ``magic`` (a key of HANDLERS)."""
    name, what = HANDLERS[magic].name, HANDLERS[magic].what
    if len(data) < 8:
        raise ValueError("%s is too short to be a CRIU image" % name)
    first, second = struct.unpack_from("<II", data, 0)
    found, pos = (second, 8) if first in (IMG_COMMON_MAGIC, IMG_SERVICE_MAGIC) else (first, 4)
    if found != magic:
        raise ValueError("%s has magic 0x%08x, not CRIU's %s magic" % (name, found, what))
    header, messages = data[:pos], []
    while pos < len(data):
        if pos + 4 > len(data):
            raise ValueError("%s is truncated" % name)
        size = struct.unpack_from("<I", data, pos)[0]
        message = data[pos + 4:pos + 4 + size]
        if len(message) != size:
            raise ValueError("%s is truncated" % name)
        pos += 4 + size
        messages.append(message)
    return header, messages


def load(images_dir, magic):
    """The decoded entries of the image of ``magic`` in ``images_dir``. ValueError for an image that is not that one
    (IOError/OSError when it cannot be read)."""
    handler = HANDLERS[magic]
    with open(os.path.join(images_dir, handler.name), "rb") as handle:
        data = handle.read()
    return [handler.entry(message) for message in _messages(data, magic)[1]]


def read_pstree(images_dir):
    """The checkpointed process tree from CRIU's ``pstree.img``: [(pid, [thread ids])], root first.

    A bare process is restored with these very pids and thread ids, so they must be free. Raises
    ValueError (IOError/OSError when the file cannot be read) for an image this parser does not know.
    """
    tree = load(images_dir, PSTREE_MAGIC)
    if not tree:
        raise ValueError("%s holds no process" % PSTREE_IMAGE)
    return tree


def read_posix_locks(images_dir):
    """The POSIX (fcntl) locks the checkpointed processes held, from CRIU's ``filelocks.img`` (written with
    --file-locks): [{"pid" (in the checkpoint's pid namespace), "fd", "type" ("read"/"write"), "start",
    "len" (0: to the end of the file)}]. An image without the file held none. flock, OFD locks and leases
    belong to the open file, not the process, and are left out. ValueError for an image this parser does not
    know."""
    if not os.path.exists(os.path.join(images_dir, FILE_LOCKS_IMAGE)):
        return []
    locks = []
    for entry in load(images_dir, FILE_LOCKS_MAGIC):
        if not entry["flag"] & FL_POSIX:
            continue
        if entry["type"] not in (F_RDLCK, F_WRLCK):
            raise ValueError("%s has a POSIX lock of unknown type %d" % (FILE_LOCKS_IMAGE, entry["type"]))
        locks.append({"pid": entry["pid"], "fd": entry["fd"], "type": "read" if entry["type"] == F_RDLCK else "write",
                      "start": entry["start"], "len": entry["len"]})
    return locks


# -- the inet sockets' local address: a pod that comes back with a new IP ------------------------------

def _words_ip(words):
    """An inet_sk_entry address (repeated uint32, network-order bytes read little-endian) as text."""
    raw = b"".join(struct.pack("<I", w) for w in words)
    if len(raw) == 4:
        return ".".join(str(b) for b in raw)
    if len(raw) == 16 and raw[:12] == b"\0" * 10 + b"\xff\xff":
        return "::ffff:" + ".".join(str(b) for b in raw[12:])
    return None


def _is_local_only(text):
    """Addresses no pod owns: the wildcard and the loopback range (IPv4, or mapped into IPv6)."""
    plain = text[7:] if text.startswith("::ffff:") else text
    return plain == "0.0.0.0" or plain.startswith("127.")


def remap_inet_addresses(data, new_ipv4):
    """CRIU's files.img (its bytes) with every inet socket's local address that belonged to the old pod -- neither
    the wildcard nor loopback -- replaced by ``new_ipv4`` (IPv4, or IPv4 mapped into IPv6), and the peer address of
    a socket connected to its own pod with it: what MindCluster's patched CRIU does with INETSK_LOCAL_IPV4_KEY, which
    upstream CRIU 4.2.1 has no option for (its restore binds each socket to the recorded address). Returns (new bytes,
    sorted old addresses); the bytes are ``data`` itself when nothing is bound to an old pod address. ValueError for
    an image this parser does not know."""
    header, messages = _messages(data, FILES_MAGIC)
    octets = [int(part) for part in new_ipv4.split(".")]
    if len(octets) != 4 or not all(0 <= o <= 255 for o in octets):
        raise ValueError("%r is not an IPv4 address" % new_ipv4)
    v4 = [struct.unpack("<I", bytes(octets))[0]]
    mapped = [0, 0, struct.unpack("<I", b"\0\0\xff\xff")[0]] + v4
    out, old, changed = bytearray(header), set(), False
    for message in messages:
        entry = HANDLERS[FILES_MAGIC].entry(message)
        kind = [v for n, w, v in entry if n == 1 and w == 0]
        if kind != [FD_TYPE_INETSK]:
            out += struct.pack("<I", len(message)) + message
            continue
        sk = [list(f) for f in next(_pb_fields(v) for n, w, v in entry if n == 4 and w == 2)] if any(
            n == 4 for n, _w, _v in entry) else []
        family = [v for n, w, v in sk if n == 3 and w == 0]
        src = [v for n, w, v in sk if n == 11 and w == 0]
        dst = [v for n, w, v in sk if n == 12 and w == 0]
        text = _words_ip(src) if family in ([AF_INET], [AF_INET6]) and src else None
        if text is None or _is_local_only(text):
            out += struct.pack("<I", len(message)) + message
            continue
        old.add(text)
        new = v4 if len(src) == 1 else mapped
        kept = [f for f in sk if f[0] not in (11, 12)]
        fields = kept + [[11, 0, w] for w in new] + [[12, 0, w] for w in (new if dst == src else dst)]
        fields.sort(key=lambda f: f[0])  # stable: repeated fields keep their order
        body = _pb_encode(fields)
        message = _pb_encode([(n, w, body if n == 4 else v) for n, w, v in entry])
        out += struct.pack("<I", len(message)) + message
        changed = True
    return (bytes(out) if changed else data), sorted(old)


# -- the NPU plugin's image (text), in the grammar of docs/simulator.md's "The plugin's text formats" ---------------
NPU_IMAGE_HEADER = "inferops-npu-plugin v1"
NPU_MAX_RECORDS = 65536  # the plugin's MAX_RECORDS: records of the image (the plugin counts them at dump)
NPU_MAX_TARGETS = 256    # the plugin's MAX_TARGETS: entries of one targets text
NPU_PATH_MAX = 4095     # the plugin's PATH_TOKEN_MAX: a path's bytes as written (escaped)
_NPU_SAFE = frozenset(bytearray(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/._+-"))
_NPU_TAIL = br" (?P<type>[cb]) (?P<major>0|[1-9][0-9]{0,9}) (?P<minor>0|[1-9][0-9]{0,9}) (?P<path>/[A-Za-z0-9/._+%-]*)"
_NPU_RECORDS = (("fds", re.compile(br"fd (?P<id>0|[1-9][0-9]{0,9}) (?P<flags>0|[1-9a-f][0-9a-f]{0,7})" + _NPU_TAIL)),
                ("vmas", re.compile(b"vma" + _NPU_TAIL)))


def read_npu_devices(images_dir):
    """What the NPU plugin recorded (layout.NPU_PLUGIN_IMAGE): {"fds": [{"id", "flags", "type" ("c"/"b"), "major",
    "minor", "path"}], "vmas": [{"type", "major", "minor", "path"}]}, or None when the process held no NPU device.
    ValueError for anything the grammar does not allow, as the plugin refuses it."""
    try:
        with open(os.path.join(images_dir, layout.NPU_PLUGIN_IMAGE), "rb") as handle:
            data = handle.read()
    except (IOError, OSError):
        return None
    head = NPU_IMAGE_HEADER.encode() + b"\n"
    lines = data[len(head):].split(b"\n")
    if not data.startswith(head) or len(lines) - 1 > NPU_MAX_RECORDS or lines[-1]:
        raise ValueError("%s is not an image of the NPU plugin: its first line is not %r, it has over %d records, or "
                         "its last lacks its newline" % (layout.NPU_PLUGIN_IMAGE, NPU_IMAGE_HEADER, NPU_MAX_RECORDS))
    found = {"fds": [], "vmas": []}
    for number, line in enumerate(lines[:-1], 1):
        key, record = _npu_record(line)
        if record is None:
            raise ValueError("%s: record %d is malformed (docs/simulator.md, \"The plugin's text formats\"), "
                             "truncated, or not the plugin's: %r" % (layout.NPU_PLUGIN_IMAGE, number, line[:200]))
        found[key].append(record)
    return found


def _npu_record(line):
    """(key of read_npu_devices' answer, record) of one line of the image without its LF, or (None, None)."""
    for key, pattern in _NPU_RECORDS:
        match = pattern.fullmatch(line)
        path = match and npu_unquote(match.group("path"))
        numbers = dict((name, int(value, 16 if name == "flags" else 10)) for name, value in
                       match.groupdict().items() if name not in ("type", "path")) if path else {}
        if path and max(numbers.values()) <= 0xFFFFFFFF:
            numbers.update(type=match.group("type").decode(), path=path)
            return key, numbers
    return None, None


def npu_quote(path):
    """``path`` as the grammar's path: every byte outside [A-Za-z0-9/._+-] as %XX (what the plugin writes)."""
    return "".join(chr(b) if b in _NPU_SAFE else "%%%02X" % b for b in bytearray(os.fsencode(path)))


def npu_unquote(token):
    """The path the grammar's path ``token`` (bytes) spells, or None: over NPU_PATH_MAX, or an escape that is not
    the one spelling npu_quote writes (uppercase, of a byte it escapes, never NUL)."""
    raw = re.sub(br"%([0-9A-F]{2})", lambda m: bytes([int(m.group(1), 16)]), token)
    if len(token) > NPU_PATH_MAX or b"\0" in raw or npu_quote(raw).encode() != token:
        return None
    return os.fsdecode(raw)
