"""The request schema language: what each route's JSON body may hold, checked in one place.

Every POST route declares its body as an `Obj` (see `accepts` in body.py); `check(body,
spec)` walks it and raises `FieldError` (HTTP 400) naming the field by its path
(`'messages[2].content' must be a string, a list of content parts or null`). After the
check, the readers and translators can trust every type the schema names.

Conventions (what clients send): unknown fields are ignored, never rejected; `null`
counts as absent for every field; an integral float (2.0) is an integer. The spec
classes are plain dataclasses so the tests can derive fuzzing strategies from them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ...errors import RequestError


class FieldError(RequestError):
    """A field of the request body has the wrong type or value (HTTP 400)."""

    def __init__(self, path: str, what: str):
        super().__init__(f"'{path}' must be {what}")
        self.path = path


class Spec:
    """A JSON value's allowed shape; `what` says it in words for the error message."""

    what = "a value"

    def check(self, v: Any, path: str) -> None:
        raise NotImplementedError


def _is_int(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v.is_integer())


@dataclass(frozen=True)
class Anything(Spec):
    """Any JSON value (tool parameters, template variables: passed on as they are)."""

    what = "a JSON value"

    def check(self, v, path):
        pass


@dataclass(frozen=True)
class Str(Spec):
    max_len: int | None = None

    @property
    def what(self) -> str:
        return "a string" if self.max_len is None else f"a string of at most {self.max_len} characters"

    def check(self, v, path):
        if not isinstance(v, str) or (self.max_len is not None and len(v) > self.max_len):
            raise FieldError(path, self.what)


@dataclass(frozen=True)
class Int(Spec):
    lo: int | None = None
    hi: int | None = None
    integral_floats: bool = True  # 2.0 counts (clients compute max_tokens); not for token ids

    @property
    def what(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"an integer from {self.lo} to {self.hi}"
        if self.lo is not None:
            return f"an integer >= {self.lo}"
        return "an integer"

    def check(self, v, path):
        ok = _is_int(v) if self.integral_floats else isinstance(v, int) and not isinstance(v, bool)
        if not ok or (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
            raise FieldError(path, self.what)


@dataclass(frozen=True)
class Num(Spec):
    """A finite number (NaN and infinities are refused), within [lo, hi] when given."""

    lo: float | None = None
    hi: float | None = None

    @property
    def what(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"a number from {self.lo:g} to {self.hi:g}"
        return "a number"

    def check(self, v, path):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
            raise FieldError(path, self.what)


@dataclass(frozen=True)
class Bool(Spec):
    what = "a boolean"

    def check(self, v, path):
        if not isinstance(v, bool):
            raise FieldError(path, self.what)


@dataclass(frozen=True)
class Enum(Spec):
    values: tuple[str, ...]

    @property
    def what(self) -> str:
        return "one of " + ", ".join(repr(x) for x in self.values)

    def check(self, v, path):
        if v not in self.values:
            raise FieldError(path, self.what)


@dataclass(frozen=True)
class List(Spec):
    item: Spec
    min_items: int = 0
    max_items: int | None = None
    name: str | None = None  # how the message calls it ("a list of content parts")

    @property
    def what(self) -> str:
        base = self.name or "a list"
        if self.min_items == 1 and self.name is None:
            base = "a non-empty list"
        if self.max_items is not None:
            base += f" of at most {self.max_items} items"
        return base

    def check(self, v, path):
        if not isinstance(v, list) or len(v) < self.min_items or (
                self.max_items is not None and len(v) > self.max_items):
            raise FieldError(path, self.what)
        for i, x in enumerate(v):
            self.item.check(x, f"{path}[{i}]")


@dataclass(frozen=True)
class Obj(Spec):
    """An object with these fields (each optional unless in `required`; null = absent)."""

    fields: Mapping[str, Spec] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    name: str = "an object"

    @property
    def what(self) -> str:
        return self.name

    def check(self, v, path):
        if not isinstance(v, dict):
            raise FieldError(path or "body", self.what)
        for key in self.required:
            if v.get(key) is None:
                raise RequestError(f"'{_join(path, key)}' is required")
        for key, spec in self.fields.items():
            x = v.get(key)
            if x is not None:
                spec.check(x, _join(path, key))

    def extend(self, fields: Mapping[str, Spec] | None = None, required: tuple[str, ...] = (),
               name: str | None = None) -> "Obj":
        return Obj({**self.fields, **(fields or {})}, self.required + required, name or self.name)


@dataclass(frozen=True)
class Map(Spec):
    """An object with any keys, each value of one spec (logit_bias, template variables)."""

    value: Spec = field(default_factory=Anything)
    max_items: int | None = None

    what = "an object"

    def check(self, v, path):
        if not isinstance(v, dict) or (self.max_items is not None and len(v) > self.max_items):
            raise FieldError(path, self.what if self.max_items is None
                             else f"an object of at most {self.max_items} keys")
        for k, x in v.items():
            self.value.check(x, _join(path, k))


@dataclass(frozen=True)
class AnyOf(Spec):
    """The first option that matches; the message lists them all."""

    options: tuple[Spec, ...]
    name: str | None = None

    @property
    def what(self) -> str:
        if self.name:
            return self.name
        words = [o.what for o in self.options]
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]

    def check(self, v, path):
        for o in self.options:
            if _shape_matches(o, v):
                o.check(v, path)  # the right shape: its own message names the inner field
                return
        raise FieldError(path, self.what)


@dataclass(frozen=True)
class Tagged(Spec):
    """An object whose `key` field (a string) picks its spec; `default` when the key is
    absent, `other` for tags not listed (None: refused)."""

    key: str
    variants: Mapping[str, Obj]
    default: str | None = None
    other: Obj | None = None
    name: str = "an object"

    @property
    def what(self) -> str:
        return self.name

    def check(self, v, path):
        if not isinstance(v, dict):
            raise FieldError(path, self.what)
        tag = v.get(self.key, self.default)
        if not isinstance(tag, str):
            raise FieldError(_join(path, self.key), "a string")
        spec = self.variants.get(tag, self.other)
        if spec is None:
            raise FieldError(_join(path, self.key), "one of " + ", ".join(repr(t) for t in self.variants))
        spec.check(v, path)


def _shape_matches(spec: Spec, v: Any) -> bool:
    """Whether v has the JSON kind of spec (so AnyOf can pick the option to report on)."""
    if isinstance(spec, (Obj, Map, Tagged)):
        return isinstance(v, dict)
    if isinstance(spec, List):
        return isinstance(v, list)
    if isinstance(spec, AnyOf):
        return any(_shape_matches(o, v) for o in spec.options)
    try:
        spec.check(v, "")
        return True
    except RequestError:
        return False


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def check(body: Any, spec: Obj) -> dict:
    """`body` if it fits `spec`, else FieldError naming the first field that does not."""
    spec.check(body, "")
    return body
