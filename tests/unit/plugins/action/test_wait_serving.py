"""wait_serving's action plugin slices the wait only when timeout and progress_interval are numbers of seconds it can
slice: anything else -- NaN and infinity included, which made the slicing loop run for ever -- goes to one module
run, whose argument check names the option."""

import pytest

from ansible_collections.inferops.snapshot.plugins.action import wait_serving as action


class _Task:
    def __init__(self, args):
        self.args = args


@pytest.mark.parametrize("option", ["timeout", "progress_interval"])
@pytest.mark.parametrize("value", ["nan", "inf", float("nan"), float("inf"), "-inf", 0, -1, "abc"])
def test_a_value_the_slicing_cannot_use_goes_to_one_module_run(monkeypatch, option, value):
    monkeypatch.setattr(action.ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    runs = []

    def execute(module_name, module_args, task_vars):
        runs.append(dict(module_args))
        assert len(runs) == 1, "the wait was sliced: %d module runs for %s=%r" % (len(runs), option, value)
        # what a slice that ran out of time answers: the loop would ask again
        return {"failed": True, "timed_out": True, "attempts": 1, "last": "absent", "msg": "not ready"}

    plugin = action.ActionModule.__new__(action.ActionModule)
    plugin._task = _Task({"url": "http://127.0.0.1:1/", option: value})
    plugin._execute_module = execute
    plugin._remove_tmp_path = lambda path: None
    plugin._connection = type("Connection", (), {"_shell": type("Shell", (), {"tmpdir": None})()})()
    plugin._display = type("Display", (), {"display": lambda self, msg: None})()
    result = plugin.run(task_vars={})
    assert runs == [{"url": "http://127.0.0.1:1/", option: value}], "one run, with the task's own arguments"
    assert result["failed"]
