"""JSON request bodies with a bounded parsing cost: flat lists of numbers become numpy arrays
without a Python object per number.

A JSON parser makes every number of a list a Python object: an int is 28 bytes plus an 8-byte list
slot, so a body of 3-digit ids ("123,": 4 bytes an id) costs ~9x its size, ~15x at the peak.
A lookup body is a small object whose bulk is flat lists of numbers, so `decode_json_object`:

* parses a body of at most SMALL_JSON_BYTES whole with orjson (its cost is bounded by that size);
* scans a larger one itself at the top level: the value of a field named in `number_fields`
  that is a flat list (`[`, numbers, commas, JSON whitespace, `]`) is cut out and parsed by
  `parse_number_list` -- checked against the JSON number grammar with vectorised byte-class tests
  and converted by numpy, CHUNK_BYTES at a time, into an int64 or float64 array (8 bytes a
  number, ~2x the body for 3-digit ids); everything else (keys, the table name, any other value)
  must fit in SMALL_JSON_BYTES together and is parsed by orjson, with a placeholder where each list
  was.

Whatever orjson refuses is refused here too, with a `JSONBodyError` (HTTP 400) whose message
starts "malformed JSON body": NaN / Infinity, a number that overflows a double, leading zeros,
`1.`, `.5`, `+1`, trailing or doubled commas, whitespace inside a number, invalid UTF-8 or
escapes, nesting deeper than MAX_JSON_DEPTH, content after the object. Duplicate keys keep the
last value, as with orjson. Beyond orjson: an integer list (a field of kind "int") holding an
integer outside int64 is refused ("value too large"), and a large body is refused when its part
outside the number lists exceeds SMALL_JSON_BYTES.
"""
from __future__ import annotations

import os
import re
from typing import Mapping

import numpy as np
import orjson

__all__ = ["JSONBodyError", "decode_json", "decode_json_object", "parse_number_list", "json_depth_bound",
           "MAX_JSON_DEPTH", "SMALL_JSON_BYTES", "CHUNK_BYTES"]

#: deepest JSON nesting a body may have (a lookup needs 2: the object and its lists)
MAX_JSON_DEPTH = 32
#: bodies up to this size are parsed whole by orjson; a larger body's part outside its number
#: lists must fit in it
SMALL_JSON_BYTES = 64 << 10
#: bytes of a number list checked and converted at a time (bounds the temporaries)
CHUNK_BYTES = 32 << 10

_INT64_MAX = b"9223372036854775807"
_INT64_MIN_ABS = b"9223372036854775808"

_WS = re.compile(rb"[ \t\n\r]*")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
#: one token of a JSON value (only its extent: orjson checks the text)
_TOKEN = re.compile(rb'[ \t\n\r]*(?:("[^"\\]*(?:\\.[^"\\]*)*")|([\[{])|([\]}])|([,:])|([^ \t\n\r"\[\]{},:]+))', re.S)
_NOT_IN_NUMBER_LIST = re.compile(rb"[^0-9+\-.eE \t\n\r,]")
_FLOAT_CHAR = re.compile(rb"[.eE]")


class JSONBodyError(ValueError):
    """A body refused with HTTP 400 and this message."""

    status = 400


def _malformed(what: str) -> JSONBodyError:
    return JSONBodyError(f"malformed JSON body: {what}")


def json_depth_bound(body: bytes) -> int:
    """An upper bound of the nesting depth of a JSON text (brackets inside strings count too);
    CHUNK_BYTES at a time, stopping once past MAX_JSON_DEPTH."""
    opens = body.count(b"[") + body.count(b"{")
    if opens <= MAX_JSON_DEPTH:
        return opens
    depth = best = 0
    for a in range(0, len(body), CHUNK_BYTES):
        b = np.frombuffer(body, dtype=np.uint8, count=min(CHUNK_BYTES, len(body) - a), offset=a)
        step = ((b == ord("[")) | (b == ord("{"))).astype(np.int32) - ((b == ord("]")) | (b == ord("}")))
        run = np.cumsum(step, dtype=np.int64) + depth
        best, depth = max(best, int(run.max())), int(run[-1])
        if best > MAX_JSON_DEPTH:
            break
    return best


