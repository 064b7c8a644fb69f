"""``PoolStore`` on Kubernetes: each pool is a ConfigMap, so every gateway of a cluster
shares the pools with no broker (sie.transport.pools docstring; docs/pools.md).

The pool ``{name}`` is the ConfigMap ``sie-pool-{name}`` (``_`` written ``.``; a name
that still would not be a valid object name is ``sie-pool.{base32 of the name}``) in
``namespace``, labelled ``app.kubernetes.io/managed-by: sie``,
``app.kubernetes.io/component: pool`` and ``sie.superlinked.com/pool: {name}`` (when
the name is a valid label value), with the name in the annotation
``sie.superlinked.com/pool`` (read back from there, never from the object name) and
the document under the data key ``pool.json``. The revision is the ConfigMap's
``metadata.resourceVersion``; writing a document identical to the stored one keeps it,
as Kubernetes does for a no-op update.

Calls (``kubernetes_asyncio``): ``CoreV1Api`` list (by the two ``app.kubernetes.io``
labels), read, create (409 AlreadyExists: ``PoolConflict``), replace with
``metadata.resourceVersion`` (409 Conflict or 404: ``PoolConflict``) and delete with a
``resourceVersion`` precondition (409: ``PoolConflict``; 404 is not an error) of
ConfigMaps. After each ConfigMap write, best effort (a failure is logged), a
``coordination.k8s.io/v1`` Lease of the same name mirrors the pool's lease for
``kubectl`` (holder ``sie-gateway``, ``leaseDurationSeconds`` = ``spec.ttl_seconds``,
``acquireTime`` = ``created_at``, ``renewTime`` = ``last_renewed``), owned by the
ConfigMap so that deleting it garbage-collects the Lease; ``delete`` deletes the Lease
too. The ConfigMap is the truth; the Lease is never read. Any other API error, a
timeout or a refused connection is a ``BusError``.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from sie.transport.base import BusError
from sie.transport.pools import PoolConflict, Revision

__all__ = ["DATA_KEY", "POOL_LABEL", "InClusterPoolStore", "KubernetesPoolStore", "object_name"]

log = logging.getLogger(__name__)

DATA_KEY = "pool.json"
#: The pool's name: a label (when a valid label value) and an annotation (always).
POOL_LABEL = "sie.superlinked.com/pool"
_SELECTOR = {"app.kubernetes.io/managed-by": "sie", "app.kubernetes.io/component": "pool"}
_HOLDER = "sie-gateway"
_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def object_name(pool: str) -> str:
    """The ConfigMap and Lease name of ``pool`` (a DNS-1123 subdomain; injective:
    pool names hold no ``.``, and the fallback's ``sie-pool.`` prefix is never a
    readable name's ``sie-pool-``)."""
    readable = "sie-pool-" + pool.replace("_", ".")
    if len(readable) <= 253 and _SUBDOMAIN.fullmatch(readable):
        return readable
    return "sie-pool." + base64.b32encode(pool.encode()).decode().rstrip("=").lower()


def _micro_time(epoch_s: float) -> str:
    """A Kubernetes MicroTime (RFC 3339, exactly six fractional digits)."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _conflict(name: str) -> PoolConflict:
    return PoolConflict(f"pool {name!r} changed since it was read")


def _bus_error(exc: BaseException) -> BusError:
    if isinstance(exc, BusError):
        return exc
    if isinstance(exc, ApiException):
        return BusError(f"pool store: kubernetes API {exc.status} {exc.reason}")
    return BusError(f"pool store: kubernetes API unreachable: {exc or type(exc).__name__}")


#: What a call may raise besides ``ApiException``: the API server is unreachable.
_UNREACHABLE = (aiohttp.ClientError, TimeoutError, OSError)


class KubernetesPoolStore:
    """Pools as ConfigMaps in ``namespace``, through ``api_client`` (which this store
    owns: ``aclose`` closes it)."""

    def __init__(
        self, api_client: client.ApiClient, namespace: str, *, timeout_s: float = 10.0
    ) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.timeout_s = timeout_s
        self._core: Any = client.CoreV1Api(api_client)
        self._coord: Any = client.CoordinationV1Api(api_client)

    @classmethod
    async def in_cluster(cls, namespace: str | None = None) -> KubernetesPoolStore:
        """A store with the pod's service account, in ``namespace`` (default: the
        pod's own). Raises ``BusError`` outside a cluster."""
        configuration = client.Configuration()
        try:
            load: Any = config.load_incluster_config  # untyped
            load(client_configuration=configuration)
            namespace = namespace or _read_namespace()
        except (config.ConfigException, OSError) as exc:
            raise BusError(f"pool store: not in a Kubernetes pod: {exc}") from exc
        return cls(client.ApiClient(configuration=configuration), namespace)

    async def aclose(self) -> None:
        await self.api_client.close()

    async def _api(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)``; raises ``ApiException`` (an error status) or ``BusError``."""
        try:
            return await fn(*args, _request_timeout=self.timeout_s, **kw)
        except ApiException:
            raise
        except _UNREACHABLE as exc:
            raise _bus_error(exc) from exc

    async def list_pools(self) -> dict[str, tuple[bytes, Revision]]:
        selector = ",".join(f"{k}={v}" for k, v in _SELECTOR.items())
        try:
            got = await self._api(
                self._core.list_namespaced_config_map, self.namespace, label_selector=selector
            )
        except ApiException as exc:
            raise _bus_error(exc) from exc
        out: dict[str, tuple[bytes, Revision]] = {}
        for cm in got.items or []:
            name = (cm.metadata.annotations or {}).get(POOL_LABEL)
            doc = _document(cm)
            if name is not None and doc is not None:
                out[name] = (doc, cm.metadata.resource_version)
        return out

    async def get(self, name: str) -> tuple[bytes, Revision] | None:
        try:
            cm = await self._api(
                self._core.read_namespaced_config_map, object_name(name), self.namespace
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _bus_error(exc) from exc
        doc = _document(cm)
        return None if doc is None else (doc, cm.metadata.resource_version)

    async def put(self, name: str, document: bytes, revision: Revision | None) -> Revision:
        body = self._config_map(name, document, revision)
        try:
            if revision is None:
                cm = await self._api(self._core.create_namespaced_config_map, self.namespace, body)
            else:
                cm = await self._api(
                    self._core.replace_namespaced_config_map,
                    object_name(name),
                    self.namespace,
                    body,
                )
        except ApiException as exc:
            if exc.status == 409 or (exc.status == 404 and revision is not None):
                raise _conflict(name) from exc
            raise _bus_error(exc) from exc
        await self._mirror_lease(name, document, cm.metadata.uid)
        rv: str = cm.metadata.resource_version
        return rv

    async def delete(self, name: str, revision: Revision | None = None) -> None:
        options = client.V1DeleteOptions(
            preconditions=None
            if revision is None
            else client.V1Preconditions(resource_version=str(revision))
        )
        try:
            await self._api(
                self._core.delete_namespaced_config_map,
                object_name(name),
                self.namespace,
                body=options,
            )
        except ApiException as exc:
            if exc.status == 404:
                return
            if exc.status == 409:
                raise _conflict(name) from exc
            raise _bus_error(exc) from exc
        try:
            await self._api(self._coord.delete_namespaced_lease, object_name(name), self.namespace)
        except (ApiException, BusError) as exc:
            if not (isinstance(exc, ApiException) and exc.status == 404):
                log.warning("pool %r: deleting its Lease: %s", name, _bus_error(exc).args[0])

    def _config_map(self, name: str, document: bytes, revision: Revision | None) -> Any:
        meta: dict[str, Any] = {
            "name": object_name(name),
            "namespace": self.namespace,
            "labels": _labels(name),
            "annotations": {POOL_LABEL: name},
        }
        if revision is not None:
            meta["resourceVersion"] = str(revision)
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
        try:
            body["data"] = {DATA_KEY: document.decode()}
        except UnicodeDecodeError:
            body["binaryData"] = {DATA_KEY: base64.b64encode(document).decode()}
        return body

    async def _mirror_lease(self, name: str, document: bytes, uid: str) -> None:
        spec = _lease_spec(document)
        if spec is None:
            return
        obj = object_name(name)
        meta: dict[str, Any] = {
            "name": obj,
            "namespace": self.namespace,
            "labels": _labels(name),
            "annotations": {POOL_LABEL: name},
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": obj, "uid": uid}],
        }
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta}
        body["spec"] = spec
        try:
            for _ in range(3):  # Leases allow no unconditional update: read, then write
                try:
                    have = await self._api(self._coord.read_namespaced_lease, obj, self.namespace)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                    have = None
                try:
                    if have is None:
                        meta.pop("resourceVersion", None)
                        await self._api(self._coord.create_namespaced_lease, self.namespace, body)
                    else:
                        meta["resourceVersion"] = have.metadata.resource_version
                        await self._api(
                            self._coord.replace_namespaced_lease, obj, self.namespace, body
                        )
                    return
                except ApiException as exc:
                    if exc.status not in (404, 409):  # raced with another writer: again
                        raise
            log.warning("pool %r: its Lease keeps changing; not mirrored", name)
        except (ApiException, BusError) as exc:
            log.warning("pool %r: mirroring its Lease: %s", name, _bus_error(exc).args[0])


def _read_namespace() -> str:
    return Path(_NAMESPACE_FILE).read_text().strip()


def _labels(name: str) -> dict[str, str]:
    labels = dict(_SELECTOR)
    if len(name) <= 63 and _LABEL_VALUE.fullmatch(name):
        labels[POOL_LABEL] = name
    return labels


def _document(cm: Any) -> bytes | None:
    text = (cm.data or {}).get(DATA_KEY)
    if text is not None:
        return str(text).encode()
    raw = (cm.binary_data or {}).get(DATA_KEY)
    return None if raw is None else base64.b64decode(raw)


def _lease_spec(document: bytes) -> dict[str, Any] | None:
    """The Lease spec mirroring a pool document, or None when it lacks the fields."""
    try:
        doc = json.loads(document)
        out: dict[str, Any] = {
            "holderIdentity": _HOLDER,
            "acquireTime": _micro_time(float(doc["created_at"])),
            "renewTime": _micro_time(float(doc["last_renewed"])),
        }
        spec = doc.get("spec") or {}
        ttl = spec.get("ttl_seconds") if isinstance(spec, dict) else None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, OSError):
        return None
    if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0:
        out["leaseDurationSeconds"] = ttl
    return out


class InClusterPoolStore:
    """``KubernetesPoolStore.in_cluster(namespace)``, made on first use: the container
    builds its stores before an event loop runs (``SIE_POOL_STORE=kubernetes``)."""

    def __init__(self, namespace: str | None = None) -> None:
        self.namespace = namespace
        self._store: KubernetesPoolStore | None = None

    async def _get(self) -> KubernetesPoolStore:
        if self._store is None:
            self._store = await KubernetesPoolStore.in_cluster(self.namespace)
        return self._store

    async def list_pools(self) -> dict[str, tuple[bytes, Revision]]:
        return await (await self._get()).list_pools()

    async def get(self, name: str) -> tuple[bytes, Revision] | None:
        return await (await self._get()).get(name)

    async def put(self, name: str, document: bytes, revision: Revision | None) -> Revision:
        return await (await self._get()).put(name, document, revision)

    async def delete(self, name: str, revision: Revision | None = None) -> None:
        await (await self._get()).delete(name, revision)
