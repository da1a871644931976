# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The canary: one request the warmed-up engine answered, asked again of the restored one. PRIVATE.

Checksums, a signature and the world's facts say the snapshot is the one generated, untouched, for
this world. Whether the process that came back answers as the one that was checkpointed is a
different question, and only the engine can answer it. At generation, before the device snapshot
(a locked engine would not answer), ``record`` sends the configured request to the engine -- from
inside its network namespace, at the address it listens on -- and keeps the answer in the snapshot
(``canary.json``, covered by the checksums and the signature). After a restore, before the result
says ``restored``, the pipeline sends it again and ``compare``s: the whole body, the status only, or
one field of a JSON answer (``json:choices.0.text``: engines put ids and times in their answers).
A different answer is a cold start with both values in the reason.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import os
import re

from ..base import layout, schema
from ..base.clock import utc_now
from ..base.errors import ParameterError
from ..clients import engine_http
from ..linux import fs


EXAMPLE_URL = "http://127.0.0.1:8000/v1/completions"
# canary.json's schema: a method is letters only (http.client refuses a space or a line break in one)
METHOD = re.compile(r"[A-Z]+")
# a header name is an HTTP token (RFC 9110); a value may not break the request's lines
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
NOT_IN_HEADER_VALUE = re.compile(r"[\r\n\x00]")


def check_spec(spec, prefix=""):
    """The canary request as configured: url (http://), method, body, headers, compare. ParameterError naming the
    option (``prefix`` + snapshot_canary's option name); a header's value is never repeated: it may be a token."""
    url, method, headers = prefix + "url", prefix + "method", prefix + "headers"
    if not isinstance(spec, dict) or not spec.get("url"):
        raise ParameterError("%s: give the engine's URL to ask, e.g. %s" % (url, EXAMPLE_URL), field=url)
    normal = {"url": spec["url"], "method": spec.get("method") or ("POST" if spec.get("body") else "GET"),
              "body": spec.get("body"), "headers": spec.get("headers") or {}, "compare": spec.get("compare") or "exact"}
    if not isinstance(normal["url"], str) or not normal["url"].startswith("http://"):
        raise ParameterError("%s: %r is not an http:// URL (the request goes to the engine inside its own network "
                             "namespace)" % (url, engine_http.shown(normal["url"])), field=url)
    engine_http.check_url(normal["url"], url, schemes=("http",), example=EXAMPLE_URL)
    if not isinstance(normal["method"], str) or not METHOD.fullmatch(normal["method"].upper()):
        raise ParameterError("%s: %r is not an HTTP method; give one such as GET or POST (letters only)"
                             % (method, normal["method"]), field=method)
    normal["method"] = normal["method"].upper()
    if not isinstance(normal["headers"], dict):
        raise ParameterError("%s: give a dict of header names and values, e.g. {Authorization: Bearer ...}" % headers,
                             field=headers)
    for name, value in normal["headers"].items():
        if not isinstance(name, str) or not HEADER_NAME.fullmatch(name):
            raise ParameterError("%s: %r is not a header name (letters, digits and -, no space, colon or line break)"
                                 % (headers, name), field=headers)
        if not isinstance(value, str) or NOT_IN_HEADER_VALUE.search(value) or not _latin1(value):
            raise ParameterError("%s: the value of %s must be one line of text (no CR, LF or NUL, Latin-1 "
                                 "characters only); a token read with lookup('file') keeps its final newline: trim it "
                                 "(| trim). The value is not repeated here: it may be a secret" % (headers, name),
                                 field=headers)
    normal["headers"] = dict(normal["headers"])
    if isinstance(normal["body"], (dict, list)):
        normal["body"] = json.dumps(normal["body"], sort_keys=True)
        normal["headers"].setdefault("Content-Type", "application/json")
    if not (normal["compare"] in ("exact", "status") or (normal["compare"].startswith("json:") and len(normal["compare"]) > 5)):
        raise ParameterError("%scompare: %r is not exact, status or json:<field path> (e.g. json:choices.0.text)"
                             % (prefix, normal["compare"]), field=prefix + "compare")
    return normal


def _latin1(text):
    try:
        text.encode("latin-1")  # what http.client sends a header value as
    except UnicodeEncodeError:
        return False
    return True


def _pick(body, path):
    value = json.loads(body.decode("utf-8"))
    for part in path.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def _seen(spec, status, body):
    """What is compared of an answer: (status, the body, or the chosen field of it)."""
    if spec["compare"] == "status":
        return {"status": status}
    if spec["compare"] == "exact":
        return {"status": status, "body_b64": base64.b64encode(body).decode()}
    try:
        return {"status": status, "field": _pick(body, spec["compare"][5:])}
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        return {"status": status, "field_error": "%s: %s" % (type(exc).__name__, exc)}


def ask(pid, spec, timeout):
    status, body = engine_http.request(spec["url"], spec["method"], spec["body"], spec["headers"], timeout,
                                       netns_pid=pid)
    return _seen(spec, status, body)


def answer(pid, spec, timeout=30.0):
    """What the engine (pid) answers now, as it would be recorded; ParameterError when it does not answer well."""
    try:
        seen = ask(pid, spec, timeout)
    except engine_http.EngineHttpError as exc:
        raise ParameterError("canary: the engine did not answer the canary request: %s" % exc, field="canary")
    if "field_error" in seen or not 200 <= seen["status"] < 300:
        raise ParameterError("canary: the engine answered the canary request with HTTP %s%s; choose a request it "
                             "answers" % (seen["status"], " (%s)" % seen["field_error"] if "field_error" in seen else ""),
                             field="canary")
    return seen


def write(staging_dir, spec, seen):
    """Keep the request and its answer in the staging directory; returns the document."""
    doc = {"schema_version": 1, "request": spec, "answer": seen, "recorded_at": utc_now()}
    schema.validate("manifest", doc, "canary", definition="canary")
    fs.ensure_dir(staging_dir)
    fs.write_file_atomic(os.path.join(staging_dir, layout.CANARY), (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
    return doc


def load(snapshot_dir):
    """The recorded canary of a snapshot being generated (its staging directory), or None when it has none."""
    path = os.path.join(snapshot_dir, layout.CANARY)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as handle:
        return parse(handle.read())


def parse(data):
    """The canary document from its bytes (as a restore verified them)."""
    doc = json.loads(data.decode("utf-8"))
    schema.validate("manifest", doc, layout.CANARY, definition="canary")
    return doc


def mismatch(doc, pid, timeout):
    """Why the process ``pid`` does not answer as the checkpointed one did (None when it does)."""
    try:
        seen = ask(pid, doc["request"], timeout)
    except engine_http.EngineHttpError as exc:
        return "canary_failed: the restored engine did not answer the canary request: %s" % exc
    if seen != doc["answer"]:
        return "canary_mismatch: %s %s answered %s after the restore, %s when it was checkpointed" % (
            doc["request"]["method"], doc["request"]["url"], _short(seen), _short(doc["answer"]))
    return None


def _short(seen):
    text = json.dumps(seen, sort_keys=True)
    return text if len(text) <= 300 else text[:300] + "..."
