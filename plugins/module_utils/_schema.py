# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Validation of configs and manifests against the collection's JSON Schemas. PRIVATE.

Errors name the failing field (dotted path) and what was expected, so the operator can fix it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import traceback

from ansible_collections.inferops.snapshot.plugins.module_utils._errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils._schemas import SCHEMAS

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


def errors(name, document, definition=None):
    """All validation errors as 'field: message' strings (empty when valid)."""
    validator_cls = jsonschema.validators.validator_for(SCHEMAS[name])
    validator = validator_cls(_schema(name, definition), format_checker=validator_cls.FORMAT_CHECKER)
    found = []
    for error in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path)):
        found.append("%s: %s" % (_field(error), error.message))
    return found


def validate(name, document, what, definition=None):
    """Raise ParameterError naming the first failing field of ``document``."""
    validator_cls = jsonschema.validators.validator_for(SCHEMAS[name])
    validator = validator_cls(_schema(name, definition), format_checker=validator_cls.FORMAT_CHECKER)
    error = best_match(validator.iter_errors(document))
    if error is not None:
        raise ParameterError("%s is invalid at %s: %s (see schemas/%s.schema.json)"
                             % (what, _field(error), error.message, name), field=_field(error))


def _field(error):
    return ".".join(str(part) for part in error.absolute_path) or "(top level)"
