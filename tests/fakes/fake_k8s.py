"""A FAKE Kubernetes API server, for the tests of ``sie.transport.k8s_pools``: no
cluster can run here, so this stands in for one. It is a real HTTP server on a
loopback port (the stdlib ``ThreadingHTTPServer`` in a thread of its own), which the
real ``kubernetes_asyncio`` client talks to over a real socket, and it implements only
what that adapter calls, with the API server's semantics:

- namespaced ConfigMaps (``/api/v1/namespaces/{ns}/configmaps``) and Leases
  (``/apis/coordination.k8s.io/v1/namespaces/{ns}/leases``): create (POST), get,
  list (GET, ``labelSelector`` with ``k=v``, ``k==v``, ``k!=v``, ``k`` and ``!k``
  terms), replace (PUT) and delete (DELETE, with ``DeleteOptions`` preconditions and
  ``propagationPolicy``);
- ``metadata.resourceVersion`` from one counter bumped by every write; a replace whose
  ``resourceVersion`` is stale is 409 ``Conflict``; one without it is unconditional
  for ConfigMaps and 422 ``Invalid`` for Leases (whose strategy allows no
  unconditional update, but allows create-on-update); a replace of an absent
  ConfigMap is 404; a replace that changes nothing keeps the ``resourceVersion``; a
  create of an existing name is 409 ``AlreadyExists``; a delete whose precondition is
  stale is 409; a missing object is 404 ``NotFound``; a create that sets
  ``resourceVersion`` is 500, as etcd's storage answers;
- ``metadata.uid``, ``creationTimestamp`` (RFC 3339) and Lease MicroTimes (exactly six
  fractional digits, else 400), the validation of names (DNS-1123 subdomains), labels,
  ConfigMap keys and size (1 MiB), Lease durations and owner references (422);
- garbage collection by ``ownerReferences``: deleting an object deletes its
  dependents (unless ``propagationPolicy: Orphan``, which drops the reference), and an
  object all of whose owners are gone is deleted. A cluster's collector does this a
  moment later; here it is done before the write's response is sent.

Errors are ``Status`` objects (``kind``, ``apiVersion``, ``status: Failure``,
``message``, ``reason``, ``details``, ``code``) and lists are ``{kind}List`` objects
with ``items``. ``fail_next(n, code, path=...)`` makes the next ``n`` requests (to a
path containing ``path``) fail with a 5xx; ``delay_s`` slows every answer.
Anything else (watch, field selectors, PATCH, other resources) is answered as
unsupported: this fake is no general API server.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["FakeKubernetes"]

_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")
_PATH = re.compile(
    r"/(?:api/v1|apis/(?P<group>[a-z0-9.]+)/v1)/namespaces/(?P<ns>[^/]+)/(?P<plural>[a-z]+)"
    r"(?:/(?P<name>[^/]+))?"
)
_OPTIMISTIC = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


@dataclass(frozen=True)
class _Resource:
    kind: str
    plural: str
    group: str  # "" for the core group
    create_on_update: bool
    unconditional_update: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1" if self.group else "v1"


_RESOURCES = {
    ("", "configmaps"): _Resource("ConfigMap", "configmaps", "", False, True),
    ("coordination.k8s.io", "leases"): _Resource(
        "Lease", "leases", "coordination.k8s.io", True, False
    ),
}


class ApiError(Exception):
    """An error answer: a ``Status`` object with ``code``."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any]) -> None:
        super().__init__(message)
        self.status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "details": details,
            "code": code,
        }


def _details(res: _Resource, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "kind": res.plural}
    if res.group:
        out["group"] = res.group
    return out


def _qualified(res: _Resource) -> str:
    return f"{res.plural}.{res.group}" if res.group else res.plural


