"""Helpers for the tests that run the roles and playbooks with ansible-playbook (test_roles*.py,
test_multihost*.py): run a playbook against an inventory and read back what the roles reported."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import BIN, COLLECTIONS, REPO, ensure_collection_link

PLAYBOOKS = REPO / "playbooks"
FACTS = ("snapshot_generate_outcome", "snapshot_generate_results", "snapshot_generate_engines",
         "snapshot_restore_results", "snapshot_verify_results", "snapshot_cleanup_result")


class PlaybookRun:
    def __init__(self, proc, facts):
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.facts = facts
        self.recap = recap(proc.stdout)

    def __repr__(self):
        failures = [line[:1500] for line in self.stdout.splitlines()
                    if line.startswith(("fatal:", "failed:")) or "[ERROR]" in line]
        return "PlaybookRun(rc=%s)\n--- failures\n%s\n--- stdout (tail)\n%s\n--- stderr (tail)\n%s" % (
            self.rc, "\n".join(failures[:10]), self.stdout[-3000:], self.stderr[-2000:])


def recap(stdout):
    """{host: {'ok': n, 'changed': n, 'failed': n, ...}} from the PLAY RECAP."""
    found = {}
    for host, counts in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", stdout, flags=re.M):
        found[host] = dict((key, int(value)) for key, value in re.findall(r"(\w+)=(\d+)", counts))
    return found


def run_playbook(tmp_path, playbook, inventory, extra_vars=None, check=False, env=None, timeout=900,
                 wrapper=None, popen=False, prefix=()):
    """Run ``playbook`` (a path, or a name under playbooks/) and then dump the roles' facts of every host.

    ``inventory`` is a dict in the YAML inventory shape. ``prefix`` is put before the command (e.g.
    ``ip netns exec NS``). Returns a PlaybookRun (or the Popen and the path the facts will be dumped to,
    with ``popen=True``).
    """
    ensure_collection_link()
    tmp_path = Path(tmp_path)
    tmp_path.mkdir(parents=True, exist_ok=True)
    number = len(list(tmp_path.glob("main-*.yml")))
    inventory_file = tmp_path / ("inventory-%d.json" % number)
    inventory_file.write_text(json.dumps(inventory))
    facts_file = tmp_path / ("run-%d.json" % number)
    playbook = Path(playbook) if os.path.isabs(str(playbook)) else PLAYBOOKS / playbook
    main = tmp_path / ("main-%d.yml" % number)
    facts = ", ".join("'%s'" % fact for fact in FACTS)
    dump = ("{ {% for h in groups['all'] %}\"{{ h }}\": { {% for f in [" + facts + "] %}\"{{ f }}\": "
            "{{ hostvars[h][f] | default(none) | to_json }}{{ ',' if not loop.last else '' }}{% endfor %} }"
            "{{ ',' if not loop.last else '' }}{% endfor %} }")
    main.write_text(
        "- import_playbook: %s\n"
        "- name: Dump what the roles reported on every host\n"
        "  hosts: localhost\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: Dump\n"
        "      ansible.builtin.copy:\n"
        "        content: %s\n"
        "        dest: %s\n"
        "        mode: '0600'\n"
        "      check_mode: false\n"
        % (wrapper or playbook, json.dumps(dump), facts_file))
    command = list(prefix) + [str(BIN / "ansible-playbook"), "-i", str(inventory_file), str(main)]
    for item in extra_vars or []:
        command += ["-e", json.dumps(item) if isinstance(item, dict) else item]
    if check:
        command.append("--check")
    full_env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_NOCOLOR="1",
                    ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_LOCALHOST_WARNING="False",
                    ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    full_env.update(env or {})
    if popen:
        return subprocess.Popen(command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), facts_file
    proc = subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=timeout, check=False)
    return PlaybookRun(proc, json.loads(facts_file.read_text()) if facts_file.exists() else {})


def finish(popen_and_file, timeout=900):
    proc, facts_file = popen_and_file
    stdout, stderr = proc.communicate(timeout=timeout)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return PlaybookRun(done, json.loads(facts_file.read_text()) if facts_file.exists() else {})


def status_record(snapshot_dir):
    parent, name = os.path.split(str(snapshot_dir).rstrip("/"))
    path = os.path.join(parent, "." + name + ".status.json")
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return json.load(handle)


def local_inventory(**host_vars):
    """One host, 'npu-host', reached with the local connection, running modules with this interpreter."""
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    host.update(host_vars)
    return {"all": {"hosts": {"npu-host": host}}}
