# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Entry point of the restore path of the inferops restore-on-create OCI runtime.

The runtime shim (installed by the inferops.snapshot.snapshot_node role) runs this file with the
node's python3 (``python3 -I``) for the calls it does not pass straight to runc. The collection's
module_utils are installed beside it (``ansible_collections/inferops/snapshot/plugins/module_utils``)
and do the work. If they cannot be loaded, the call is handed to runc unchanged: a broken install
costs the restore, never the container.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import sys
import time
import traceback
import types

CONFIG_ENV = "INFEROPS_RESTORE_CONFIG"


def _alias_six_urllib():
    """Give the collection's control clients ``ansible.module_utils.six.moves.urllib`` from the standard library.

    Ansible bundles six with every module it sends; this node-side program has no Ansible, and
    needs only the two urllib modules the clients import.
    """
    try:
        import ansible.module_utils.six.moves.urllib.request  # noqa: F401  pylint: disable=unused-import
        return
    except ImportError:
        pass
    import urllib.error
    import urllib.request

    names = ("ansible", "ansible.module_utils", "ansible.module_utils.six", "ansible.module_utils.six.moves",
             "ansible.module_utils.six.moves.urllib")
    for name in names:
        module = sys.modules.get(name) or types.ModuleType(name)
        module.__path__ = []
        sys.modules[name] = module
    urllib_alias = sys.modules["ansible.module_utils.six.moves.urllib"]
    urllib_alias.error = urllib.error
    urllib_alias.request = urllib.request
    sys.modules["ansible.module_utils.six.moves.urllib.error"] = urllib.error
    sys.modules["ansible.module_utils.six.moves.urllib.request"] = urllib.request


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
        _alias_six_urllib()
        from ansible_collections.inferops.snapshot.plugins.module_utils import _restore_runtime as runtime
    except Exception:
        _fallback(config_path, argv, "cannot load the restore path: %s" % traceback.format_exc()[-2000:])
        return 127
    return runtime.main(argv, config_path)


if __name__ == "__main__":
    sys.exit(main())