def decode_json(body: bytes) -> dict:
    """The JSON object of a body, parsed whole by orjson; JSONBodyError on malformed JSON
    (NaN/Infinity and invalid UTF-8 included), nesting deeper than MAX_JSON_DEPTH, or a non-object."""
    if json_depth_bound(body) > MAX_JSON_DEPTH:
        raise _malformed(f"nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise _malformed(str(e)) from None
    if not isinstance(doc, dict):
        raise JSONBodyError("the JSON body must be an object")
    return doc


# -- number lists ----------------------------------------------------------------------------------
def _check_numbers(raw: np.ndarray) -> tuple[np.ndarray, int]:
    """Check one slice of a number list (bytes between commas, no brackets) against the JSON
    grammar: `number (ws* , ws* number)*` with optional whitespace around; returns the slice
    without whitespace and its count of numbers."""
    ws = (raw == 32) | (raw == 10) | (raw == 13) | (raw == 9)
    if ws.any():
        keep = ~ws
        gap = np.empty_like(ws)  # whitespace right before this byte
        gap[0] = False
        gap[1:] = ws[:-1]
        raw, gap = raw[keep], gap[keep]
        if raw.size > 1:
            inside = raw != 44
            if (gap[1:] & inside[1:] & inside[:-1]).any():
                raise _malformed("whitespace inside a number")
    if raw.size == 0:
        raise _malformed("a list element is missing")
    comma = raw == 44
    digit = (raw - np.uint8(48)) < 10
    minus, plus, dot = raw == 45, raw == 43, raw == 46
    exp = (raw | np.uint8(32)) == 101
    if not (digit | comma | minus | plus | dot | exp).all():
        raise _malformed("unexpected character in a list of numbers")
    if comma[0] or comma[-1] or (comma[1:] & comma[:-1]).any():
        raise _malformed("a list element is missing (doubled, leading or trailing comma)")
    start = np.empty_like(comma)  # first byte of a number
    start[0] = True
    start[1:] = comma[:-1]
    if (start & ~(digit | minus)).any():
        raise _malformed("a number must start with a digit or '-'")
    end = np.empty_like(comma)
    end[-1] = True
    end[:-1] = comma[1:]
    if (end & ~digit).any():
        raise _malformed("a number must end with a digit")
    a, b = slice(None, -1), slice(1, None)  # byte pairs (i, i + 1) inside one number
    ok = ((digit[b] & (digit[a] | minus[a] | plus[a] | dot[a] | exp[a])) | ((dot[b] | exp[b]) & digit[a])
          | ((plus[b] | minus[b]) & exp[a]))
    if (~ok & ~comma[a] & ~comma[b]).any():
        raise _malformed("invalid number")
    int_start = start & digit  # first digit of the integer part
    int_start[1:] |= start[:-1] & minus[:-1] & digit[1:]
    if (int_start[:-1] & (raw[:-1] == 48) & digit[1:]).any():
        raise _malformed("number with leading zero is not allowed")
    if dot.any() or exp.any():  # at most one '.', one exponent, '.' before it
        kind = raw[dot | exp | comma]
        kind = (kind == 46).astype(np.int8) + 2 * (kind != 46) * (kind != 44)
        if (((kind[:-1] == 1) & (kind[1:] == 1)) | ((kind[:-1] == 2) & (kind[1:] != 0))).any():
            raise _malformed("invalid number")
    return raw, int(comma.sum()) + 1


def _check_int64(raw: np.ndarray, field: str) -> None:
    """Refuse numbers of a checked, whitespace-free slice that do not fit int64."""
    bounds = np.flatnonzero(raw == 44)
    first = np.concatenate([[0], bounds + 1])
    last = np.concatenate([bounds, [raw.size]])
    neg = raw[first] == 45
    first = first + neg
    digits = last - first
    if not (digits >= 19).any():
        return
    if (digits > 19).any():
        raise JSONBodyError(f"\"{field}\": value too large")
    rows = np.flatnonzero(digits == 19)
    text = raw[first[rows, None] + np.arange(19)]
    limit = np.where(neg[rows, None], np.frombuffer(_INT64_MIN_ABS, np.uint8), np.frombuffer(_INT64_MAX, np.uint8))
    differ = text != limit
    col = differ.argmax(axis=1)
    at = np.arange(rows.size)
    if (differ.any(axis=1) & (text[at, col] > limit[at, col])).any():
        raise JSONBodyError(f"\"{field}\": value too large")


def parse_number_list(body: bytes, a: int, b: int, field: str, kind: str) -> np.ndarray:
    """The numbers of the JSON list whose text between `[` and `]` is body[a:b]: int64 when
    `kind` is "int" and every number is an integer, else float64. JSONBodyError when the text is
    not a JSON list of numbers, a number overflows a double, or (kind "int") an integer int64."""
    if _WS.match(body, a, b).end() == b:
        return np.zeros(0, dtype=np.int64 if kind == "int" else np.float64)
    dtype = np.int64 if kind == "int" and _FLOAT_CHAR.search(body, a, b) is None else np.float64
    out = np.empty(body.count(b",", a, b) + 1, dtype=dtype)
    pos, k = a, 0
    while True:
        end = b if b - pos <= CHUNK_BYTES else body.rfind(b",", pos, pos + CHUNK_BYTES)
        if end < 0:
            raise _malformed(f"a number of \"{field}\" is longer than {CHUNK_BYTES} characters")
        text = body[pos:end]
        raw, count = _check_numbers(np.frombuffer(text, dtype=np.uint8))
        if dtype == np.int64:
            _check_int64(raw, field)
        vals = np.fromstring(text, dtype=dtype, sep=",")
        if vals.size != count:  # cannot happen after the checks; never hand out a short list
            raise _malformed(f"unreadable numbers in \"{field}\"")
        out[k: k + count] = vals
        k += count
        if end == b:
            break
        pos = end + 1
    if k != out.size:
        raise _malformed(f"unreadable numbers in \"{field}\"")
    if dtype == np.float64 and np.isinf(out).any():
        raise _malformed(f"a number of \"{field}\" is infinity when parsed as double")
    return out


# -- the object ------------------------------------------------------------------------------------
def _skip_ws(body: bytes, i: int) -> int:
    return _WS.match(body, i).end()


def _too_big() -> JSONBodyError:
    return JSONBodyError(f"a JSON body may hold at most {SMALL_JSON_BYTES} bytes outside its flat lists of numbers")


def _token(pattern: re.Pattern, body: bytes, i: int, limit: int):
    """`pattern` matched at i within `limit`; a match the limit cuts short is over the budget."""
    m = pattern.match(body, i, limit)
    if limit < len(body) and (m is None or m.end() == limit) and pattern.match(body, i) is not None:
        raise _too_big()
    return m


def _value_end(body: bytes, i: int, limit: int) -> int:
    """Where the JSON value starting at body[i] ends (its extent only; orjson checks its text)."""
    depth, pos = 0, i
    while True:
        m = _token(_TOKEN, body, pos, limit)
        if m is None:
            raise _malformed(f"unexpected content at char {pos}")
        pos = m.end()
        if m.group(2):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise _malformed(f"nested deeper than {MAX_JSON_DEPTH} levels")
        elif m.group(3):
            depth -= 1
            if depth < 0:
                raise _malformed(f"unexpected '{chr(body[pos - 1])}' at char {pos - 1}")
        elif m.group(4) and depth == 0:
            raise _malformed(f"expected a value at char {pos - 1}")
        if depth == 0:
            return pos


def _key_name(key: bytes) -> str | None:
    try:
        return orjson.loads(key)
    except orjson.JSONDecodeError:
        return None  # orjson names the problem when it parses the skeleton


def decode_json_object(body: bytes, number_fields: Mapping[str, str], whole_bytes: int = SMALL_JSON_BYTES) -> dict:
    """The JSON object of `body`; the value of a field in `number_fields` ({name: "int" or
    "float"}) that is a flat list of numbers comes back as a numpy array when the body is larger
    than `whole_bytes` (see the module docstring), as a list otherwise."""
    n = len(body)
    if n <= whole_bytes:
        return decode_json(body)
    i = _skip_ws(body, 0)
    if body[i: i + 1] != b"{":
        if json_depth_bound(body) > MAX_JSON_DEPTH:
            raise _malformed(f"nested deeper than {MAX_JSON_DEPTH} levels")
        raise _malformed("the body must be a JSON object")
    nonce = os.urandom(8).hex()
    parts, lists, left = [b"{"], {}, SMALL_JSON_BYTES
    i = _skip_ws(body, i + 1)
    if body[i: i + 1] == b"}":
        parts.append(b"}")
        i += 1
    else:
        while True:
            m = _token(_STRING, body, i, min(n, i + left))
            if m is None:
                raise _malformed(f"expected a string key at char {i}")
            key = m.group()
            left -= len(key)
            i = _skip_ws(body, m.end())
            if body[i: i + 1] != b":":
                raise _malformed(f"expected ':' at char {i}")
            i = _skip_ws(body, i + 1)
            name, end = _key_name(key), -1
            if name in number_fields and body[i: i + 1] == b"[":
                close = body.find(b"]", i + 1)
                if close > 0 and _NOT_IN_NUMBER_LIST.search(body, i + 1, close) is None:
                    ref = f"{nonce}:{len(lists)}"
                    lists[ref] = (name, i + 1, close)
                    parts += [key, b":", orjson.dumps(ref)]
                    end = close + 1
            if end < 0:
                end = _value_end(body, i, min(n, i + left))
                left -= end - i
                parts += [key, b":", body[i:end]]
            i = _skip_ws(body, end)
            c = body[i: i + 1]
            if c == b",":
                parts.append(b",")
                i = _skip_ws(body, i + 1)
            elif c == b"}":
                parts.append(b"}")
                i += 1
                break
            else:
                raise _malformed(f"expected ',' or '}}' at char {i}")
    if _skip_ws(body, i) != n:
        raise _malformed(f"unexpected content after the object at char {i}")
    doc = decode_json(b"".join(parts))
    for key, v in doc.items():
        if isinstance(v, str) and v in lists:
            name, a, b = lists[v]
            doc[key] = parse_number_list(body, a, b, name, number_fields[name])
    return doc
