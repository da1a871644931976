# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Validation of configs, manifests and records against the collection's JSON Schemas. PRIVATE.

Errors name the failing field (dotted path) and what was expected, so the operator can fix it.
One validator: the ``jsonschema`` library (4.0 or later: the schemas are JSON Schema 2020-12), on the
controller, on the targets of the modules and for the node's restore-on-create runtime, which runs on the
node's bare ``python3 -I`` (the snapshot_prereqs and snapshot_node roles install the distribution's
python3-jsonschema there). Without it nothing is validated: every call fails with MissingLibrary, which
says what to install -- never a document taken unchecked.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import sys
import traceback

from .errors import MissingLibrary, ParameterError
from .schemas import SCHEMAS

try:
    import jsonschema
    from jsonschema.exceptions import best_match
    HAS_JSONSCHEMA = True
    JSONSCHEMA_IMPORT_ERROR = None
except ImportError:
    HAS_JSONSCHEMA = False
    JSONSCHEMA_IMPORT_ERROR = traceback.format_exc()


def _validator(name, schema):
    if not HAS_JSONSCHEMA:
        raise MissingLibrary("jsonschema: the Python in %s has no jsonschema library, which validating the collection's documents "
                             "needs (4.0 or later); install the distribution's python3-jsonschema (the snapshot_prereqs "
                             "role does) or pip's jsonschema for it" % sys.prefix,
                             exception=JSONSCHEMA_IMPORT_ERROR)
    validator_cls = jsonschema.validators.validator_for(SCHEMAS[name])
    return validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER)


def _schema(name, definition=None, subschema=None):
    """The whole schema ``name``, one of its $defs, or a ``subschema`` of it (its $refs resolved in ``name``)."""
    schema = SCHEMAS[name]
    if definition is not None:
        subschema = {"$ref": "#/$defs/%s" % definition}
    if subschema is None:
        return schema
    return dict(subschema, **{"$schema": schema["$schema"], "$defs": schema.get("$defs", {})})


def errors(name, document, definition=None, subschema=None):
    """All validation errors as 'field: message' strings (empty when valid)."""
    validator = _validator(name, _schema(name, definition, subschema))
    found = sorted(validator.iter_errors(document), key=lambda e: [str(part) for part in e.absolute_path])
    return ["%s: %s" % (_field(error.absolute_path), error.message) for error in found]


def validate(name, document, what, definition=None):
    """Raise ParameterError naming the first failing field of ``document``."""
    error = best_match(_validator(name, _schema(name, definition)).iter_errors(document))
    if error is not None:
        field = _field(error.absolute_path)
        raise ParameterError("%s is invalid at %s: %s (see schemas/%s.schema.json)" % (what, field, error.message, name),
                             field=field)


def _field(path):
    return ".".join(str(part) for part in path) or "(top level)"
