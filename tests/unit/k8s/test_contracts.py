"""The Kubernetes contracts: the pod annotations and the record ConfigMap have one writer each (k8s/pods.py,
k8s/record.py), their schemas name exactly core/base/layout.py's names, every document a writer makes is valid and
the reader refuses one that is not; the client is kubernetes.core's, with every one of its connection options."""

import http.server
import json
import tempfile
import threading
import uuid

import pytest

from conftest import REPO

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout, schema
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import client, pods, record, service

IDENT = {"namespace": "ns", "service": "qwen", "instance": "p0", "pod": "qwen-p0-0"}
SUM = "ab" * 32
CONFIG = {"enabled": True, "npuSnapshotPath": "/snap/npu", "hostSnapshotPath": "/snap/host", "timeoutSeconds": 300}


def test_the_annotation_schema_names_exactly_the_layout_names():
    names = set(schema.SCHEMAS["k8s-annotations"]["properties"])
    k8s = set(getattr(layout, key) for key in dir(layout) if key.startswith("K8S_") and isinstance(
        getattr(layout, key), str) and getattr(layout, key).startswith(layout.K8S_PREFIX) and key != "K8S_PREFIX")
    request = {layout.ANNOTATION_RESTORE_FROM, layout.ANNOTATION_RESTORE_CHECKSUM, pods.RESTORE_DEVICE_ANNOTATION}
    assert names == k8s | request


def test_the_record_identity_is_the_manifests():
    assert schema.SCHEMAS["k8s-record"]["$defs"]["identity"] == schema.SCHEMAS["manifest"]["$defs"]["identity"]
    assert schema.SCHEMAS["k8s-record"]["$defs"]["name"] == schema.SCHEMAS["manifest"]["$defs"]["name"]


@pytest.mark.parametrize("wanted", [
    pods.generation(IDENT, "/snap/npu/ns/qwen/p0/qwen-p0-0", "/snap/host/ns/qwen/p0/qwen-p0-0", CONFIG),
    pods.snapshot_state(pods.STATUS_PENDING),
    pods.snapshot_state(pods.STATUS_GENERATING, "node-a"),
    pods.snapshot_state(pods.STATUS_COMPLETED, "node-a", checksum=SUM, total_bytes=123, duration=1.23456),
    pods.snapshot_state(pods.STATUS_FAILED, reason="timeout"),
    pods.restore_request("/snap/host/x", SUM, device=False),
    pods.restore_request(None, SUM, device=True),
    pods.restore_outcome(pods.RESTORE_RESTORED, None, IDENT, "/snap/host/x", SUM, "node-a"),
    pods.restore_outcome(pods.RESTORE_COLD, "missing: x"),
    pods.restore_outcome(pods.RESTORE_FAILED, "the device state could not be resumed"),
], ids=lambda wanted: ",".join("%s=%s" % (key.split("/")[-1], value) for key, value in sorted(wanted.items()))[:60])
def test_every_annotation_the_writer_makes_is_valid(wanted):
    assert schema.errors("k8s-annotations", wanted) == []
    every = dict((key, "x") for key in schema.SCHEMAS["k8s-annotations"]["properties"])
    found = pods.changes({"metadata": {"name": "p", "annotations": every}}, wanted)  # differs everywhere
    assert schema.errors("k8s-annotations", found) == [] and found[layout.K8S_UPDATED_AT]


def test_the_writer_refuses_an_annotation_the_schema_does_not_allow():
    with pytest.raises(ParameterError, match="annotation change of pod p is invalid at snapshot.inferops.org/status"):
        pods.changes({"metadata": {"name": "p"}}, {layout.K8S_STATUS: "done"})
    with pytest.raises(ParameterError, match="invalid at snapshot.inferops.org/checksum"):
        pods.changes({"metadata": {"name": "p"}}, pods.snapshot_state(pods.STATUS_COMPLETED, "n", checksum="x"))
    with pytest.raises(ParameterError, match="invalid at \\(top level\\)"):
        pods.changes({"metadata": {"name": "p"}}, {"snapshot.inferops.org/surprise": "1"})


