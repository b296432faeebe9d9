"""A Kubernetes API server for tests: kmock's emulator, made to behave like the real one.

Over 400 lines on purpose: every behaviour below shares ApiServer's one store of objects.

kmock keeps objects in memory and serves list, watch, create, patch and
delete over real HTTP, but stamps nothing and validates nothing. The
operator's correctness depends on exactly those details, so ``ApiServer``
adds them, the way kube-apiserver does them:

- ``uid``, ``creationTimestamp``, a global ``resourceVersion`` on every
  write, ``generation`` bumped only when something outside metadata and
  status changes, no-op patches that change nothing (no event, no bump);
- the status subresource: a patch to ``/status`` changes only the status,
  any other patch leaves the status alone;
- merge patch, JSON patch (a failed ``test`` op is 422, as kopf expects) and
  server-side apply (the applier's top-level fields replace the live ones; it
  creates the object when it is missing); an update (PUT) replaces the object;
  a write that names a ``resourceVersion`` other than the stored one is
  refused with 409 Conflict (compare-and-swap, what leader election needs);
- custom resources validated against their CRD's OpenAPI schema (422), and a
  CRD created through the API becomes a served resource;
- lists honour equality label selectors and return the real resourceVersion;
  watches resume from a resourceVersion instead of replaying everything;
- deletion waits for finalizers, then garbage-collects the objects that name
  the deleted one as their owner (background propagation); an object created
  after its owners went (a controller that read its owner just before) is
  collected just after its create is answered, as the garbage collector finds
  owner references to no live object;
- StorageClasses as admission uses them: a PVC created without a class gets
  the default one, and growing a PVC whose class does not set
  ``allowVolumeExpansion: true`` (or a PVC without a class) is refused with
  403, as the PersistentVolumeClaimResize admission plugin refuses it.

Every request is recorded (``ApiServer.requests``: the RBAC verb, group and
resource it needs, and its User-Agent) so that a test can check that the
operator's role grants each one the operator made.

What it still does not do: CEL rules, defaulting from the schema, admission,
and any controller (no pods appear; tests play the controllers).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp.web
import jsonpatch
import jsonpointer
import jsonschema
import kmock
from kmock._internal import dicts, enums, rendering
from kubernetes.utils import parse_quantity

ROOT = Path(__file__).resolve().parent.parent
CRD_FILE = ROOT / "charts" / "durable-streams" / "crds" / "durablestreams.yaml"
# The published openAPIV3Schema of the Spark Operator's CRD (see tests/operator/crds/README.md).
SPARK_CRD_SCHEMA = ROOT / "tests" / "operator" / "crds" / "scheduledsparkapplications.json"

# The group/version/plural of the kinds tests touch, for URL building.
KINDS: dict[str, tuple[str, str, str]] = {
    "ConfigMap": ("", "v1", "configmaps"),
    "Service": ("", "v1", "services"),
    "Event": ("", "v1", "events"),
    "PersistentVolumeClaim": ("", "v1", "persistentvolumeclaims"),
    "Pod": ("", "v1", "pods"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
    "StorageClass": ("storage.k8s.io", "v1", "storageclasses"),
    "Lease": ("coordination.k8s.io", "v1", "leases"),
    "ServiceAccount": ("", "v1", "serviceaccounts"),
    "Role": ("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    "CustomResourceDefinition": ("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
    "DurableStream": ("streams.pyds.dev", "v1alpha1", "durablestreams"),
    "ServiceMonitor": ("monitoring.coreos.com", "v1", "servicemonitors"),
    "ScheduledSparkApplication": ("sparkoperator.k8s.io", "v1beta2", "scheduledsparkapplications"),
}


def durable_stream(
    name: str, spec: dict[str, Any] | None = None, namespace: str = "default"
) -> dict:
    """A DurableStream custom resource, as a user would write it."""
    return {
        "apiVersion": "/".join(KINDS["DurableStream"][:2]),
        "kind": "DurableStream",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec or {},
    }


# The annotation that makes a StorageClass the default one (DefaultStorageClass admission).
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
# The PersistentVolumeClaimResize admission plugin's refusal, word for word.
RESIZE_FORBIDDEN = (
    "only dynamically provisioned pvc can be resized and "
    "the storageclass that provisions the pvc must support resize"
)


def storage_class(name: str, *, expandable: bool | None, default: bool = False) -> dict:
    """A StorageClass; ``expandable=None`` leaves ``allowVolumeExpansion`` out (it means false)."""
    obj: dict[str, Any] = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": "example.com/csi",
    }
    if default:
        obj["metadata"]["annotations"] = {DEFAULT_CLASS: "true"}
    if expandable is not None:
        obj["allowVolumeExpansion"] = expandable
    return obj


class Call(NamedTuple):
    """One request, as RBAC sees it (``resource`` is ``plural[/subresource]``)."""

    verb: str
    group: str
    resource: str
    agent: str
    namespace: str | None = None  # None: a cluster-scoped object, or across all namespaces


def _verb(request: rendering.Request) -> str | None:
    """The RBAC verb a request needs (None: not a resource request, e.g. discovery)."""
    if request.resource is None or not request.resource.plural:
        return None
    if request.action == enums.action.UPDATE:
        return "update" if request.method == enums.method.PUT else "patch"
    return {
        enums.action.LIST: "list",
        enums.action.WATCH: "watch",
        enums.action.FETCH: "get",
        enums.action.CREATE: "create",
        enums.action.DELETE: "delete",
    }.get(request.action)


def _pvc_request(obj: dict[str, Any]) -> int | None:
    raw = (((obj.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")
    return None if raw is None else int(parse_quantity(raw))


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _body(obj: dict[str, Any]) -> dict[str, Any]:
    """What counts for ``generation``: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _selected(request: rendering.Request, obj: dict[str, Any]) -> bool:
    """Whether a list or watch request selects ``obj`` (namespace, name, equality labels)."""
    meta = obj.get("metadata") or {}
    if request.namespace is not None and meta.get("namespace") != request.namespace:
        return False
    if request.name is not None and meta.get("name") != request.name:
        return False
    selector = request.params.get("labelSelector")
    labels = meta.get("labels") or {}
    for term in selector.split(",") if selector else ():
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.lstrip("=").strip():
            return False
    return True


