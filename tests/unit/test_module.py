"""The module factory's shared checks (plugins/module_utils/_module.py), before anything runs."""

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.errors import ParameterError


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), float("-inf"), 1e400])
def test_positive_refuses_what_is_no_number_of_seconds_naming_the_option(value):
    with pytest.raises(ParameterError, match=r"^generation_lease: must be a positive number of seconds, got ") as raised:
        _module.positive({"timeout": 5.0, "generation_lease": value}, "timeout", "generation_lease")
    assert raised.value.result["field"] == "generation_lease"


def test_positive_accepts_a_finite_positive_number_or_nothing():
    _module.positive({"timeout": 0.001, "generation_lease": None}, "timeout", "generation_lease", "absent")
