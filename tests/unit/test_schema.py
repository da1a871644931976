import json
import subprocess
import sys

import pytest

from conftest import REPO
from ansible_collections.inferops.snapshot.plugins.module_utils.core import schema
from ansible_collections.inferops.snapshot.plugins.module_utils.core.errors import ParameterError


def test_embedded_schemas_match_the_schema_files():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_schemas.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_schema_files_are_valid_json_schemas():
    import jsonschema
    for name in ("snapshot-config", "manifest"):
        document = json.loads((REPO / "schemas" / ("%s.schema.json" % name)).read_text())
        jsonschema.validators.validator_for(document).check_schema(document)


GOOD = {"enabled": True, "npuSnapshotPath": "/snap/npu", "hostSnapshotPath": "/snap/host"}


@pytest.mark.parametrize("config", [GOOD, {"enabled": False}, dict(GOOD, timeoutSeconds=300, engine="criu"),
                                    dict(GOOD, endpoint={"url": "http://127.0.0.1:8000",
                                                         "paths": {"lock": "/v1/suspend"}})])
def test_valid_configs(config):
    assert schema.errors("snapshot-config", config) == []


@pytest.mark.parametrize("config, field", [
    ({"enabled": True, "npuSnapshotPath": "/a"}, "(top level)"),
    (dict(GOOD, timeoutSeconds=0), "timeoutSeconds"),
    (dict(GOOD, hostSnapshotPath="relative"), "hostSnapshotPath"),
    (dict(GOOD, hostSnapshotPath="/a/../etc"), "hostSnapshotPath"),
    (dict(GOOD, engine="podman"), "engine"),
    (dict(GOOD, surprise=1), "(top level)"),
    (dict(GOOD, endpoint={"url": "ftp://x"}), "endpoint.url"),
    ({"enabled": "yes"}, "enabled"),
])
def test_invalid_configs_name_the_field(config, field):
    with pytest.raises(ParameterError) as info:
        schema.validate("snapshot-config", config, "snapshot_config")
    assert info.value.result["field"] == field
    assert info.value.msg.startswith("snapshot_config is invalid at %s:" % field)


def test_identity_names_are_restricted():
    good = {"namespace": "default", "service": "qwen", "instance": "p0", "pod": "qwen-p0-0"}
    assert schema.errors("manifest", good, definition="identity") == []
    for bad in ("../x", "a/b", "", "-x"):
        assert schema.errors("manifest", dict(good, pod=bad), definition="identity"), bad
