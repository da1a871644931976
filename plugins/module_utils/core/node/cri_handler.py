# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The restore-on-create runtime as a runtime handler of containerd's CRI plugin (module snapshot_node_containerd,
role snapshot_node). PRIVATE to the inferops.snapshot collection.

containerd 1.6 and 1.7 read their main configuration file, then every file it imports (breadth first, the matches
of a glob sorted), and merge them one plugin at a time: an imported file's ``[plugins."io.containerd.grpc.v1.cri"]``
replaces the whole CRI section, and a map in it (``containerd.runtimes``) replaces the defaults' (the node's
``runc`` handler with them). So the handler is a drop-in that carries the node's whole CRI section -- the section of
the file that defines it without this drop-in, with containerd's defaults filled in by containerd's own ``config
dump`` -- plus the handler: a copy of the node's default runtime (``io.containerd.runc.v2``, its options) with
``options.BinaryName`` the runtime and ``pod_annotations``/``container_annotations`` the collection's keys.

Nothing is written unless containerd's own reading of the configuration (``config dump``) agrees with this one, the
daemon on the socket reads the very file given and runs its CRI plugin, and containerd reads the candidate drop-in
back with the handler in it. containerd loads it at its next start (running pods survive one): ``in_force`` says
whether the daemon started after the drop-in was written.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import json
import math
import os
import re
import shutil
import tempfile

from ..base import layout
from ..base.errors import ParameterError, RuntimeRefusedError
from ..clients import containerd_cli
from ..clients.containerd_cli import ContainerdCli, ContainerdError
from ..linux import fs, proc

try:
    import tomllib
except ImportError:  # Python < 3.11: a clear error where a configuration must be read
    tomllib = None

DEFAULT_CONFIG = "/etc/containerd/config.toml"   # containerd's --config when none is given
CRI = "io.containerd.grpc.v1.cri"                # the CRI plugin's section in the configuration
RUNC_V2 = "io.containerd.runc.v2"
MARK = "# inferops.snapshot: the restore-on-create runtime handler"   # the first line of a drop-in written here
TASKS = "io.containerd.runtime.v2.task"          # below containerd's state: a bundle per running task
BARE_KEY = re.compile(r"\A[A-Za-z0-9_-]+\Z")


class HandlerRefused(RuntimeRefusedError):
    """The handler cannot be registered (or removed) safely: the reason names what to fix. Nothing was written."""


# -- which configuration containerd reads ---------------------------------------------------------------------------

def config_argument(argv):
    """The configuration file a containerd command line names (--config/-c), else containerd's default."""
    for index, word in enumerate(argv[1:], 1):
        for flag in ("--config", "-config", "-c", "--c"):
            if word == flag and index + 1 < len(argv):
                return argv[index + 1]
            if word.startswith(flag + "="):
                return word[len(flag) + 1:]
    return DEFAULT_CONFIG


def daemon(socket, config):
    """{pid, config, started_at, executable} of the containerd listening on ``socket``; HandlerRefused unless it is a
    containerd that reads ``config`` (the role must change the file the daemon reads, nothing else)."""
    pids = proc.unix_listeners(socket)
    if not pids:
        raise HandlerRefused("snapshot_node_containerd_socket: no process listens on %s; give the socket containerd's "
                             "[grpc] address names, on a node where containerd runs" % socket)
    pid = pids[0]
    argv = proc.cmdline(pid)
    name = os.path.basename(argv[0]) if argv else proc.comm(pid)
    if name != "containerd":
        raise HandlerRefused("snapshot_node_containerd_socket: %s is served by %s (pid %d), not by containerd"
                             % (socket, name, pid))
    reads = config_argument(argv)
    if os.path.realpath(reads) != os.path.realpath(config):
        raise HandlerRefused("snapshot_node_containerd_config: the containerd on %s (pid %d) reads %s, not %s; the role "
                             "changes only the configuration the daemon reads: give that file" % (socket, pid, reads, config))
    return {"pid": pid, "config": reads, "started_at": proc.started_at(pid),
            "executable": containerd_cli.daemon_executable(pid)}


def parse(text, where):
    if tomllib is None:
        raise ParameterError("reading containerd's configuration (%s) needs Python 3.11 or later on the node (tomllib); "
                             "use ansible_python_interpreter to point at one" % where)
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise HandlerRefused("%s is no TOML containerd could read: %s" % (where, exc))


