"""The one client for an engine's HTTP (core/clients/engine_http.py): what it refuses to ask says so naming the option,
and no message repeats a header's value or a password given in a URL."""

import pytest

from conftest import free_port
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import engine_http

TOKEN = "Bearer s3cr3tTOKENvalue42"


@pytest.mark.parametrize("url, shown", [
    ("http://admin:s3cretpw@127.0.0.1:1/x", "http://127.0.0.1:1/x"),
    ("https://admin@host/", "https://host/"),
    ("http://a:b@c@host:8000/p?q=a@b#f@g", "http://host:8000/p?q=a@b#f@g"),
    ("http://admin:s3cretpw@[::1/x", "http://[::1/x"),  # unparsable: stripped all the same
    ("http://127.0.0.1:8000/a@b", "http://127.0.0.1:8000/a@b"),
    ("127.0.0.1:1", "127.0.0.1:1"),
])
def test_a_url_is_shown_without_its_userinfo(url, shown):
    assert engine_http.shown(url) == shown


@pytest.mark.parametrize("url, words", [
    ("127.0.0.1:1", "url: '127.0.0.1:1' is not an http(s) URL, e.g. http://127.0.0.1:8000/health"),
    ("http://", "url: 'http://' is not an http(s) URL"),
    ("http://127.0.0.1:abc/", "url: 'http://127.0.0.1:abc/' is not a URL that can be asked (Port could not be cast"),
    ("http://127.0.0.1:99999/", "url: 'http://127.0.0.1:99999/' is not a URL that can be asked (Port out of range"),
    ("http://[::1", "url: 'http://[::1' is not a URL that can be asked (Invalid IPv6 URL)"),
    ("http://127.0.0.1:1/\nx", "url: the URL contains whitespace or a control character"),
    ("http://127.0.0.1:1/a b", "url: the URL contains whitespace or a control character"),
    ("", "url: give an http(s) URL"),
    ("http://admin:s3cretpw@127.0.0.1:abc/", "url: 'http://127.0.0.1:abc/' is not a URL that can be asked"),
])
def test_a_url_that_cannot_be_asked_is_a_parameter_error_naming_the_option(url, words):
    with pytest.raises(ParameterError) as error:
        engine_http.check_url(url, "url")
    assert error.value.msg.startswith(words) and "s3cretpw" not in error.value.msg, error.value.msg
    assert error.value.result == {"field": "url"}


def test_a_url_that_can_be_asked_is_returned_as_it_is():
    for url in ("http://127.0.0.1:8000/health", "https://[::1]:8443/v1?x=1", "http://engine/"):
        assert engine_http.check_url(url, "url") == url
    with pytest.raises(ParameterError, match="^url: 'https://engine/' is not an http URL"):
        engine_http.check_url("https://engine/", "url", schemes=("http",))


@pytest.mark.parametrize("url, method, headers", [
    ("http://127.0.0.1:%d/x", "GET", {"Authorization": TOKEN + "\n"}),  # a token read with lookup('file')
    ("http://127.0.0.1:%d/x", "GET", {"Authorization": TOKEN + "\r\nX-Injected: 1"}),
    ("http://127.0.0.1:%d/x", "GET", {"Authorization": TOKEN + "\u20ac"}),  # not Latin-1
    ("http://127.0.0.1:%d/x", "GET /x HTTP/1.1\r\nX: " + TOKEN, {}),
    ("http://127.0.0.1:abc/x", "GET", {"Authorization": TOKEN}),
])
def test_what_http_client_refuses_is_no_answer_and_repeats_no_header_or_method(url, method, headers):
    """http.client raises a ValueError that quotes the header (a repr, which Ansible's masking of the raw value does
    not match): it was an "unexpected error" with the token in it. The callers check first; this is the backstop."""
    url = url % free_port() if "%d" in url else url
    with pytest.raises(engine_http.EngineHttpError) as error:
        engine_http.request(url, method, None, headers, timeout=2)
    assert "s3cr3t" not in str(error.value) and "Injected" not in str(error.value), str(error.value)
    assert "the request could not be sent" in str(error.value)


def test_no_answer_names_the_url_without_its_password():
    port = free_port()
    with pytest.raises(engine_http.EngineHttpError) as error:
        engine_http.request("http://admin:s3cretpw@127.0.0.1:%d/x" % port, timeout=2)
    assert str(error.value).startswith("http://127.0.0.1:%d/x: ConnectionRefusedError" % port), str(error.value)
    with pytest.raises(engine_http.EngineHttpError, match=r"^'http://\[::1' is not a URL: Invalid IPv6 URL$"):
        engine_http.request("http://admin:s3cretpw@[::1", timeout=2)