def test_a_cold_restore_leaves_no_snapshot_state_and_no_request_a_restart_would_follow():
    cold = pods.restore_outcome(pods.RESTORE_COLD, "why")
    assert cold[layout.ANNOTATION_RESTORE_FROM] is None and cold[layout.K8S_STATUS] is None
    restored = pods.restore_outcome(pods.RESTORE_RESTORED, None, IDENT, "/snap/host/x", SUM, "node-a")
    assert restored[layout.K8S_STATUS] == "completed" and restored[layout.K8S_IDENTITY] == "ns/qwen/p0/qwen-p0-0"
    assert pods.restore_outcome(pods.RESTORE_RESTORED) == {
        layout.K8S_RESTORE: "restored", layout.K8S_RESTORE_REASON: None}


def test_one_annotation_merge():
    """A merge patch's semantics, written once: what a patch makes of a pod, and what a recreated pod carries."""
    current = {"a": "1", "b": "2"}
    assert pods.merged(current, {"a": None, "c": "3"}) == {"b": "2", "c": "3"} and current == {"a": "1", "b": "2"}
    pod = {"metadata": {"name": "p", "annotations": current}, "spec": {"containers": [{"name": "e"}]}}
    assert pods.with_annotations(pod, {"a": None})["metadata"]["annotations"] == {"b": "2"}
    assert pods.recreation_manifest(pod, 0, {"name": "e"}, {"a": None})["metadata"]["annotations"] == {"b": "2"}
    sources = [path for path in (REPO / "plugins").rglob("*.py")
               if "if value is None:" in path.read_text() and ".pop(key, None)" in path.read_text()]
    assert [path.name for path in sources] == ["pods.py"], sources


def entry(**changes):
    document = record.entry(IDENT, "/snap/host/ns/qwen/p0/qwen-p0-0", "completed", node="node-a",
                            npu_path="/snap/npu/ns/qwen/p0/qwen-p0-0", image="qwen:1", checksum=SUM, total_bytes=5)
    document.update(changes)
    return document


def test_the_record_reader_holds_entries_to_the_schema():
    good = entry()
    configmap = {"data": {"qwen-p0-0": json.dumps(good), "b": "{not json", "c": "[1]",
                          "d": json.dumps(dict(good, status="completed", checksum=None)),
                          "e": json.dumps(dict(good, host_path="relative")),
                          "f": json.dumps(dict(good, surprise=1))}}
    parsed = record.parse(configmap)
    assert parsed["qwen-p0-0"] == good and record.parse(None) == {}
    assert "not JSON" in parsed["b"][record.INVALID] and "is not of type 'object'" in parsed["c"][record.INVALID]
    assert "checksum" in parsed["d"][record.INVALID] and "host_path" in parsed["e"][record.INVALID]
    assert "surprise" in parsed["f"][record.INVALID]
    # an invalid entry is never restored from, and says why
    restore_from, node, reason = service.decide(IDENT, parsed["d"], {"valid": True}, "/snap/host")
    assert restore_from is None and node is None and "record's entry for ns/qwen/p0/qwen-p0-0 is invalid" in reason


def test_the_record_writer_checks_and_merges_only_what_changed():
    with pytest.raises(ParameterError, match="record entry of pod qwen-p0-0 is invalid at status"):
        record.entry(IDENT, "/snap/host/x", "done")

    class Api:
        def __init__(self, current):
            self.current, self.calls = current, []

        def get_configmap(self, namespace, name):
            self.calls.append(("get", name))
            return self.current

        def create_configmap(self, namespace, body):
            self.calls.append(("create", body))

        def patch_configmap(self, namespace, name, patch):
            self.calls.append(("patch", patch))

    api = Api(None)
    before, after = record.write(api, "ns", "qwen", layout.K8S_SERVICE_LABEL, {"qwen-p0-0": entry()})
    kind, body = api.calls[-1]
    assert kind == "create" and body["metadata"] == {"name": "inferops-snapshot-qwen", "namespace": "ns",
                                                     "labels": {"inferops.org/service": "qwen"}}
    assert schema.errors("k8s-record", body) == [] and before == {"qwen-p0-0": None}
    api = Api(body)
    assert record.write(api, "ns", "qwen", layout.K8S_SERVICE_LABEL, {"qwen-p0-0": entry(updated_at="2030-01-01T00:00:00Z")}) \
        == ({}, {}) and api.calls == [("get", "inferops-snapshot-qwen")]  # the same entry, later: nothing to write
    failed = entry(status="failed", reason="boom", checksum=None)
    before, after = record.write(api, "ns", "qwen", layout.K8S_SERVICE_LABEL, {"qwen-p0-0": failed}, check_mode=True)
    assert after == {"qwen-p0-0": failed} and len(api.calls) == 2  # check mode: read, never written
    record.write(api, "ns", "qwen", layout.K8S_SERVICE_LABEL, {"qwen-p0-0": failed})
    assert api.calls[-1] == ("patch", {"data": {"qwen-p0-0": json.dumps(failed, sort_keys=True)}})