# How many of its own past requests kmock keeps (ApiServer._forget_old_requests).
KMOCK_HISTORY = 100


class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with the API server behaviour listed in the module docstring."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._rv = 0
        self._schemas: dict[Any, dict[str, Any]] = {}
        self._status_subresource: set[Any] = set()
        self.requests: list[Call] = []  # every resource request, in order
        # Objects created with only dangling owner references, by request: collected
        # once the create is answered (the real garbage collector is asynchronous too).
        self._orphans: dict[int, tuple[Any, str]] = {}
        self._collecting: set[asyncio.Task[None]] = set()
        self.resources.load_bundled()
        for res, info in list(self.resources.items()):
            if "status" in info.subresources:
                self._status_subresource.add(res)

    # -- resources -----------------------------------------------------------------------

    def install_crd(self, crd: dict[str, Any]) -> None:
        """Serve a CRD's resource (discovery, schema validation, status subresource)."""
        spec = crd["spec"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            res = kmock.resource(spec["group"], version["name"], spec["names"]["plural"])
            subresources = set((version.get("subresources") or {}).keys())
            self.resources[res] = kmock.ResourceInfo(
                kind=spec["names"]["kind"],
                singular=spec["names"].get("singular"),
                namespaced=spec["scope"] == "Namespaced",
                shortnames=spec["names"].get("shortNames", []),
                verbs=["create", "delete", "get", "list", "patch", "update", "watch"],
                subresources=subresources,
            )
            if "status" in subresources:
                self._status_subresource.add(res)
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if schema:
                self._schemas[res] = openapi_as_jsonschema(schema)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _validate(self, resource: Any, obj: dict[str, Any]) -> None:
        schema = self._schemas.get(resource)
        if schema is None:
            return
        try:
            jsonschema.validate(obj, schema)
        except jsonschema.ValidationError as exc:
            where = ".".join(str(p) for p in exc.absolute_path) or "<root>"
            raise kmock.KubernetesError(422, "Invalid", f"{where}: {exc.message}") from None

    # -- writes --------------------------------------------------------------------------

    def _forget_old_requests(self) -> None:
        """Keep kmock's own request history short. kmock keeps every request for its
        assertions and finds which reaction sees the one being served by scanning that
        history, so each request cost time in proportion to all before it: over a
        minutes-long test with a replica set (Lease renewals, a kubelet, an operator) the
        emulator slowed until Lease renewals missed their deadlines. ``requests`` (ours)
        keeps every call."""
        if len(self._requests) > 2 * KMOCK_HISTORY:
            del self._requests[:-KMOCK_HISTORY]
            for payload in self._payloads:
                del payload._requests[:-KMOCK_HISTORY]

    def _record(self, request: rendering.Request, verb: str) -> None:
        """Note the request as RBAC sees it (verb, group, resource[/subresource], agent)."""
        plural = request.resource.plural
        if request.subresource:
            plural = f"{plural}/{request.subresource}"
        agent = request.headers.get("User-Agent") or ""
        group = request.resource.group or ""
        self.requests.append(Call(verb, group, plural, agent, request.namespace))

    async def _handle(self, request: rendering.Request) -> Any:
        self._forget_old_requests()
        if request.method == enums.method.PUT and request.resource and request.name:
            return await self._serve_put(request)  # kmock serves no PUT
        verb = _verb(request)
        if verb is not None:
            self._record(request, verb)
        if request.resource is None or request.action not in (
            enums.action.CREATE,
            enums.action.UPDATE,
            enums.action.DELETE,
        ):
            return await kmock.KubernetesScaffold._handle(self, request)
        async with self._lock:
            if request.action == enums.action.CREATE:
                await self._create(request)
            elif request.action == enums.action.UPDATE and request.name is not None:
                await self._update(request)
            elif request.action == enums.action.DELETE and request.name is not None:
                await self._delete(request)
        response = await kmock.KubernetesScaffold._handle(self, request)
        if request.action == enums.action.CREATE and response.status == 200:
            response.set_status(201)  # Created, as kube-apiserver answers
        orphan = self._orphans.pop(id(request), None)
        if orphan is not None:
            task = asyncio.get_running_loop().create_task(self._collect(*orphan))
            self._collecting.add(task)
            task.add_done_callback(self._collecting.discard)
        return response

    async def _collect(self, key: tuple, uid: str) -> None:
        """The garbage collector's part for an object whose owners are all gone."""
        async with self._lock:
            if key not in self._objects:
                return
            entry = self._objects[key]
            if not entry.deleted and entry.raw["metadata"].get("uid") == uid:
                await self._remove(key)

    async def _serve_put(self, request: rendering.Request) -> aiohttp.web.Response:
        """An update (PUT): the object as sent replaces the stored one."""
        self._record(request, "update")
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            await self._update(request)
            obj = self._objects[key].raw
        return aiohttp.web.json_response(obj)

    async def _create(self, request: rendering.Request) -> None:
        sent = (request.data or {}).get("metadata") or {}
        if not sent.get("name") and sent.get("generateName"):
            # Named in the request itself, so that kmock's response finds the new object.
            sent["name"] = sent["generateName"] + uuid.uuid4().hex[:5]
        obj = copy.deepcopy(request.data or {})
        meta = obj.setdefault("metadata", {})
        namespace = request.namespace or meta.get("namespace")
        key = (request.resource, namespace, meta.get("name"))
        if key in self._objects and not self._objects[key].deleted:
            raise kmock.KubernetesError(409, "AlreadyExists", f"{meta.get('name')} already exists")
        if not meta.get("name"):
            raise kmock.KubernetesError(422, "Invalid", "metadata.name: Required value")
        if namespace:
            meta["namespace"] = namespace
        if request.resource in self._status_subresource:
            obj.pop("status", None)
        if _is_pvc(request.resource):
            self._default_storage_class(obj)
        self._validate(request.resource, obj)
        meta.update(
            uid=str(uuid.uuid4()),
            creationTimestamp=_now(),
            resourceVersion=self._next_rv(),
            generation=1,
        )
        self._store(key, obj)
        if request.resource.plural == "customresourcedefinitions":
            self.install_crd(obj)
        await self._buses[request.resource].put({"type": "ADDED", "object": obj})
        owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
        live = {o.raw["metadata"].get("uid") for o in self._objects.values() if not o.deleted}
        if owners and not owners & live:
            self._orphans[id(request)] = (key, meta["uid"])

    async def _update(self, request: rendering.Request) -> None:
        key = (request.resource, request.namespace, request.name)
        ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip()
        if key not in self._objects or self._objects[key].deleted:
            if ctype == "application/apply-patch+yaml" and request.subresource is None:
                # Server-side apply creates what is missing, and RBAC then asks for the
                # create verb as well as patch (kube-apiserver's PatchResource).
                self._record(request, "create")
                await self._create(request)
                return
            raise kmock.KubernetesObjectNotFoundError()
        old = copy.deepcopy(self._objects[key].raw)
        _check_precondition(old, request.data)
        if request.method == enums.method.PUT:
            new = _replaced(old, request.data)
        else:
            new = _patched(old, request.data, ctype)
        if request.subresource == "status":
            new = {**old, "status": new.get("status")}
        elif request.resource in self._status_subresource:
            new = {k: v for k, v in new.items() if k != "status"}
            if "status" in old:
                new["status"] = old["status"]
        for field in ("uid", "creationTimestamp", "name", "namespace", "generation"):
            if field in old["metadata"]:
                new.setdefault("metadata", {})[field] = old["metadata"][field]
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return  # a no-op write: no new version, no event
        if _is_pvc(request.resource):
            self._admit_resize(old, new)
        self._validate(request.resource, new)
        if _body(new) != _body(old):
            new["metadata"]["generation"] = int(old["metadata"].get("generation") or 1) + 1
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._store(key, new)
        await self._buses[request.resource].put({"type": "MODIFIED", "object": new})
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            await self._remove(key)

    # -- storage admission ---------------------------------------------------------------

    def _storage_classes(self) -> dict[str, dict[str, Any]]:
        return {
            obj.raw["metadata"]["name"]: obj.raw
            for (res, _, _), obj in self._objects.items()
            if res.plural == "storageclasses" and res.group == "storage.k8s.io" and not obj.deleted
        }

    def _default_storage_class(self, pvc: dict[str, Any]) -> None:
        """DefaultStorageClass admission: a claim that names no class gets the default one."""
        spec = pvc.setdefault("spec", {})
        if spec.get("storageClassName") is not None:
            return
        for name, sc in sorted(self._storage_classes().items()):
            if ((sc["metadata"].get("annotations") or {}).get(DEFAULT_CLASS)) == "true":
                spec["storageClassName"] = name
                return

    def _admit_resize(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        """PersistentVolumeClaimResize admission: growth only where the class allows it."""
        before, after = _pvc_request(old), _pvc_request(new)
        if before is None or after is None or after <= before:
            return
        old_class = (old.get("spec") or {}).get("storageClassName") or ""
        new_class = (new.get("spec") or {}).get("storageClassName") or ""
        sc = self._storage_classes().get(new_class)
        if not new_class or old_class != new_class or not (sc or {}).get("allowVolumeExpansion"):
            name = old["metadata"]["name"]
            raise kmock.KubernetesError(
                403,
                "Forbidden",
                f'persistentvolumeclaims "{name}" is forbidden: {RESIZE_FORBIDDEN}',
            )

    async def _delete(self, request: rendering.Request) -> None:
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        obj = copy.deepcopy(self._objects[key].raw)
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return
        if meta.get("finalizers"):
            meta["deletionTimestamp"] = _now()
            meta["resourceVersion"] = self._next_rv()
            self._store(key, obj)
            await self._buses[request.resource].put({"type": "MODIFIED", "object": obj})
            return
        await self._remove(key)

    async def _remove(self, key: tuple) -> None:
        """Delete for good, then collect the dependents (background cascading deletion)."""
        obj = self._objects[key].raw
        self._objects[key].delete()
        await self._buses[key[0]].put({"type": "DELETED", "object": obj})
        uid = obj["metadata"].get("uid")
        for other_key, other in list(self._objects.items()):
            if other.deleted:
                continue
            owners = (other.raw.get("metadata") or {}).get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in owners):
                await self._remove(other_key)

    def _store(self, key: tuple, obj: dict[str, Any]) -> None:
        if key in self._objects:
            self._objects[key].create(obj)  # appends a version to the object's history
        else:
            self._objects[key] = obj

    # -- reads ---------------------------------------------------------------------------

    def _matching(self, request: rendering.Request) -> list[dict[str, Any]]:
        return [
            obj.raw
            for (res, _, _), obj in self._objects.items()
            if res == request.resource and not obj.deleted and _selected(request, obj.raw)
        ]

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        if request.resource not in self._get_resources():
            raise kmock.KubernetesResourceNotFoundError()
        async with self._lock:
            return {
                "metadata": {"resourceVersion": str(self._rv)},
                "items": self._matching(request),
            }

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""
        try:
            since = int(request.params.get("resourceVersion") or 0)
        except ValueError:
            since = 0
        async with self._lock:
            replay = [
                {"type": "ADDED", "object": obj}
                for obj in self._matching(request)
                if int(obj["metadata"]["resourceVersion"]) > since
            ]
        for event in replay:
            yield event
        async for event in self._buses[request.resource]:
            if _selected(request, event.get("object") or {}):
                yield event


def _check_precondition(old: dict[str, Any], data: Any) -> None:
    """Optimistic concurrency: a write that names a resourceVersion applies only to it."""
    sent = (
        ((data or {}).get("metadata") or {}).get("resourceVersion")
        if isinstance(data, dict)
        else None
    )
    live = old["metadata"].get("resourceVersion")
    if sent and sent != live:
        name = old["metadata"].get("name")
        raise kmock.KubernetesError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
        )


