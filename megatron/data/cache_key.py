"""Cache keys of the data indices this project writes (the curriculum index, the T0 pack index, the
per-dataset GPT indices): one hash of the build's declared inputs, so a key cannot forget one.

A cached index is keyed on every input its build reads, declared once next to the build (a tuple
of attribute names, as OLMo-core's ``fingerprint_fields``), never on fields picked apart from it.
:func:`canonical` turns each input into plain JSON generically: a dataclass gives *every* field
(a field added later is keyed without anyone remembering it), except the fields it marks
``metadata=NOT_KEYED`` (error locations, loss weights: what does not shape an index); an object
with a ``fingerprint()`` method gives that; numpy arrays and dtypes give their values.
"""
import dataclasses
import hashlib
import json
from typing import Any, Dict, Mapping, Tuple

import numpy as np

__all__ = ["NOT_KEYED", "array_digest", "canonical", "cache_key"]

# dataclass field metadata: the field does not shape any index built from the object
NOT_KEYED = {"cache_key": False}


def array_digest(array: np.ndarray) -> Dict[str, Any]:
    """``{"dtype", "shape", "sha256"}`` of a numpy array (its values hashed, so a key over
    millions of document lengths stays short)."""
    a = np.ascontiguousarray(array)
    return {"dtype": a.dtype.str, "shape": list(a.shape),
            "sha256": hashlib.sha256(a.view(np.uint8).reshape(-1)).hexdigest()}


_PLAIN = (bool, int, float, str)
_PLAIN_TYPES = frozenset(_PLAIN) | {type(None)}
# type -> the keyed field names of a dataclass without a fingerprint() method, or () for any other
# type: decided once per type (a key of thousands of datasets canonicalises some 12,000
# dataclasses, and dataclasses.fields and a missing attribute's lookup are slow)
_DATACLASS_FIELDS: Dict[type, Tuple[str, ...]] = {}


def _dataclass_fields(kind: type) -> Tuple[str, ...]:
    names = _DATACLASS_FIELDS.get(kind)
    if names is None:
        plain = (dataclasses.is_dataclass(kind) and not callable(getattr(kind, "fingerprint", None)))
        names = _DATACLASS_FIELDS[kind] = (
            tuple(f.name for f in dataclasses.fields(kind) if f.metadata.get("cache_key", True))
            if plain else ())
    return names


def canonical(obj: Any) -> Any:
    """``obj`` as plain JSON values for a cache key: dataclasses field by field (all but the
    ``NOT_KEYED`` ones), ``fingerprint()`` where an object has one, numpy arrays by their
    :func:`array_digest`, numpy scalars and dtypes as numbers and strings, tuples as lists,
    mapping keys as strings."""
    kind = type(obj)
    if kind in _PLAIN_TYPES:  # most of a key's values: answered first
        return obj
    if kind in (list, tuple):
        return [v if type(v) in _PLAIN_TYPES else canonical(v) for v in obj]
    names = _dataclass_fields(kind)
    if names:  # a dataclass (without a fingerprint() method): field by field
        out = {"__type__": kind.__name__}
        for name in names:
            v = getattr(obj, name)
            out[name] = v if type(v) in _PLAIN_TYPES else canonical(v)
        return out
    if hasattr(obj, "fingerprint") and callable(obj.fingerprint):
        return canonical(obj.fingerprint())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"__type__": kind.__name__,
                **{f.name: canonical(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                   if f.metadata.get("cache_key", True)}}
    if isinstance(obj, Mapping):
        return {str(k): canonical(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return array_digest(obj)
    if isinstance(obj, np.dtype) or (isinstance(obj, type) and issubclass(obj, np.generic)):
        return np.dtype(obj).str
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cache key: no canonical form for {type(obj).__name__} {obj!r}")


def cache_key(version: str, inputs: Dict[str, Any], length: int = 32) -> Tuple[str, str]:
    """``(key, description)``: the first ``length`` hex digits of the SHA-256 of the canonical JSON
    of ``{"version": version, **inputs}``, and that JSON (written beside the cached files)."""
    description = json.dumps({"version": version, **{k: canonical(v) for k, v in inputs.items()}},
                             sort_keys=True)
    return hashlib.sha256(description.encode()).hexdigest()[:length], description
