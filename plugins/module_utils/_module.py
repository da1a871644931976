# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The module factory and the argument specs modules share. PRIVATE to the inferops.snapshot collection.

Every module's ``main()`` is ``run(ARGUMENT_SPEC, logic, ...)``: this builds the AnsibleModule, checks
the Python libraries the module needs on the target, runs ``logic(module)`` and turns its result into
``exit_json`` and the collection's typed errors into ``fail_json`` -- in this one place. The shared
argument specs match the doc fragments of the same names in plugins/doc_fragments.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.common.validation import check_type_dict

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import clock, layout, schema
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError, SnapshotError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import commands, control
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.containerd_cli import ContainerdCli
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.docker_cli import DockerCli
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import fs

HIDDEN = "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"  # Ansible's own word for a no_log value

# Matches plugins/doc_fragments/control_endpoint.py.
CONTROL_TARGET_ARGS = dict(
    pid=dict(type="int"),
    container=dict(type="str"),
    endpoint=dict(type="str"),
    endpoint_paths=dict(type="dict"),
    agent_socket_dir=dict(type="path", default=layout.DEFAULT_AGENT_SOCKET_DIR),
    # Above the real runtime's own 60 s lock wait, so a slow lock reports 507905, not a timeout.
    timeout=dict(type="float", default=90.0),
    docker_cli=dict(type="str", default="docker"),
    containerd_address=dict(type="path", default=layout.CONTAINERD_ADDRESS),
)
CONTROL_TARGET_OPTIONS = dict(mutually_exclusive=[("pid", "container", "endpoint")],
                              required_one_of=[("pid", "container", "endpoint")])
# Matches plugins/doc_fragments/identity.py.
IDENTITY_OPTIONS = dict(
    namespace=dict(type="str", required=True),
    service=dict(type="str", required=True),
    instance=dict(type="str", required=True),
    pod=dict(type="str", required=True),
)


# Matches plugins/doc_fragments/generation.py.
GENERATION_ARGS = dict(generation_id=dict(type="str"), generation_lease=dict(type="float", default=180.0))

# Matches plugins/doc_fragments/trust.py.
TRUST_ARGS = dict(trusted_keys=dict(type="list", elements="raw", default=[], no_log=False))


# What a dict option with sub-options looks like, for the error when it gets something else.
EXAMPLES = {"identity": "{namespace: default, service: qwen, instance: p0, pod: qwen-0}"}


class _Module(AnsibleModule):
    """AnsibleModule, but a dict option with sub-options (identity) given a string or a list fails naming the option
    and the form it takes -- ansible-core's own check fails first there, with no option's name."""

    def fail_json(self, msg, **kwargs):  # pylint: disable=arguments-differ
        if not getattr(self, "_inferops_ready", False):
            msg = dict_option_error(self.argument_spec, self.params) or msg
        super(_Module, self).fail_json(msg=msg, **kwargs)


def dict_option_error(argument_spec, params):
    """The error for the first dict option with sub-options whose value is no dict (nor a string that parses to
    one), naming the option and its keys; None when there is none."""
    for name, spec in sorted(argument_spec.items()):
        value = (params or {}).get(name)
        if spec.get("type") != "dict" or not spec.get("options") or value is None or isinstance(value, dict):
            continue
        try:
            check_type_dict(value)
            continue
        except (TypeError, ValueError):
            pass
        keys = list(spec["options"])
        example = EXAMPLES.get(name) or "{%s}" % ", ".join("%s: ..." % key for key in keys)
        return "%s: expected a dict with the keys %s (for example %s), got %s %r" % (
            name, ", ".join(keys), example, "the string" if isinstance(value, str) else "a %s" % type(value).__name__,
            value)
    return None


# Libraries a module may need on the target: name -> () -> (importable?, import traceback).
# The libraries a module may need, by name. The Kubernetes client is not here: a module that needs it names it as
# (name, available, error) from module_utils/k8s/client.py, so that only the k8s modules' payload holds that client.
LIBRARIES = {"jsonschema": lambda: (schema.HAS_JSONSCHEMA, schema.JSONSCHEMA_IMPORT_ERROR)}


def positive(params, *names):
    """Fail, naming the option, unless each of ``names`` that is set is a finite number > 0 (clock.check_seconds)."""
    clock.check_seconds(params, *names)


def sizes(params):
    """``min_size`` and ``workers`` of the modules that read a snapshot's files (snapshot_verify, snapshot_info,
    snapshot_stage, snapshot_restore): one check, so that none accepts what another refuses."""
    if params.get("min_size") is not None and params["min_size"] < 0:
        raise ParameterError("min_size: must be 0 or more bytes, got %d" % params["min_size"], field="min_size")
    if params.get("workers") is not None and params["workers"] < 1:
        raise ParameterError("workers: must be at least 1, got %d" % params["workers"], field="workers")