def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8")
    except (IOError, OSError) as exc:
        raise HandlerRefused("cannot read %s, which containerd reads: %s" % (path, exc))


def _glob(pattern, present):
    """Go's filepath.Glob for a pattern whose wildcards are in its last component (dot files match too), with the
    files of ``present`` taken to exist; sorted."""
    directory, name = os.path.split(pattern)
    if any(c in directory for c in "*?["):
        raise HandlerRefused("containerd imports %s: a wildcard in a directory is beyond what the role reads" % pattern)
    regex = re.compile(r"\A%s\Z" % "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in name))
    try:
        names = set(os.listdir(directory))
    except (IOError, OSError):
        names = set()
    names.update(os.path.basename(p) for p in present if os.path.dirname(p) == directory)
    return sorted(os.path.join(directory, n) for n in names if regex.match(n))


def load_order(main, present=None):
    """[(path, table)] of every file containerd reads, in its order: ``main``, then what each file imports (breadth
    first; a pattern with '*' is a glob, another path is relative to its file). ``present``: {path: text} of files
    taken as written (the drop-in to be), or None for one that is taken away."""
    present = present or {}
    order, loaded, pending = [], set(), [main]
    while pending:
        path, pending = pending[0], pending[1:]
        if path in loaded:
            continue
        loaded.add(path)
        if path in present and present[path] is None:
            continue
        table = parse(present[path] if path in present else _read(path), path)
        if table.get("version") != 2:
            raise HandlerRefused("%s is a version %s configuration: the role adds a handler to version 2 configurations "
                                 "(containerd 1.5 and later; `containerd config migrate` converts one)"
                                 % (path, table.get("version", 1)))
        order.append((path, table))
        for entry in table.get("imports") or []:
            if "*" in entry:
                pending.extend(_glob(entry, [p for p, text in present.items() if text is not None]))
            else:
                entry = os.path.normpath(entry)
                pending.append(entry if os.path.isabs(entry) else os.path.join(os.path.dirname(path), entry))
    return order


def section_of(order, skip=None):
    """(path, CRI section) of the last file of ``order`` (but ``skip``) that has one: containerd's merge keeps it
    whole; (None, None) when none does (containerd's defaults)."""
    found = (None, None)
    for path, table in order:
        if path != skip and CRI in (table.get("plugins") or {}):
            found = (path, table["plugins"][CRI])
    return found


# -- TOML, written --------------------------------------------------------------------------------------------------

def _key(key):
    return key if BARE_KEY.match(key) else _string(key)


def _string(text):
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(value, where):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return ("-" if value < 0 else "") + "inf" if math.isinf(value) else "nan" if math.isnan(value) else repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[%s]" % ", ".join(_value(item, where) for item in value)
    if isinstance(value, dict):
        return "{%s}" % ", ".join("%s = %s" % (_key(k), _value(v, where)) for k, v in value.items())
    raise HandlerRefused("%s: a %s value is beyond what the role writes into containerd's configuration"
                         % (where, type(value).__name__))


def toml_text(table, path=()):
    """``table`` (what tomllib reads) as TOML: scalars first, then a [header] per nested table."""
    lines = []
    scalars = [(k, v) for k, v in table.items() if not isinstance(v, dict)]
    tables = [(k, v) for k, v in table.items() if isinstance(v, dict)]
    if path and (scalars or not tables):
        lines.append("[%s]" % ".".join(_key(p) for p in path))
    lines.extend("%s = %s" % (_key(k), _value(v, ".".join(path + (k,)))) for k, v in scalars)
    for key, sub in tables:
        lines.append("")
        lines.extend(toml_text(sub, path + (key,)).splitlines())
    return "\n".join(lines).strip("\n") + "\n"


# -- the handler ----------------------------------------------------------------------------------------------------

class RuntimeHandler:
    """One handler on one node: ``present``/``absent`` work out the drop-in, ``apply`` writes or removes it."""

    def __init__(self, name, binary, config, socket, dropin, state_dir, runc_root=None, annotations=(), cli=None):
        self.name, self.binary, self.config, self.socket = name, binary, config, socket
        self.dropin, self.state_dir, self.runc_root, self.annotations = dropin, state_dir, runc_root, list(annotations)
        self.cli = cli or ContainerdCli(socket)
        self.daemon = None
        self.source = None

    def _dump(self, config):
        try:
            return self.cli.config_dump(config)
        except ContainerdError as exc:
            raise HandlerRefused("containerd cannot read its configuration, so the role cannot tell which one is in force: "
                                 "%s" % exc.msg)

    def _dump_text(self, text):
        """containerd's reading (dump) of a configuration given as text, as a table."""
        work = tempfile.mkdtemp(prefix="inferops-containerd-")
        try:
            path = os.path.join(work, "config.toml")
            with open(path, "w") as handle:
                handle.write(text)
            return parse(self._dump(path), "containerd's reading of %s" % path)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def current(self):
        """The drop-in's text, or None; HandlerRefused for a file there that this module did not write."""
        if not os.path.lexists(self.dropin):
            return None
        text = _read(self.dropin) if os.path.isfile(self.dropin) and not os.path.islink(self.dropin) else ""
        if not text.startswith(MARK):
            raise HandlerRefused("snapshot_node_containerd_dropin: %s exists and was not written by the role; give another "
                                 "path below a directory containerd imports" % self.dropin)
        return text

    def inspect(self):
        """The daemon on the socket (reading ``config``, its CRI plugin loaded) and containerd's own list of the files
        it reads, checked against this module's reading of the imports."""
        self.daemon = daemon(self.socket, self.config)
        if self.daemon["executable"]:
            self.cli.containerd = self.daemon["executable"]
        try:
            status = self.cli.plugins().get(containerd_cli.CRI_PLUGIN)
        except ContainerdError as exc:
            raise HandlerRefused("cannot ask the containerd on %s which plugins it runs: %s" % (self.socket, exc.msg))
        if status != "ok":
            raise HandlerRefused("the containerd on %s runs without its CRI plugin (%s): kubelet cannot use it and no runtime "
                                 "handler can be added; check disabled_plugins in %s and containerd's log"
                                 % (self.socket, "status %s" % status if status else "not loaded", self.config))
        dumped = parse(self._dump(self.config), "containerd's reading of %s" % self.config)
        order = load_order(self.config)
        ours = set(p for p, _t in order) - set([self.config])
        theirs = set(dumped.get("imports") or []) - set([self.config])
        if ours != theirs:
            raise HandlerRefused("containerd reads %s besides %s, the role's reading of its imports found %s: the role "
                                 "cannot tell which configuration is in force"
                                 % (", ".join(sorted(theirs)) or "nothing", self.config,
                                    ", ".join(sorted(ours)) or "nothing"))
        return order

    def desired(self):
        """The drop-in's text that registers the handler; HandlerRefused when containerd would not read it so."""
        order = load_order(self.config, {self.dropin: "version = 2\n"})
        paths = [p for p, _t in order]
        if self.dropin not in paths:
            raise HandlerRefused("snapshot_node_containerd_dropin: %s does not import %s; add a pattern that matches it to "
                                 "its imports (imports = [\"%s/*.toml\"]) or give a path it imports"
                                 % (self.config, self.dropin, os.path.dirname(self.dropin)))
        later = [p for p, t in order[paths.index(self.dropin) + 1:] if CRI in (t.get("plugins") or {})]
        if later:
            raise HandlerRefused("%s replace the CRI section after %s, which would not be in force: give a drop-in path "
                                 "that sorts after them" % (", ".join(later), self.dropin))
        self.source, raw = section_of(load_order(self.config, {self.dropin: None}))
        base = self._dump_text("version = 2\n\n" + (toml_text({"plugins": {CRI: raw}}) if raw is not None else ""))
        section = base["plugins"][CRI]
        runtimes = section.setdefault("containerd", {}).setdefault("runtimes", {})
        if self.name in runtimes:
            raise HandlerRefused("snapshot_node_runtime_name: %s already has a runtime handler %s; give another name"
                                 % (self.source or "containerd's defaults", self.name))
        runtimes[self.name] = self.entry(section)
        text = "\n".join([
            "%s %s (role inferops.snapshot.snapshot_node)." % (MARK, self.name),
            "# containerd merges each imported file's plugin sections whole: this one carries the CRI section of",
            "# %s as containerd read it when the role ran, plus the handler. Change that section there and run" % (
                self.source or "containerd's defaults"),
            "# the role again; remove the handler with snapshot_node_state=absent.",
            "version = 2", "", toml_text({"plugins": {CRI: section}})])
        self.check_reading(text, section)
        return text

    def entry(self, section):
        """The handler: a copy of the node's default runtime with the runtime as its binary."""
        default = section["containerd"].get("default_runtime_name") or "runc"
        base = section["containerd"]["runtimes"].get(default)
        if not base or base.get("runtime_type") != RUNC_V2:
            raise HandlerRefused("the default runtime %s of %s is %s, not %s: the handler copies its runc options"
                                 % (default, self.source or "containerd's defaults",
                                    (base or {}).get("runtime_type") or "not configured", RUNC_V2))
        entry = copy.deepcopy(base)
        entry["pod_annotations"] = list(self.annotations)
        entry["container_annotations"] = list(self.annotations)
        options = dict(entry.get("options") or {}, BinaryName=self.binary)
        if self.runc_root:
            options["Root"] = self.runc_root
        entry["options"] = options
        return entry

    def check_reading(self, text, section):
        """containerd reads the drop-in back with the handler as written and everything else as it was."""
        read = self._dump_text(text)["plugins"][CRI]
        handler = ((read.get("containerd") or {}).get("runtimes") or {}).get(self.name) or {}
        if (handler.get("options") or {}).get("BinaryName") != self.binary or \
                handler.get("pod_annotations") != self.annotations:
            raise HandlerRefused("containerd does not read the handler %s back as written: %s" % (self.name, handler))

    def present(self):
        """{before, after, changed, in_force, source}: the drop-in now and as it should be."""
        self.inspect()
        before, after = self.current(), self.desired()
        return dict(self._state(before, after), source=self.source)

    def absent(self, force=False):
        users = self.users()
        if users and not force:
            raise HandlerRefused("pods still run with the runtime handler %s: %s; containerd could not stop or delete them "
                                 "once its binary is gone. Delete them first, or set snapshot_node_force_remove=true"
                                 % (self.name, ", ".join(users)))
        before = self.current()
        try:
            self.daemon = daemon(self.socket, self.config)
        except HandlerRefused:
            self.daemon = None  # nothing runs to be told: the file alone goes
        return dict(self._state(before, None), users=users)

    def _state(self, before, after):
        written = os.path.getmtime(self.dropin) if before is not None else None
        started = (self.daemon or {}).get("started_at")
        if after is not None:
            in_force = before == after and started is not None and written <= started
        else:  # removed: the daemon forgets it at its next start after the drop-in's directory changed
            parent = os.path.dirname(self.dropin)
            in_force = before is None and (started is None or not os.path.isdir(parent)
                                           or os.path.getmtime(parent) <= started)
        return {"before": before, "after": after, "changed": before != after, "in_force": in_force,
                "daemon": self.daemon}

    def users(self):
        """'<namespace>/<pod> (<container id>)' of every task whose bundle runs the handler's binary."""
        found = []
        root = os.path.join(self.state_dir, TASKS)
        for namespace in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            for task in sorted(os.listdir(os.path.join(root, namespace))):
                bundle = os.path.join(root, namespace, task)
                options = fs.read_json(os.path.join(bundle, "options.json")) or {}
                if options.get("binary_name") != self.binary:
                    continue
                notes = (fs.read_json(os.path.join(bundle, "config.json")) or {}).get("annotations") or {}
                _runtime, pod_namespace, pod_name, _container, _kind = layout.CRI_REQUESTER_KEYS[0]
                found.append("%s/%s (%s)" % (notes.get(pod_namespace), notes[pod_name], task[:12])
                             if notes.get(pod_name) else "%s/%s" % (namespace, task[:12]))
        return found

    def apply(self, text):
        """Write the drop-in (``text``), or remove it (None)."""
        if text is not None:
            if not os.path.isdir(os.path.dirname(self.dropin)):  # an existing one keeps its mode
                fs.ensure_dir(os.path.dirname(self.dropin), 0o755)
            fs.write_file_atomic(self.dropin, text.encode("utf-8"), 0o644)
        elif os.path.lexists(self.dropin):
            os.unlink(self.dropin)
            fs.fsync_dir(os.path.dirname(self.dropin))