def _replaced(old: dict[str, Any], data: Any) -> dict[str, Any]:
    """An update (PUT): the sent object replaces the stored one, metadata included."""
    new = copy.deepcopy(data or {})
    new.setdefault("metadata", {})
    return new


def _is_pvc(resource: Any) -> bool:
    return resource.plural == "persistentvolumeclaims" and not resource.group


def _patched(old: dict[str, Any], data: Any, content_type: str) -> dict[str, Any]:
    if content_type == "application/json-patch+json" or isinstance(data, list):
        try:
            return jsonpatch.apply_patch(old, data or [], in_place=False)
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise kmock.KubernetesError(422, "Invalid", f"the JSON patch failed: {exc}") from None
    if content_type == "application/apply-patch+yaml":
        # Server-side apply with one field manager: its top-level fields win whole.
        new = {**old, **{k: v for k, v in (data or {}).items() if k != "metadata"}}
        meta = dict(old.get("metadata") or {})
        for key, value in ((data or {}).get("metadata") or {}).items():
            if isinstance(value, dict):
                meta[key] = {**(meta.get(key) or {}), **value}
            else:
                meta[key] = value
        new["metadata"] = meta
        return new
    try:
        return dict(dicts.merge_patch_dict(old, data or {}))
    except ValueError as exc:
        raise kmock.KubernetesError(422, "Invalid", str(exc)) from None


def openapi_as_jsonschema(schema: Any) -> Any:
    """An OpenAPI v3 schema as plain JSON Schema (drop the x-kubernetes-* extensions)."""
    if isinstance(schema, dict):
        out = {
            k: openapi_as_jsonschema(v)
            for k, v in schema.items()
            if not k.startswith("x-kubernetes-")
        }
        if schema.get("x-kubernetes-preserve-unknown-fields") or schema.get(
            "x-kubernetes-int-or-string"
        ):
            out.pop("type", None)
        return out
    if isinstance(schema, list):
        return [openapi_as_jsonschema(v) for v in schema]
    return schema