def container_pid(params):
    """Host pid of the main process of the container a task names: a pod's container on containerd as the kubelet
    reports it (``containerd://<id>``, found on ``containerd_address``), else a Docker container by name or id."""
    if params["container"].strip().startswith(layout.CRI_CONTAINER_ID_PREFIX):
        return ContainerdCli(params.get("containerd_address") or layout.CONTAINERD_ADDRESS).running_pid(
            params["container"])
    return DockerCli(params.get("docker_cli") or "docker").running_pid(params["container"])


def control_client(module):
    """The endpoint client for the target the task names (pid, container or endpoint)."""
    params = module.params
    if params.get("endpoint_paths") and not params.get("endpoint"):
        raise ParameterError("endpoint_paths: only meaningful together with an http(s) `endpoint`")
    positive(params, "timeout")
    if params.get("endpoint"):
        return control.client_for_endpoint(params["endpoint"], params.get("endpoint_paths"))
    pid = params.get("pid")
    if params.get("container") is not None:
        if not params["container"].strip():
            raise ParameterError("container: empty; give the name or id of the running container", field="container")
        pid = container_pid(params)
    return control.AgentSocketClient(control.agent_socket_for_pid(pid, params["agent_socket_dir"]))


def controller_only(module):
    """The logic of a module whose work its action plugin does on the controller: reaching a host means the plugin was
    bypassed, and nothing is done there."""
    raise ParameterError("%s runs on the controller, in its action plugin; this run reached a host without it, where "
                         "nothing is done (call it as inferops.snapshot.%s in a task)" % (module._name, module._name))


def run(argument_spec, logic, requires=("jsonschema",), diff=None, **module_options):
    """The whole ``main()`` of a module: ``logic(module)`` returns the result dict of a successful run; with --diff,
    ``diff(params, result)`` (plugins/module_utils/_diff.py) says what changed. ``requires``: names of LIBRARIES, or
    ``(name, available, import error)`` tuples."""
    options = dict(supports_check_mode=True)
    options.update(module_options)
    module = _Module(argument_spec=argument_spec, **options)
    module._inferops_ready = True
    invocation = _quiet_no_log(module)
    for need in requires:
        name, available, error = need if isinstance(need, tuple) else (need,) + LIBRARIES[need]()
        if not available:
            module.fail_json(msg=missing_required_lib(name), exception=error, invocation=invocation)
    try:
        result = logic(module)
    except SnapshotError as exc:
        _hide_remembered(module)
        module.fail_json(msg=exc.msg, invocation=invocation, **exc.result)
    except EnvironmentError as exc:
        _hide_remembered(module)
        store = fs.store_error(exc)
        if store is not None:  # a read-only or full snapshot store: say which path and why, no traceback
            module.fail_json(msg=store, invocation=invocation, path=exc.filename, errno=exc.errno)
        module.fail_json(msg="unexpected error in %s: %s" % (module._name, exc), exception=traceback.format_exc(),
                         invocation=invocation)
    except Exception as exc:  # an unexpected bug: say so, with the traceback, instead of a bare crash
        _hide_remembered(module)
        module.fail_json(msg="unexpected error in %s: %s" % (module._name, exc), exception=traceback.format_exc(),
                         invocation=invocation)
    _hide_remembered(module)
    if diff is not None and module._diff:
        result.setdefault("diff", diff(module.params, result))
    result.setdefault("invocation", invocation)
    module.exit_json(**result)


def _hide_remembered(module):
    """Ansible masks each no_log value wherever it occurs in a result (msg, cmd, stderr, invocation, ...): add the
    secrets the task met on its way -- the environment a snapshot recorded, given to `docker create` -- to them."""
    module.no_log_values.update(value for value in commands.remembered() if commands.may_be_secret(value))


def _quiet_no_log(module):
    """The invocation a result reports, every no_log parameter's value hidden whole; and Ansible's masking
    narrowed to values that may be secrets.

    Ansible masks each no_log value wherever it occurs in a result, in every string and every number that
    contains it: snapshot_restore's env {"WORKERS": "1"} turned each 1 of a message into ******** and each
    duration into VALUE_SPECIFIED_IN_NO_LOG_PARAMETER. Values of up to 3 characters and booleans hide nothing
    (commands.may_be_secret); longer ones stay masked, and the invocation below shows none of them."""
    module.no_log_values = set(value for value in module.no_log_values if commands.may_be_secret(value))
    shown = dict(module.params)
    for name, spec in module.argument_spec.items():
        value = shown.get(name)
        if not spec.get("no_log") or value is None:
            continue
        if isinstance(value, dict):
            shown[name] = dict((key, HIDDEN) for key in value)  # the names are no secret, and help a reader
        elif isinstance(value, list):
            shown[name] = [HIDDEN] * len(value)
        else:
            shown[name] = HIDDEN
    return {"module_args": shown}
