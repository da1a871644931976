"""docs/fleet.md's walkthroughs stay true to the code: the pod template env it shows is what
k8s/service.restore_template_env builds (own restore and clone), every collection module task in its
playbooks uses only options the module has (with sub-options), and the rulebook command's variables are
the ones the sample rulebook reads. The integration tests run the same steps (test_fleet_k8s.py,
test_fleet_clone.py, test_fleet_eda.py); this keeps the text itself from drifting away from them."""

import re
import textwrap

import yaml

from conftest import REPO
from unit.project.test_docs import gen

from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import service as svc

FLEET = (REPO / "docs" / "fleet.md").read_text()
BLOCKS = [yaml.safe_load(textwrap.dedent(block)) for block in re.findall(r"```yaml\n(.*?)```", FLEET, flags=re.S)]


def block_with(key):
    found = [b for b in BLOCKS if key in yaml.safe_dump(b)]
    assert found, "no yaml block of docs/fleet.md mentions %s" % key
    return found


def test_the_template_env_is_what_restore_template_env_builds():
    own = [b for b in block_with("INFEROPS_RESTORE_IDENTITY") if isinstance(b, dict) and "env" in b][0]["env"]
    built = svc.restore_template_env("/mnt/snapshots/host", "qwen", "p0")
    assert own[:len(built)] == built, "docs/fleet.md's template env differs from restore_template_env's"
    assert [e["name"] for e in own[len(built):]] == ["INFEROPS_METADATA_FILE"], own


def test_the_clone_env_is_what_restore_template_env_builds_for_a_source():
    clone = [b for b in block_with("INFEROPS_RESTORE_SOURCE") if isinstance(b, list) and b and "valueFrom" in b[0]][0]
    built = svc.restore_template_env("/mnt/snapshots/host", "qwen", "p1", "p0", "qwen-p0-")
    assert clone == built[2:], "docs/fleet.md's clone env differs from restore_template_env's (after POD_NAME/NAMESPACE)"


def _check_options(given, spec, where):
    for key, value in given.items():
        assert key in spec, "%s: %s is not an option (it has: %s)" % (where, key, ", ".join(sorted(spec)))
        sub = spec[key].get("suboptions")
        if sub and isinstance(value, dict):
            _check_options(value, sub, "%s.%s" % (where, key))


def test_every_collection_module_task_uses_options_the_module_has():
    tasks = [task for block in BLOCKS if isinstance(block, list) for task in block if isinstance(task, dict)]
    used = 0
    for task in tasks:
        for key, args in task.items():
            if key.startswith("inferops.snapshot."):
                name = key.split(".")[-1]
                spec = gen.read_module(str(REPO / "plugins" / "modules" / (name + ".py")))["doc"]["options"]
                _check_options(args, spec, "docs/fleet.md task %r (%s)" % (task.get("name"), key))
                used += 1
    assert used, "docs/fleet.md has no collection module task to check"


def test_the_rulebook_command_gives_the_variables_the_rulebook_reads():
    shown = re.search(r"cat > fleet-vars.yml <<'EOF'\n(.*?)\n\s*EOF", FLEET, flags=re.S)
    assert shown, "docs/fleet.md no longer shows fleet-vars.yml"
    given = set(yaml.safe_load(textwrap.dedent(shown.group(1))))
    rulebook = (REPO / "extensions" / "eda" / "rulebooks" / "restore_gated_pods.yml").read_text()
    read = set(re.findall(r"\{\{\s*([a-z_][a-z0-9_]*)", rulebook)) - {"event"}
    assert read <= given, "the rulebook reads %s, which fleet-vars.yml does not give" % sorted(read - given)
    assert "--rulebook inferops.snapshot.restore_gated_pods" in FLEET
