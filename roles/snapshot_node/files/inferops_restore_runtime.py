# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Entry point of the restore path of the inferops restore-on-create OCI runtime.

The runtime shim (installed by the inferops.snapshot.snapshot_node role) runs this file with the
node's python3 (``python3 -I``) for the calls it does not pass straight to runc. The collection's
standard-library core (``plugins/module_utils/core``) is installed beside it as the package
``inferops_snapshot`` and does the work. If it cannot be loaded, the call is handed to runc
unchanged: a broken install costs the restore, never the container.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import sys
import time
import traceback

CONFIG_ENV = "INFEROPS_RESTORE_CONFIG"
PACKAGE = "inferops_snapshot"


def _fallback(config_path, argv, error):
    """Log why the restore path could not run, then behave exactly like runc."""
    config = {}
    try:
        with open(config_path) as handle:
            config = json.load(handle)
    except Exception:  # no config: runc from PATH, the default log
        pass
    try:
        record = {"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "event": "error", "pid": os.getpid(),
                  "argv": argv, "error": error}
        fd = os.open(config.get("log_file") or "/var/log/inferops-restore-runtime.log",
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
        finally:
            os.close(fd)
    except Exception:  # never write to stdout/stderr: they are the container's
        pass
    runc = config.get("runc") or "runc"
    if os.path.isabs(runc):
        os.execv(runc, [runc] + argv)
    os.execvp(runc, [runc] + argv)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    config_path = os.environ.pop(CONFIG_ENV, None) or os.path.join(here, "runtime.json")
    argv = sys.argv[1:]
    try:
        sys.path.insert(0, here)
        runtime = __import__(PACKAGE + ".node.runtime", fromlist=["main"])
    except Exception:
        _fallback(config_path, argv, "cannot load the restore path: %s" % traceback.format_exc()[-2000:])
        return 127
    return runtime.main(argv, config_path)


if __name__ == "__main__":
    sys.exit(main())
