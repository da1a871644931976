import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import protocol


@pytest.mark.parametrize("message, field", [
    ({"op": "freeze"}, "'op'"),
    ({"op": "lock", "timeout": "10"}, "'timeout'"),
    ({"op": "lock", "timeout": True}, "'timeout'"),
    ({"op": "lock", "timeout": 0}, "'timeout'"),
    ({"op": "lock", "timeout": 10 ** 6}, "'timeout'"),
    ({"op": "lock", "v": 2}, "'v'"),
    ({"op": "lock", "pid": 1}, "'pid'"),
])
def test_bad_requests_name_the_field(message, field):
    with pytest.raises(protocol.ProtocolError, match=field):
        protocol.parse_request(message)


def test_good_request_round_trips():
    data = protocol.encode(protocol.make_request("backup", 12))
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert protocol.parse_request(protocol.decode(data.strip())) == ("backup", 12.0)


@pytest.mark.parametrize("data", [b"not json", b"[1, 2]", b"\xff\xfe", b"x" * (protocol.MAX_MESSAGE_BYTES + 1)])
def test_decode_rejects_garbage(data):
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(data)


@pytest.mark.parametrize("op, state, result", [
    ("lock", "RUNNING", "LOCKED"),
    ("lock", "LOCKED", None),
    ("backup", "LOCKED", "BACKED_UP"),
    ("backup", "RUNNING", None),
    ("restore", "BACKED_UP", "LOCKED"),
    ("restore", "LOCKED", None),
    ("unlock", "LOCKED", "RUNNING"),
    ("unlock", "BACKED_UP", "RUNNING"),
    ("unlock", "RUNNING", None),
])
def test_state_machine(op, state, result):
    assert protocol.check_transition(op, state) == result