def _invalid(res: _Resource, name: str, field: str, why: str) -> ApiError:
    details = _details(res, name) | {"causes": [{"reason": "FieldValueInvalid", "field": field}]}
    return ApiError(422, "Invalid", f'{res.kind} "{name}" is invalid: {field}: {why}', details)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKubernetes:
    """The fake API server; ``start()`` it (or use it as a context manager), point a
    client at ``url``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, ns, name)
        self._revision = 0
        self._fail: list[tuple[int, str]] = []  # (code, path part)
        #: Seconds every request waits before it is answered (a slow API server).
        self.delay_s = 0.0
        self.requests: list[tuple[str, str]] = []  # (method, path), in order
        self._server: ThreadingHTTPServer | None = None
        self._conns: set[socket.socket] = set()

    # -- lifecycle ------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeKubernetes:
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-k8s", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        """Stop listening and drop open connections (a server that went down)."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for conn in list(self._conns):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __enter__(self) -> FakeKubernetes:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- test helpers ---------------------------------------------------------------

    def fail_next(self, count: int = 1, code: int = 503, *, path: str = "") -> None:
        """The next ``count`` requests (whose path contains ``path``) answer ``code``
        (a 5xx ``Status``)."""
        with self._lock:
            self._fail.extend([(code, path)] * count)

    def object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A stored object as the server holds it (a copy), or None."""
        with self._lock:
            got = self._objects.get((plural, namespace, name))
            return copy.deepcopy(got)

    def names(self, plural: str, namespace: str) -> list[str]:
        with self._lock:
            return sorted(n for p, ns, n in self._objects if p == plural and ns == namespace)

    # -- the API --------------------------------------------------------------------

    def handle(self, method: str, target: str, body: bytes) -> tuple[int, dict[str, Any]]:
        split = urlsplit(target)
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            self.requests.append((method, split.path))
            try:
                failing = [f for f in self._fail if f[1] in split.path]
                if failing:
                    self._fail.remove(failing[0])
                    code = failing[0][0]
                    reason = {500: "InternalError", 503: "ServiceUnavailable"}.get(code, "")
                    raise ApiError(code, reason, "injected failure", {})
                return self._route(method, split.path, parse_qs(split.query), body)
            except ApiError as exc:
                return int(exc.status["code"]), exc.status

    def _route(
        self, method: str, path: str, query: dict[str, list[str]], body: bytes
    ) -> tuple[int, dict[str, Any]]:
        m = _PATH.fullmatch(path)
        res = m and _RESOURCES.get((m["group"] or "", m["plural"]))
        if not m or not res:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if "watch" in query or "fieldSelector" in query:
            raise ApiError(
                400,
                "BadRequest",
                "fake API server: watch and fieldSelector are not implemented",
                {},
            )
        ns, name = m["ns"], m["name"]
        if name is None and method == "GET":
            return 200, self._list(res, ns, query.get("labelSelector", [""])[0])
        if name is None and method == "POST":
            return 201, self._create(res, ns, _decode(body))
        if name is not None and method == "GET":
            return 200, self._get(res, ns, name)
        if name is not None and method == "PUT":
            return self._replace(res, ns, name, _decode(body))
        if name is not None and method == "DELETE":
            return 200, self._delete(res, ns, name, _decode(body) if body.strip() else {})
        raise ApiError(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            {},
        )

    def _get(self, res: _Resource, ns: str, name: str) -> dict[str, Any]:
        got = self._objects.get((res.plural, ns, name))
        if got is None:
            raise ApiError(
                404, "NotFound", f'{_qualified(res)} "{name}" not found', _details(res, name)
            )
        return copy.deepcopy(got)

    def _list(self, res: _Resource, ns: str, selector: str) -> dict[str, Any]:
        match = _selector(selector)
        items = []
        for (plural, obj_ns, _name), obj in sorted(self._objects.items()):
            if plural == res.plural and obj_ns == ns and match(obj["metadata"].get("labels") or {}):
                items.append(
                    {k: v for k, v in copy.deepcopy(obj).items() if k not in ("kind", "apiVersion")}
                )
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": {"resourceVersion": str(self._revision)},
            "items": items,
        }

    def _checked(self, res: _Resource, ns: str, obj: dict[str, Any], url_name: str | None) -> str:
        """Validate ``obj`` for ``ns``; returns its name."""
        if (
            obj.get("kind", res.kind) != res.kind
            or obj.get("apiVersion", res.api_version) != res.api_version
        ):
            raise ApiError(
                400,
                "BadRequest",
                f"the API version or kind in the body does not match {res.api_version}/{res.kind}",
                {},
            )
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        name = meta.get("name") or url_name or ""
        if url_name is not None and meta.get("name") not in (None, url_name):
            raise ApiError(
                400,
                "BadRequest",
                f"the name of the object ({meta['name']}) does not match the name on the URL ({url_name})",
                {},
            )
        if meta.get("namespace", ns) != ns:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
                {},
            )
        meta["name"], meta["namespace"] = name, ns
        if not name:
            raise _invalid(
                res, name, "metadata.name", "Required value: name or generateName is required"
            )
        if len(name) > 253 or not _SUBDOMAIN.fullmatch(name):
            raise _invalid(
                res,
                name,
                "metadata.name",
                f"Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            )
        for key, value in (meta.get("labels") or {}).items():
            prefix, _, label = key.rpartition("/")
            if (
                (prefix and not _SUBDOMAIN.fullmatch(prefix))
                or len(label) > 63
                or not _LABEL_NAME.fullmatch(label)
            ):
                raise _invalid(
                    res, name, "metadata.labels", f'Invalid value: "{key}": not a qualified name'
                )
            if (
                not isinstance(value, str)
                or len(value) > 63
                or (value and not _LABEL_NAME.fullmatch(value))
            ):
                raise _invalid(
                    res,
                    name,
                    "metadata.labels",
                    f'Invalid value: "{value}": not a valid label value',
                )
        if len(json.dumps(meta.get("annotations") or {})) > 256 * 1024:
            raise _invalid(
                res, name, "metadata.annotations", "Too long: must have at most 262144 bytes"
            )
        for ref in meta.get("ownerReferences") or []:
            for field in ("apiVersion", "kind", "name", "uid"):
                if not isinstance(ref, dict) or not ref.get(field):
                    raise _invalid(
                        res,
                        name,
                        f"metadata.ownerReferences.{field}",
                        "Invalid value: must not be empty",
                    )
        (self._check_config_map if res.kind == "ConfigMap" else self._check_lease)(res, name, obj)
        return str(name)

    def _check_config_map(self, res: _Resource, name: str, obj: dict[str, Any]) -> None:
        data, binary = obj.get("data") or {}, obj.get("binaryData") or {}
        size = 0
        for key, value in [*data.items(), *binary.items()]:
            if not _CONFIG_KEY.fullmatch(key) or len(key) > 253:
                raise _invalid(
                    res,
                    name,
                    f"data[{key}]",
                    "Invalid value: a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                )
            if key in data and key in binary:
                raise _invalid(
                    res,
                    name,
                    f"data[{key}]",
                    "Invalid value: duplicate of key present in binaryData",
                )
            if not isinstance(value, str):
                raise ApiError(
                    400,
                    "BadRequest",
                    f'ConfigMap in version "v1" cannot be handled as a ConfigMap: data[{key}] must be a string',
                    {},
                )
            if key in binary:
                try:
                    size += len(base64.b64decode(value, validate=True))
                except binascii.Error:
                    raise ApiError(
                        400, "BadRequest", "illegal base64 data in binaryData", {}
                    ) from None
            else:
                size += len(value.encode())
        if size > 1024 * 1024:
            raise _invalid(res, name, "[]", "Too long: must have at most 1048576 bytes")

    def _check_lease(self, res: _Resource, name: str, obj: dict[str, Any]) -> None:
        spec = obj.get("spec") or {}
        for field in ("acquireTime", "renewTime"):
            value = spec.get(field)
            if value is None:
                continue
            if not isinstance(value, str) or not _MICRO_TIME.fullmatch(value):
                raise ApiError(
                    400,
                    "BadRequest",
                    f'Lease in version "v1" cannot be handled as a Lease: parsing time "{value}" as "2006-01-02T15:04:05.000000Z07:00": cannot parse',
                    {},
                )
            spec[field] = (
                datetime.fromisoformat(value).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            )
        duration = spec.get("leaseDurationSeconds")
        if duration is not None and (not isinstance(duration, int) or duration <= 0):
            raise _invalid(
                res,
                name,
                "spec.leaseDurationSeconds",
                f"Invalid value: {duration}: must be greater than 0",
            )

    def _create(self, res: _Resource, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        name = self._checked(res, ns, obj, None)
        if obj["metadata"].get("resourceVersion"):
            raise ApiError(
                500,
                "InternalError",
                "Internal error occurred: resourceVersion should not be set on objects to be created",
                {},
            )
        if (res.plural, ns, name) in self._objects:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{_qualified(res)} "{name}" already exists',
                _details(res, name),
            )
        return self._store(res, ns, name, obj, uid=str(uuid.uuid4()), created=_now())

    def _replace(
        self, res: _Resource, ns: str, name: str, obj: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        self._checked(res, ns, obj, name)
        meta = obj["metadata"]
        have = self._objects.get((res.plural, ns, name))
        if have is None:
            if not res.create_on_update:
                raise ApiError(
                    404, "NotFound", f'{_qualified(res)} "{name}" not found', _details(res, name)
                )
            return 201, self._store(res, ns, name, obj, uid=str(uuid.uuid4()), created=_now())
        old = have["metadata"]
        if meta.get("uid") not in (None, "", old["uid"]):
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {_qualified(res)} "{name}": Precondition failed: UID in precondition: {meta["uid"]}, UID in object meta: {old["uid"]}',
                _details(res, name),
            )
        rv = meta.get("resourceVersion")
        if not rv and not res.unconditional_update:
            raise _invalid(
                res,
                name,
                "metadata.resourceVersion",
                "Invalid value: 0x0: must be specified for an update",
            )
        if rv and rv != old["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {_qualified(res)} "{name}": {_OPTIMISTIC}',
                _details(res, name),
            )
        same = _normalized(res, obj, old["uid"], old["creationTimestamp"], old["resourceVersion"])
        if same == have:  # a no-op update: nothing is written
            return 200, copy.deepcopy(have)
        return 200, self._store(
            res, ns, name, obj, uid=old["uid"], created=old["creationTimestamp"]
        )

    def _delete(
        self, res: _Resource, ns: str, name: str, options: dict[str, Any]
    ) -> dict[str, Any]:
        have = self._objects.get((res.plural, ns, name))
        if have is None:
            raise ApiError(
                404, "NotFound", f'{_qualified(res)} "{name}" not found', _details(res, name)
            )
        meta = have["metadata"]
        pre = options.get("preconditions") or {}
        for field, key in (("resourceVersion", "ResourceVersion"), ("uid", "UID")):
            want = pre.get(field)
            if want and want != meta[field]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {_qualified(res)} "{name}": Precondition failed: {key} in precondition: {want}, {key} in object meta: {meta[field]}',
                    _details(res, name),
                )
        del self._objects[(res.plural, ns, name)]
        self._collect(
            ns, orphan=meta["uid"] if options.get("propagationPolicy") == "Orphan" else None
        )
        details = _details(res, name) | {"uid": meta["uid"]}
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }

    def _store(
        self, res: _Resource, ns: str, name: str, obj: dict[str, Any], *, uid: str, created: str
    ) -> dict[str, Any]:
        self._revision += 1
        new = _normalized(res, obj, uid, created, str(self._revision))
        self._objects[(res.plural, ns, name)] = new
        self._collect(ns)
        return copy.deepcopy(new)

    def _collect(self, ns: str, orphan: str | None = None) -> None:
        """The garbage collector: drop references to ``orphan`` and to owners that are
        gone; delete what is left with no owner."""
        while True:
            alive = {
                (o["kind"], o["metadata"]["name"], o["metadata"]["uid"])
                for (_, n, _), o in self._objects.items()
                if n == ns
            }
            for key, obj in list(self._objects.items()):
                refs = obj["metadata"].get("ownerReferences")
                if key[1] != ns or not refs:
                    continue
                kept = [r for r in refs if (r["kind"], r["name"], r["uid"]) in alive]
                if len(kept) == len(refs):
                    continue
                if not kept and not any(r["uid"] == orphan for r in refs):
                    del self._objects[key]
                    break  # its own dependents may be orphans now: look again
                self._revision += 1
                obj["metadata"]["ownerReferences"] = kept
                obj["metadata"]["resourceVersion"] = str(self._revision)
                if not kept:
                    del obj["metadata"]["ownerReferences"]
            else:
                return


def _normalized(
    res: _Resource, obj: dict[str, Any], uid: str, created: str, rv: str
) -> dict[str, Any]:
    """``obj`` as stored: typed, with its system fields, without empty maps."""
    new = copy.deepcopy(obj)
    new["kind"], new["apiVersion"] = res.kind, res.api_version
    new["metadata"].update(uid=uid, creationTimestamp=created, resourceVersion=rv)
    for key in ("labels", "annotations", "ownerReferences"):
        if not new["metadata"].get(key):
            new["metadata"].pop(key, None)
    return new


def _decode(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        obj = None
    if not isinstance(obj, dict):
        raise ApiError(400, "BadRequest", "the body of the request was in an unknown format", {})
    return obj


def _selector(text: str) -> Any:
    """A label selector (equality and existence terms) as a predicate over labels."""
    if "(" in text:
        raise ApiError(
            400, "BadRequest", "fake API server: set-based label selectors are not implemented", {}
        )
    terms: list[tuple[str, str, str]] = []  # (operator, key, value)
    for term in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            terms.append(("!=", k.strip(), v.strip()))
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            terms.append(("=", k.strip(), v.strip()))
        elif term.startswith("!"):
            terms.append(("!", term[1:].strip(), ""))
        else:
            terms.append(("exists", term, ""))

    def match(labels: dict[str, str]) -> bool:
        for op, k, v in terms:
            ok = {
                "!=": labels.get(k) != v,
                "=": labels.get(k) == v,
                "!": k not in labels,
                "exists": k in labels,
            }[op]
            if not ok:
                return False
        return True

    return match


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_fake: FakeKubernetes
    timeout = 30

    def setup(self) -> None:
        super().setup()
        with self.server_fake._lock:
            self.server_fake._conns.add(self.connection)

    def finish(self) -> None:
        with self.server_fake._lock:
            self.server_fake._conns.discard(self.connection)
        super().finish()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        code, payload = self.server_fake.handle(self.command, self.path, body)
        data = json.dumps(payload).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (a timeout) or the server stopped
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass
