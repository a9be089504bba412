"""`mgg.embedding.lookup_request`: npz bodies decoded like np.load (with the .npy header parsed
under a lock), replies encoded in pieces byte-identical to one orjson / np.save of the whole."""
import concurrent.futures as cf
import io

import numpy as np
import orjson
import pytest

from mgg.embedding.lookup_request import BadRequest, decode_npz, encode_json_reply, encode_npy_reply
from mgg.testing.serve import npz_bytes


def test_npz_bodies_decode_like_np_load():
    rng = np.random.default_rng(0)
    arrays = dict(a=rng.integers(0, 9, 1000), b=np.asfortranarray(rng.random((30, 7))), c=np.zeros(0, np.int32),
                  d=np.array(5), e=rng.random(300_000).astype(np.float32), f=rng.integers(0, 9, (3, 4, 5)).astype(np.uint16))
    got = decode_npz(npz_bytes(**arrays), 1 << 24)
    assert sorted(got) == sorted(arrays)
    for k, v in arrays.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and got[k].flags.writeable, k
        np.testing.assert_array_equal(got[k], v)
    z = io.BytesIO()
    np.savez_compressed(z, x=np.arange(100_000))
    np.testing.assert_array_equal(decode_npz(z.getvalue(), 1 << 24)["x"], np.arange(100_000))


@pytest.mark.parametrize("body,reason", [
    (npz_bytes(o=np.array([1, "x"], dtype=object)), "allow_pickle"),
    (b"PK\x03\x04garbage", "zip"),
    (npz_bytes(a=np.arange(10))[:-60], "zip"),
])
def test_bad_npz_bodies_are_400(body, reason):
    with pytest.raises(BadRequest, match=reason) as e:
        decode_npz(body, 1 << 24)
    assert e.value.status == 400


def test_npz_decoding_from_many_threads_at_once():
    bodies = [npz_bytes(indices=np.arange(i % 50 + 1), offsets=np.array([0])) for i in range(64)]
    with cf.ThreadPoolExecutor(8) as ex:
        got = list(ex.map(lambda k: decode_npz(bodies[k % 64], 1 << 24), range(4000)))
    assert all(len(g["indices"]) == k % 64 % 50 + 1 for k, g in enumerate(got))


@pytest.mark.parametrize("shape", [(0, 8), (1, 3), (5000, 64), (70_000, 1), (3, 20_000)])
def test_reply_pieces_equal_the_whole_encoding(shape):
    out = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    pieces = encode_json_reply("t0", out)
    assert len(pieces) > 2 or out.size <= 1 << 14
    assert b"".join(pieces) == orjson.dumps({"table": "t0", "shape": list(shape), "embeddings": out},
                                            option=orjson.OPT_SERIALIZE_NUMPY)
    header, arr = encode_npy_reply(out)
    whole = io.BytesIO()
    np.save(whole, out)
    assert header + memoryview(arr).tobytes() == whole.getvalue()