def test_the_modules_take_every_connection_option_of_kubernetes_core():
    from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
    for name in ("k8s_snapshot_pods", "k8s_snapshot_pods_info", "k8s_snapshot_status"):
        text = (REPO / "plugins" / "modules" / (name + ".py")).read_text()
        assert "ARGUMENT_SPEC = dict(client.AUTH_ARG_SPEC" in text and "kubernetes.core.k8s_auth_options" in text, name
    assert client.AUTH_ARG_SPEC is AUTH_ARG_SPEC and {"impersonate_user", "proxy", "no_proxy"} <= set(AUTH_ARG_SPEC)


class ApiStub:
    """An HTTP server that answers kubernetes.core's discovery (/version, /api, /apis) and keeps the headers of
    every request -- also as an HTTP proxy (a request line with an absolute URL)."""

    def __init__(self):
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                seen.append((self.path, [(key.lower(), value) for key, value in self.headers.items()]))
                answers = {"/version": {"major": "1", "minor": "30", "gitVersion": "v1.30.0"},
                           "/api": {"kind": "APIVersions", "versions": ["v1"]},
                           "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
                           "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": []}}
                path = "/" + self.path.split("://", 1)[-1].split("/", 1)[-1].split("?")[0] if "://" in self.path \
                    else self.path.split("?")[0]
                body = json.dumps(answers.get(path.replace("/b/", "/", 1) if path.startswith("/b/") else path,
                                              {})).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def stub(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # kubernetes.core's discovery cache goes there
    for variable in ("K8S_AUTH_KUBECONFIG", "K8S_AUTH_CONTEXT", "K8S_AUTH_HOST", "K8S_AUTH_API_KEY", "K8S_AUTH_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    server = ApiStub()
    yield server
    server.server.shutdown()


def test_the_client_is_kubernetes_cores_and_every_option_reaches_the_api(stub, tmp_path, monkeypatch):
    """A token, impersonation and a proxy -- options the hand-written client of 0.3 did not have -- reach the API."""
    host = "http://api-%s.invalid:6443" % uuid.uuid4().hex[:8]  # only the proxy knows it
    direct = client.connect({"host": host + "/", "api_key": "t0ken", "impersonate_user": "alice",
                             "impersonate_groups": ["ops", "dev"], "proxy": stub.url})
    assert type(direct.api).__module__.startswith("ansible_collections.kubernetes.core.")
    assert direct.host == host
    path, headers = stub.seen[0]
    assert path == host + "/version" and ("authorization", "Bearer t0ken") in headers
    assert ("impersonate-user", "alice") in headers
    assert {value for key, value in headers if key == "impersonate-group"} == {"ops", "dev"}
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "b",
        "clusters": [{"name": "a", "cluster": {"server": stub.url}},
                     {"name": "b", "cluster": {"server": stub.url + "/b"}}],
        "users": [{"name": "u", "user": {"token": "from-kubeconfig"}}],
        "contexts": [{"name": "a", "context": {"cluster": "a", "user": "u"}},
                     {"name": "b", "context": {"cluster": "b", "user": "u"}}]}))
    assert client.connect({"kubeconfig": str(kubeconfig)}).host == stub.url + "/b"
    assert client.connect({"kubeconfig": str(kubeconfig), "context": "a"}).host == stub.url
    assert ("authorization", "Bearer from-kubeconfig") in stub.seen[-1][1]
    # a kubeconfig loaded earlier in the process does not take the next connection over (its refresh hook would)
    other = "http://api-%s.invalid:6443" % uuid.uuid4().hex[:8]
    assert client.connect({"host": other, "api_key": "t1", "proxy": stub.url}).host == other
    assert stub.seen[-1][0].startswith(other + "/") and ("authorization", "Bearer t1") in stub.seen[-1][1]
    monkeypatch.setenv("K8S_AUTH_KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("K8S_AUTH_CONTEXT", "a")
    assert client.connect({}).host == stub.url  # kubernetes.core's environment variables
    with pytest.raises(client.K8sError, match="cannot connect to the Kubernetes API: .*give kubeconfig"):
        client.connect({"kubeconfig": str(tmp_path / "missing"), "context": "x"})
