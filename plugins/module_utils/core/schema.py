# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Validation of configs, manifests and records against the collection's JSON Schemas. PRIVATE.

Errors name the failing field (dotted path) and what was expected, so the operator can fix it.
The ``jsonschema`` library does the work where it is installed (the controller, the targets of the
modules). The node's restore-on-create runtime runs on the node's bare python3, so without it the
small validator below checks the subset of JSON Schema that schemas/*.json use -- and fails closed
on any keyword it does not know. tests/unit/test_schema.py holds the two to the same verdicts.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import traceback

from .errors import ParameterError
from .schemas import SCHEMAS

try:
    import jsonschema
    from jsonschema.exceptions import best_match
    HAS_JSONSCHEMA = True
    JSONSCHEMA_IMPORT_ERROR = None
except ImportError:
    HAS_JSONSCHEMA = False
    JSONSCHEMA_IMPORT_ERROR = traceback.format_exc()


def _schema(name, definition=None):
    schema = SCHEMAS[name]
    if definition is None:
        return schema
    return {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": "#/$defs/%s" % definition}


def errors(name, document, definition=None, use_jsonschema=None):
    """All validation errors as 'field: message' strings (empty when valid)."""
    schema = _schema(name, definition)
    if HAS_JSONSCHEMA if use_jsonschema is None else use_jsonschema:
        validator_cls = jsonschema.validators.validator_for(SCHEMAS[name])
        validator = validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER)
        found = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
        return ["%s: %s" % (_field(error.absolute_path), error.message) for error in found]
    return ["%s: %s" % (_field(path), message) for path, message in Subset(SCHEMAS[name]).errors(schema, document)]


def validate(name, document, what, definition=None):
    """Raise ParameterError naming the first failing field of ``document``."""
    if HAS_JSONSCHEMA:
        validator_cls = jsonschema.validators.validator_for(SCHEMAS[name])
        validator = validator_cls(_schema(name, definition), format_checker=validator_cls.FORMAT_CHECKER)
        error = best_match(validator.iter_errors(document))
        found = (_field(error.absolute_path), error.message) if error is not None else None
    else:
        problems = Subset(SCHEMAS[name]).errors(_schema(name, definition), document)
        found = (_field(problems[0][0]), problems[0][1]) if problems else None
    if found is not None:
        raise ParameterError("%s is invalid at %s: %s (see schemas/%s.schema.json)" % (what, found[0], found[1], name),
                             field=found[0])


def _field(path):
    return ".".join(str(part) for part in path) or "(top level)"


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
_DATE_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$", re.I)
_ANNOTATIONS = ("$schema", "$id", "title", "description", "default", "examples", "$comment")


class Subset:
    """The JSON Schema keywords schemas/*.json use, for a python3 without jsonschema."""

    def __init__(self, root):
        self.root = root

    def errors(self, schema, value, path=()):
        found = []
        self._check(schema, value, list(path), found)
        return found

    def _type_ok(self, wanted, value):
        for name in wanted if isinstance(wanted, list) else [wanted]:
            if name == "integer" and isinstance(value, int) and not isinstance(value, bool):
                return True
            if name == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
                return True
            if name in _TYPES and isinstance(value, _TYPES[name]) and not (name != "boolean" and isinstance(value, bool)):
                return True
        return False

    def _check(self, schema, value, path, found):
        if schema is True:
            return
        if schema is False:
            found.append((path, "False schema does not allow %r" % (value,)))
            return
        for key in schema:
            if key not in self.KEYWORDS and key not in _ANNOTATIONS:
                found.append((path, "schema keyword %r is not supported without the jsonschema library" % key))
                return
        if "$ref" in schema:
            target = self.root
            for part in schema["$ref"].lstrip("#/").split("/"):
                target = target[part]
            self._check(target, value, path, found)
        if "type" in schema and not self._type_ok(schema["type"], value):
            found.append((path, "%r is not of type %s" % (value, ", ".join(
                repr(t) for t in (schema["type"] if isinstance(schema["type"], list) else [schema["type"]])))))
            return
        if "const" in schema and value != schema["const"]:
            found.append((path, "%r was expected" % (schema["const"],)))
        if "enum" in schema and value not in schema["enum"]:
            found.append((path, "%r is not one of %r" % (value, schema["enum"])))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in schema and value < schema["minimum"]:
                found.append((path, "%r is less than the minimum of %r" % (value, schema["minimum"])))
            if "maximum" in schema and value > schema["maximum"]:
                found.append((path, "%r is greater than the maximum of %r" % (value, schema["maximum"])))
        if isinstance(value, str):
            if "pattern" in schema and not re.search(schema["pattern"], value):
                found.append((path, "%r does not match %r" % (value, schema["pattern"])))
            if "minLength" in schema and len(value) < schema["minLength"]:
                found.append((path, "%r is too short" % (value,)))
            if schema.get("format") == "date-time" and not _DATE_TIME.match(value):
                found.append((path, "%r is not a 'date-time'" % (value,)))
        if isinstance(value, dict):
            for name in schema.get("required", []):
                if name not in value:
                    found.append((path, "%r is a required property" % name))
            for name, needed in schema.get("dependentRequired", {}).items():
                for other in needed if name in value else []:
                    if other not in value:
                        found.append((path, "%r is a dependency of %r" % (other, name)))
            properties = schema.get("properties", {})
            for name, item in value.items():
                if name in properties:
                    self._check(properties[name], item, path + [name], found)
                elif schema.get("additionalProperties") is False:
                    found.append((path, "Additional properties are not allowed (%r was unexpected)" % name))
                elif isinstance(schema.get("additionalProperties"), dict):
                    self._check(schema["additionalProperties"], item, path + [name], found)
        if isinstance(value, list):
            if "items" in schema:
                for index, item in enumerate(value):
                    self._check(schema["items"], item, path + [index], found)
            if schema.get("uniqueItems") and len(set(repr(item) for item in value)) != len(value):
                found.append((path, "%r has non-unique elements" % (value,)))
            if "minItems" in schema and len(value) < schema["minItems"]:
                found.append((path, "%r is too short" % (value,)))
        if "not" in schema and not self.errors(schema["not"], value, path):
            found.append((path, "should not be valid under %r" % (schema["not"],)))
        if "if" in schema:
            branch = "then" if not self.errors(schema["if"], value, path) else "else"
            if branch in schema:
                self._check(schema[branch], value, path, found)
        for keyword in ("allOf", "anyOf", "oneOf"):
            if keyword in schema:
                passing = sum(1 for sub in schema[keyword] if not self.errors(sub, value, path))
                ok = {"allOf": passing == len(schema[keyword]), "anyOf": passing >= 1, "oneOf": passing == 1}[keyword]
                if not ok:
                    found.append((path, "%r is not valid under %s of the given schemas" % (value, keyword)))

    KEYWORDS = ("$ref", "$defs", "type", "const", "enum", "minimum", "maximum", "pattern", "minLength", "format",
                "required", "dependentRequired", "properties", "additionalProperties", "items", "uniqueItems", "minItems", "not", "if",
                "then", "else", "allOf", "anyOf", "oneOf")
