"""`mgg.embedding.json_body`: a lookup body's number lists parsed by numpy, checked against orjson.

Every body is decoded by the scanner (whole_bytes=0) and by orjson: the scanner accepts exactly
what orjson accepts (refusing in addition only integers outside int64 in integer fields) and
returns the same numbers, bit for bit.
"""
import json
import random
import tracemalloc

import numpy as np
import orjson
import pytest

from mgg.embedding.json_body import (CHUNK_BYTES, MAX_JSON_DEPTH, SMALL_JSON_BYTES, JSONBodyError, decode_json_object,
                                     json_depth_bound)

FIELDS = {"indices": "int", "offsets": "int", "per_sample_weights": "float"}


def scan(body: bytes) -> dict:
    return decode_json_object(body, FIELDS, whole_bytes=0)


def outside_int64(values) -> bool:
    return any(isinstance(x, float) and (x <= -2 ** 63 or x >= 2 ** 63) or isinstance(x, int) and not -2 ** 63 <= x < 2 ** 63
               for x in values)


def agrees_with_orjson(body: bytes) -> str | None:
    """None when the scanner and orjson agree on `body`, else what differs."""
    try:
        ref = orjson.loads(body)
        if not isinstance(ref, dict):
            ref = None
    except orjson.JSONDecodeError:
        ref = None
    try:
        got = scan(body)
    except JSONBodyError as e:
        if ref is None or ("value too large" in str(e) and any(
                FIELDS.get(k) == "int" and isinstance(v, list) and outside_int64(v) for k, v in ref.items())):
            return None
        return f"refused valid JSON: {e}"
    if ref is None:
        return f"accepted malformed JSON as {got}"
    if set(ref) != set(got):
        return f"keys {sorted(got)} != {sorted(ref)}"
    for k, r in ref.items():
        g = got[k]
        if not isinstance(g, np.ndarray):
            if g != r:
                return f"{k}: {g!r} != {r!r}"
        elif FIELDS[k] == "float" or any(isinstance(x, float) for x in r):
            if g.dtype != np.float64 or not np.array_equal(g, np.asarray(r, dtype=np.float64)):
                return f"{k}: {g} != {r}"
        elif g.dtype != np.int64 or g.tolist() != r:
            return f"{k}: {g} != {r}"
    return None


SPECIAL = ["1e5", "1E-3", "-0.0", "0", "-0", "1e400", "1e-400", "2.5e+10", "123456789012345678901234567890",
           "0.1000000000000000055511151231257827021181583404541015625", str(2 ** 63 - 1), str(-2 ** 63), str(2 ** 63),
           str(-2 ** 63 - 1), str(10 ** 19), "9999999999999999999", "-9999999999999999999", "1000000000000000000"]
NOISE = list("0123456789-+.eE ,\t\n") + ["", "[", "]", "x", "00", "1", "-0", "\r", "\x0c", "\"", "NaN", "}"]


def random_body(rng: random.Random) -> bytes:
    def number():
        r = rng.random()
        if r < 0.4:
            return str(rng.randint(-10 ** 6, 10 ** 6))
        if r < 0.5:
            return str(rng.randint(10 ** 18, 10 ** 19) * rng.choice([1, -1]))
        if r < 0.8:
            return repr(rng.uniform(-1e6, 1e6))
        return rng.choice(SPECIAL)

    fields = []
    for k in rng.sample(["table", "indices", "offsets", "per_sample_weights", "other"], rng.randint(0, 5)):
        items = [number() for _ in range(rng.randint(0, 8))]
        seps = [rng.choice([",", ", ", " ,", ",\n", "\t,\r"]) for _ in items]
        value = ('"t0"' if k == "table" else "[" + rng.choice(["", " "]) + "".join(
            x + (seps[i] if i < len(items) - 1 else "") for i, x in enumerate(items)) + rng.choice(["", "\n"]) + "]")
        fields.append(f'"{k}"{rng.choice([":", " : "])}{value}')
    text = list("{" + ",".join(fields) + "}")
    if rng.random() < 0.6:  # damage it
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(text) + 1)
            op = rng.random()
            if op < 0.4 and text:
                del text[min(i, len(text) - 1)]
            elif op < 0.8:
                text.insert(i, rng.choice(NOISE))
            elif text:
                text[min(i, len(text) - 1)] = rng.choice(NOISE)
    return "".join(text).encode()


@pytest.mark.parametrize("seed", range(4))
def test_random_bodies_agree_with_orjson(seed):
    rng = random.Random(seed)
    bad = [(b, why) for b in (random_body(rng) for _ in range(3000)) if (why := agrees_with_orjson(b))]
    assert not bad, bad[:3]


@pytest.mark.parametrize("body", [
    b'{"indices":[NaN]}', b'{"indices":[Infinity]}', b'{"indices":[01]}', b'{"indices":[-01]}', b'{"indices":[1.]}',
    b'{"indices":[.5]}', b'{"indices":[+1]}', b'{"indices":[1,]}', b'{"indices":[,1]}', b'{"indices":[1,,2]}',
    b'{"indices":[1 2]}', b'{"indices":[- 1]}', b'{"indices":[-]}', b'{"indices":[1e]}', b'{"indices":[1e+]}',
    b'{"indices":[1.5.5]}', b'{"indices":[1e5e5]}', b'{"indices":[1e5.5]}', b'{"indices":[1.e5]}', b'{"indices":[0x10]}',
    b'{"indices":[1\x0c]}', b'{"indices":[1]', b'{"indices":[1]]}', b'{"indices" [1]}', b'{"indices":[1]} x',
    b'{"indices":[1e400]}', b'{"per_sample_weights":[-1e400]}', b'{"table": "\xff"}', b'{"ta\\qle": 1}', b'{indices:[1]}',
    b"{'indices':[1]}", b'{"indices":[1],}', b'{,"indices":[1]}', b'{"indices":[1] "offsets":[0]}', b'\xef\xbb\xbf{}',
    b'{"indices":[1]}\x00', b'{"a":{"b":[1,2}}', b"{" + b'"a":' * 3 + b"1}",
])
def test_malformed_bodies_are_refused(body):
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(body)
    with pytest.raises(JSONBodyError, match="malformed JSON body"):
        scan(body)


