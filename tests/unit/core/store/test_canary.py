"""The canary request as snapshot_canary's options give it (core/store/canary.py check_spec): what cannot be sent is refused
naming the option -- url, method, headers, compare, as the module calls them -- before anything is asked or written,
and a header's value (a bearer token) is never repeated."""

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import canary

TOKEN = "Bearer s3cr3tTOKENvalue42"
URL = "http://127.0.0.1:8000/v1/completions"


def refused(**spec):
    with pytest.raises(ParameterError) as error:
        canary.check_spec(dict({"url": URL}, **spec))
    return error.value


@pytest.mark.parametrize("value", [TOKEN + "\n", TOKEN + "\r\nX-Injected: 1", TOKEN + "\x00", TOKEN + "\u20ac", 42,
                                   None])
def test_a_header_value_that_cannot_be_sent_is_refused_naming_headers_and_never_repeated(value):
    """A token read with lookup('file') keeps its newline: http.client's ValueError quoted it as an unexpected error."""
    error = refused(headers={"Authorization": value})
    assert error.msg.startswith("headers: the value of Authorization must be one line of text (no CR, LF or NUL"), \
        error.msg
    assert "s3cr3t" not in error.msg and "Injected" not in error.msg and "not repeated" in error.msg
    assert error.result == {"field": "headers"}


@pytest.mark.parametrize("name", ["Author ization", "X-A:b", "X\r\nY", "", 7])
def test_a_header_name_that_is_no_token_is_refused_naming_headers(name):
    error = refused(headers={name: TOKEN})
    assert error.msg.startswith("headers: %r is not a header name" % (name,)) and "s3cr3t" not in error.msg, error.msg


@pytest.mark.parametrize("method", ["GET /x HTTP/1.1\r\nX: y", "GE T", "M-SEARCH", "G\x00", 7])
def test_a_method_that_is_no_http_token_is_refused_naming_method(method):
    error = refused(method=method)
    assert error.msg == "method: %r is not an HTTP method; give one such as GET or POST (letters only)" % (method,)
    assert error.result == {"field": "method"}


@pytest.mark.parametrize("url, words", [
    ("http://127.0.0.1:abc/x", "url: 'http://127.0.0.1:abc/x' is not a URL that can be asked (Port could not be"),
    ("http://[::1/x", "url: 'http://[::1/x' is not a URL that can be asked (Invalid IPv6 URL)"),
    ("http:///x", "url: 'http:///x' is not an http URL, e.g. %s" % URL),
    ("http://127.0.0.1:1/x\n", "url: the URL contains whitespace or a control character"),
    ("https://127.0.0.1/x", "url: 'https://127.0.0.1/x' is not an http:// URL (the request goes to the engine"),
    ("https://admin:s3cr3t@127.0.0.1/x", "url: 'https://127.0.0.1/x' is not an http:// URL"),
    ("", "url: give the engine's URL to ask, e.g. %s" % URL),
])
def test_a_url_that_cannot_be_asked_is_refused_naming_url(url, words):
    error = refused(url=url)
    assert error.msg.startswith(words) and "s3cr3t" not in error.msg, error.msg
    assert error.result == {"field": "url"}


def test_the_fields_are_named_as_the_module_names_its_options():
    assert refused(compare="json:").msg.startswith("compare: 'json:' is not exact, status or json:<field path>")
    assert refused(compare="json:").result == {"field": "compare"}
    assert canary.check_spec({"url": URL, "method": "post", "headers": {"Authorization": TOKEN},
                              "body": {"prompt": "x"}}) == {
        "url": URL, "method": "POST", "body": '{"prompt": "x"}', "compare": "exact",
        "headers": {"Authorization": TOKEN, "Content-Type": "application/json"}}
