"""A small client of the lookup service (standard library + numpy)."""
from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np

__all__ = ["EmbeddingClient", "ServiceError"]


class ServiceError(RuntimeError):
    """An HTTP error answer of the service: `status` and the service's message."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


class EmbeddingClient:
    """`EmbeddingClient("http://127.0.0.1:8700", token=None)`.

    `lookup` sends an npz body to `/v1/lookup/npy` (binary both ways) unless `binary=False`,
    which uses the JSON endpoint.
    """

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0):
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout

    def _request(self, method: str, path: str, body: bytes | None = None, ctype: str = "application/json") -> tuple[bytes, str]:
        req = urllib.request.Request(self.url + path, data=body, method=method)
        if body is not None:
            req.add_header("Content-Type", ctype)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return r.read(), r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                msg = json.loads(raw)["error"]
            except Exception:  # noqa: BLE001
                msg = raw.decode("utf-8", "replace")
            raise ServiceError(e.code, msg) from None

    def _json(self, method: str, path: str, obj: Any = None) -> Any:
        raw, _ = self._request(method, path, None if obj is None and method == "GET" else json.dumps(obj or {}).encode())
        return json.loads(raw)

    def lookup(self, table: str, indices, offsets, per_sample_weights=None, binary: bool = True) -> np.ndarray:
        """Pooled embeddings [len(offsets), D] (float32), as torch.nn.EmbeddingBag(indices, offsets)."""
        if not binary:
            doc = {"table": table, "indices": np.asarray(indices).tolist(), "offsets": np.asarray(offsets).tolist()}
            if per_sample_weights is not None:
                doc["per_sample_weights"] = np.asarray(per_sample_weights).tolist()
            res = self._json("POST", "/v1/lookup", doc)
            return np.asarray(res["embeddings"], dtype=np.float32).reshape(res["shape"])
        arrays = {"indices": np.asarray(indices, dtype=np.int64), "offsets": np.asarray(offsets, dtype=np.int64)}
        if per_sample_weights is not None:
            arrays["per_sample_weights"] = np.asarray(per_sample_weights, dtype=np.float32)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        from urllib.parse import quote

        raw, _ = self._request("POST", f"/v1/lookup/npy?table={quote(table)}", buf.getvalue(), "application/octet-stream")
        return np.load(io.BytesIO(raw), allow_pickle=False)

    def health(self) -> dict:
        return self._json("GET", "/v1/health")

    def metrics(self) -> dict:
        return self._json("GET", "/v1/metrics")

    def snapshot(self, name: str | None = None) -> dict:
        return self._json("POST", "/v1/snapshot", {"name": name} if name else {})

    def shutdown(self) -> dict:
        return self._json("POST", "/v1/shutdown", {})
