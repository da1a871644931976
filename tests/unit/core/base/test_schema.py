import json
import subprocess
import sys

import pytest

from conftest import REPO
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import schema
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError


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


def test_one_validator_and_without_it_nothing_is_accepted(monkeypatch):
    """jsonschema is the only validator (no hand-written subset beside it): where it is missing, a document is
    refused with what to install, never taken unchecked."""
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import MissingLibrary
    assert not hasattr(schema, "Subset")
    monkeypatch.setattr(schema, "HAS_JSONSCHEMA", False)
    for call in (lambda: schema.validate("snapshot-config", GOOD, "snapshot_config"),
                 lambda: schema.errors("snapshot-config", GOOD)):
        with pytest.raises(MissingLibrary, match="has no jsonschema library.*python3-jsonschema"):
            call()


def test_a_subschema_is_checked_with_its_references_resolved():
    status = schema.SCHEMAS["status"]
    item = status["properties"]["history"]["items"]
    assert schema.errors("status", {"status": "completed", "reason": None, "at": "2026-11-01T00:00:00Z"},
                         subschema=item) == []
    assert schema.errors("status", {"status": "bogus"}, subschema=item)