def test_valid_forms_match_orjson():
    for body in [b'{"indices":[0.01, 10, 1e01, 1E+05, -0.0, -0]}', b'{"indices":[1\t,\n2\r]}', b'{"indices":[ ]}',
                 b'{"indices":[]}', b' {} ', b'{"a":1,"a":2}', b'{"indices":[1],"indices":[2]}', b'{"indices":[[1]]}',
                 b'{"t\\u0061ble": "x", "indices": [3]}', b'{"ind\\u0069ces": [3, 4]}', b'{"indices":[true, null]}',
                 b'{"offsets":[9223372036854775807, -9223372036854775808]}', b'{"other":[1, 2], "table": "[[{"}',
                 b'{"per_sample_weights": [1, 2.5, 3e-2, 123456789012345678901234567890]}']:
        assert agrees_with_orjson(body) is None, body


@pytest.mark.parametrize("value", [str(2 ** 63), str(-2 ** 63 - 1), str(10 ** 19), "9999999999999999999", "1" + "0" * 30])
def test_integers_outside_int64_are_refused(value):
    with pytest.raises(JSONBodyError, match="\"offsets\": value too large"):
        scan(f'{{"offsets": [1, {value}, 2]}}'.encode())
    assert scan(f'{{"per_sample_weights": [{value}]}}'.encode())["per_sample_weights"][0] == float(value)


def test_long_lists_cross_chunk_boundaries_exactly():
    rng = np.random.default_rng(0)
    idx = rng.integers(-2 ** 63, 2 ** 63 - 1, 40_000, dtype=np.int64)
    idx[::97] = rng.integers(0, 10, idx[::97].size)
    w = rng.standard_normal(40_000) * 10.0 ** rng.integers(-30, 30, 40_000)
    for sep in [(",", ":"), (", ", ": ")]:
        body = json.dumps({"table": "t", "indices": idx.tolist(), "per_sample_weights": w.tolist(), "offsets": [0]},
                          separators=sep).encode()
        assert len(body) > 20 * CHUNK_BYTES
        doc = decode_json_object(body, FIELDS)  # past whole_bytes: the scanner
        assert isinstance(doc["indices"], np.ndarray) and doc["indices"].dtype == np.int64
        np.testing.assert_array_equal(doc["indices"], idx)
        np.testing.assert_array_equal(doc["per_sample_weights"], np.asarray(orjson.loads(body)["per_sample_weights"]))
        assert doc["table"] == "t" and doc["offsets"].tolist() == [0]
    bad = body[:-200] + b",]" + body[-198:]  # a trailing comma deep inside the last list
    assert agrees_with_orjson(bad) is None


def test_a_number_longer_than_a_chunk_is_refused():
    body = b'{"per_sample_weights": [1, 0.' + b"1" * (CHUNK_BYTES + 10) + b"]}"
    with pytest.raises(JSONBodyError, match="longer than"):
        scan(body)


def test_large_body_costs_a_few_times_its_size():
    """16 MiB of 3-digit ids: orjson's objects would be ~20x the body; the arrays are ~2x."""
    ids = np.random.default_rng(1).integers(100, 1000, 4_000_000)
    body = json.dumps({"table": "t", "indices": ids.tolist(), "offsets": [0, 5]}, separators=(",", ":")).encode()
    tracemalloc.start()
    try:
        doc = decode_json_object(body, FIELDS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(doc["indices"], ids)
    assert peak <= 2.5 * len(body), peak / len(body)


def test_large_body_limits_outside_number_lists():
    pad = "x" * (SMALL_JSON_BYTES + 10)
    for doc in ({"table": pad, "indices": [1]}, {"indices": ["1"] * 20000}, {"other": list(range(20000))},
                {"indices": [[i] for i in range(20000)]}):
        with pytest.raises(JSONBodyError, match=f"at most {SMALL_JSON_BYTES} bytes outside"):
            decode_json_object(json.dumps(doc).encode(), FIELDS)
    with pytest.raises(JSONBodyError, match="must be a JSON object"):
        decode_json_object(json.dumps(list(range(30000))).encode(), FIELDS)
    with pytest.raises(JSONBodyError, match="nested deeper"):
        decode_json_object(b"[" * 100000 + b"]" * 100000, FIELDS)
    with pytest.raises(JSONBodyError, match="nested deeper"):
        decode_json_object(b'{"indices": ' + b"[" * 5000 + b"]" * 5000 + b', "offsets": [0]}' + b" " * SMALL_JSON_BYTES,
                           FIELDS)


def test_depth_bound_over_chunks():
    body = b" " * (3 * CHUNK_BYTES) + b"[" * (MAX_JSON_DEPTH + 5) + b"]" * (MAX_JSON_DEPTH + 5)
    assert json_depth_bound(body) > MAX_JSON_DEPTH
    assert json_depth_bound(b"[]" * 100000) == 1
