"""A Kubernetes API server for tests: kmock's emulator, made to behave like the real one.

One module over 400 lines, kept whole: the emulator's routing of a request, in the
order kube-apiserver applies its stages; each stage that stands alone is a module of
its own (owner_refs, crd_schema, crd_cel, managed_fields, canonical, pod_proxy...).

kmock keeps objects in memory and serves list, watch, create, patch and
delete over real HTTP, but stamps nothing and validates nothing. The
operator's correctness depends on exactly those details, so ``ApiServer``
adds them, the way kube-apiserver does them:

- ``uid``, ``creationTimestamp``, a global ``resourceVersion`` on every
  write, ``generation`` bumped only when something outside metadata and
  status changes, no-op patches that change nothing (no event, no bump);
- the status subresource: a patch to ``/status`` changes only the status,
  any other patch leaves the status alone;
- merge patch, strategic merge patch on built-in kinds (lists such as a pod's
  conditions merge by their key; 415 on custom resources), JSON patch (a failed
  ``test`` op is 422, as kopf expects) and server-side apply (``testkit.managed_fields``:
  the applied maps merge into the live object, lists replaced whole, a field the
  applier stops sending removed unless another manager owns it; it creates the object
  when it is missing; 422 without ``fieldManager``); an update (PUT) replaces the object;
  a write that names a ``resourceVersion`` other than the stored one is
  refused with 409 Conflict (compare-and-swap, what leader election needs);
- ``metadata.managedFields``: an entry per manager and operation (Apply, or Update named
  by ``fieldManager`` or the User-Agent), ``fieldsV1`` naming its fields (every list one
  field); an apply that is not forced and would change another manager's field is 409
  Conflict with a ``FieldManagerConflict`` cause per field, a forced one takes them over;
- built-in objects stored as kube-apiserver stores them (``testkit.canonical``): every
  quantity canonical (``1024Mi`` read back as ``1Gi``, ``cpu: 2`` as ``"2"``; a malformed
  one is 400), and the defaults the operator's kinds get (StatefulSets, pod templates,
  Pods, Services with an allocated ClusterIP, PVCs; ConfigMaps and PDBs have none);
  an apply is compared with the live object after that, so sending ``1024Mi`` where
  ``1Gi`` is stored writes nothing;
- a mutating admission webhook, when a test sets one (``webhook``,
  ``testkit.mutating_webhook``: a sidecar injector for Pods and StatefulSet templates),
  called on every create and update of a built-in object, its result defaulted again;
- custom resources as their CRD's structural schema has them (``testkit.crd_schema``):
  unknown fields pruned, defaults set (on write, and on read of objects stored under
  an older CRD), OpenAPI and CEL rules checked (422 in kube-apiserver's words); a
  CRD created through the API becomes a served resource, Established (the
  condition ``helm install`` waits for); an updated CRD serves its new schema
  from then on (what ``helm upgrade`` of a CRD template relies on);
- what helm needs besides: ``/version`` saying 1.31 (the chart's ``kubeVersion``),
  core discovery naming its group version ``v1``,
  request bodies in Kubernetes' protobuf encoding for Secrets and ConfigMaps
  (``testkit.kube_protobuf``: helm's release records), and an ``/openapi/v2``
  document (empty: no schema is published for client-side validation);
- lists honour equality label selectors and return the real resourceVersion;
  watches resume from a resourceVersion instead of replaying everything, from a bounded
  window of events (``testkit.watch_cache``, ``watches``): one older than the window is
  answered with a 410 ``Expired`` ERROR event, ``BOOKMARK`` events come when asked for,
  and a test may compact the window or end every watch;
- API Priority and Fairness's refusal, when a test asks for it (``flow.throttle(n)``,
  ``testkit.flow_control``): 429 ``TooManyRequests`` with ``Retry-After: 1``;
- deletion waits for finalizers, then garbage-collects the objects that name
  the deleted one as their owner (background propagation); an object created
  after its owners went (a controller that read its owner just before) is
  collected just after its create is answered, as the garbage collector finds
  owner references to no live object;
- the Eviction API (``POST pods/{name}/eviction``) as kube-apiserver serves it, with
  each PodDisruptionBudget's status computed as the disruption controller would at that
  moment (testkit.disruption: 429 with a ``DisruptionBudget`` cause when no disruption
  is allowed, ``unhealthyPodEvictionPolicy`` honoured); an evicted pod is deleted;
- StorageClasses as admission uses them: a PVC created without a class gets
  the default one, and growing a PVC whose class does not set
  ``allowVolumeExpansion: true`` (or a PVC without a class) is refused with
  403, as the PersistentVolumeClaimResize admission plugin refuses it;
- the pod proxy (``pods/NAME:PORT/proxy/PATH``, ``testkit.pod_proxy``) to where the
  test says each pod listens (``pod_network``), and ``pods/NAME/log`` from what the test
  says each container wrote (``pod_logs``, ``testkit.pod_logs``);
- the OwnerReferencesPermissionEnforcement admission plugin's checks (``testkit.owner_refs``):
  a write that makes an owner reference block its owner's deletion is recorded as also
  asking ``update`` on the owner's ``finalizers``, and an update that changes owner
  references as also asking ``delete`` on the object;
- authentication, when a test asks for it (``tokens``): a request whose bearer token
  is not one of them is refused with 401 before anything else, as kube-apiserver
  refuses an expired service-account token (``unauthorized`` counts them).

Every request is recorded (``ApiServer.requests``: the RBAC verb, group,
resource and object name it needs, and its User-Agent) so that a test can check that the
operator's role grants each one the operator made.

What it still does not do: the other admission plugins (CRD conversion webhooks
among them), validating webhooks, the associative lists of server-side apply (containers
by name: here a list is one field), the defaults of kinds the operator does not write,
and any controller (no pods appear; tests play the controllers).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp.web
import jsonpatch
import jsonpointer
import kmock
from kmock._internal import dicts, enums, rendering

from testkit import (
    canonical,
    crd_cel,
    crd_schema,
    disruption,
    flow_control,
    kube_protobuf,
    managed_fields,
    owner_refs,
    pod_logs,
    pod_proxy,
    watch_cache,
)

ROOT = Path(__file__).resolve().parent.parent
CRD_FILE = ROOT / "charts" / "durable-streams" / "files" / "crds" / "durablestreams.yaml"
BACKUP_CRD_FILE = (
    ROOT / "charts" / "durable-streams" / "files" / "crds" / "durablestreambackups.yaml"
)
# The published openAPIV3Schema of the Spark Operator's CRD (see tests/operator/crds/README.md).
SPARK_CRD_SCHEMA = ROOT / "tests" / "operator" / "crds" / "scheduledsparkapplications.json"
# The published schemas of the Prometheus Operator's PodMonitor and cert-manager's Certificate.
PODMONITOR_CRD_SCHEMA = ROOT / "tests" / "operator" / "crds" / "podmonitors.json"
CERTIFICATE_CRD_SCHEMA = ROOT / "tests" / "operator" / "crds" / "certificates.json"

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
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),
    "CustomResourceDefinition": ("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
    "DurableStream": ("streams.pyds.dev", "v1alpha1", "durablestreams"),
    "DurableStreamBackup": ("streams.pyds.dev", "v1alpha1", "durablestreambackups"),
    "ServiceMonitor": ("monitoring.coreos.com", "v1", "servicemonitors"),
    "PodMonitor": ("monitoring.coreos.com", "v1", "podmonitors"),
    "Certificate": ("cert-manager.io", "v1", "certificates"),
    "Secret": ("", "v1", "secrets"),
    "ScheduledSparkApplication": ("sparkoperator.k8s.io", "v1beta2", "scheduledsparkapplications"),
}
# (group, plural) -> kind, for the built-in kinds stored the way kube-apiserver stores them.
_CORE_GROUPS = ("", "apps", "policy", "coordination.k8s.io", "rbac.authorization.k8s.io")
BUILT_IN = {(g, p): kind for kind, (g, _, p) in KINDS.items() if g in _CORE_GROUPS}
APPLY_PATCH = "application/apply-patch+yaml"


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
    # The object's name, as RBAC's resourceNames match it: a list or watch names one only
    # by ``fieldSelector=metadata.name=NAME`` (None: a collection, or a create).
    name: str | None = None


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
    return None if raw is None else int(crd_cel.parse_quantity(raw))


def _apply_manager(request: rendering.Request) -> str:
    """The applier's field manager: an apply without one is refused, as kube-apiserver does."""
    manager = request.params.get("fieldManager")
    if not manager:
        message = "PatchOptions.meta.k8s.io is invalid: fieldManager: Required value"
        raise kmock.KubernetesError(422, "Invalid", message)
    return str(manager)


def _agent(request: rendering.Request) -> str:
    return str(request.headers.get("User-Agent") or "")


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


# What ``/openapi/v2`` answers: client-go asks for a protobuf openapi_v2.Document
# (``...spec.v2@v1.0+protobuf``, which Go's mime parser refuses as a response type).
OPENAPI_V2_PROTOBUF = "application/octet-stream"

# kube-apiserver's answer to a request whose credentials it does not accept.
UNAUTHORIZED = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Unauthorized",
    "reason": "Unauthorized",
    "code": 401,
}

# How many past requests each kmock reaction keeps (ApiServer._forget_served).
KMOCK_HISTORY = 100


class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with the API server behaviour listed in the module docstring."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._rv = 0
        self._schemas: dict[Any, dict[str, Any]] = {}
        self._status_subresource: set[Any] = set()
        self._custom: set[Any] = set()  # the resources CRDs serve (no strategic merge)
        self.requests: list[Call] = []  # every resource request, in order
        # Where each pod listens, for the pod proxy (testkit.pod_proxy); None: nowhere.
        self.pod_network: pod_proxy.PodNetwork | None = None
        # What each container wrote, for pods/log (testkit.pod_logs); None: nothing.
        self.pod_logs: pod_logs.LogBook | None = None
        # The bearer tokens let in; None: every request, with or without one.
        self.tokens: set[str] | None = None
        self.unauthorized = 0  # requests refused for their token
        # Objects created with only dangling owner references, by request: collected
        # once the create is answered (the real garbage collector is asynchronous too).
        self._orphans: dict[int, tuple[Any, str]] = {}
        self._collecting: set[asyncio.Task[None]] = set()
        # A mutating admission webhook (testkit.mutating_webhook), when a test sets one.
        self.webhook: canonical.Webhook | None = None
        self._cluster_ips = 0
        # The watch cache's window and bookmarks, and API Priority and Fairness's 429s.
        self.watches = watch_cache.WatchCache(lambda: self._rv)
        self._buses = self.watches.buses
        self.flow = flow_control.FlowControl()
        self.resources.load_bundled()
        for res, info in list(self.resources.items()):
            if "status" in info.subresources:
                self._status_subresource.add(res)

    async def _serve_server_version(self, request: rendering.Request) -> rendering.Payload:
        """``/version``: a Kubernetes that runs the CRD's CEL rules (``quantity()``, 1.29),
        which the chart's ``kubeVersion`` asks of ``helm install`` (kmock says 1.26)."""
        return {
            **await super()._serve_server_version(request),
            "major": "1",
            "minor": "31",
            "gitVersion": "v1.31.9",
        }

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Read a protobuf body (Helm's release Secrets) as its JSON form; else 415.
        ``/openapi/v2`` is an empty document: no schema published, which client-side
        validation (helm's, kubectl's) reads as nothing to check; the server-side
        validation of custom resources against their CRD stays. With ``tokens`` set, a
        request without one of them is 401, as an expired or unknown token is."""
        if self.tokens is not None:
            kind, _, token = raw_request.headers.get("Authorization", "").partition(" ")
            if kind.lower() != "bearer" or token.strip() not in self.tokens:
                self.unauthorized += 1
                return aiohttp.web.json_response(UNAUTHORIZED, status=401)
        refused = self.flow.admit(raw_request.headers.get("User-Agent") or "", raw_request.method)
        if refused is not None:
            return refused
        if raw_request.path == "/openapi/v2":
            return aiohttp.web.Response(body=b"", content_type=OPENAPI_V2_PROTOBUF)
        if raw_request.content_type == kube_protobuf.CONTENT_TYPE:
            try:
                obj = kube_protobuf.decode(await raw_request.read())
            except kube_protobuf.Undecodable as exc:
                return aiohttp.web.json_response(
                    {"kind": "Status", "status": "Failure", "code": 415, "message": str(exc)},
                    status=415,
                )
            # kmock reads the body from aiohttp's buffer of it: put the JSON form there.
            raw_request._read_bytes = json.dumps(obj).encode()  # type: ignore[attr-defined]
        return await super().__call__(raw_request)

    # -- resources -----------------------------------------------------------------------

    def install_crd(self, crd: dict[str, Any]) -> None:
        """Serve a CRD's resource (discovery, schema validation, status subresource)."""
        spec = crd["spec"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            res = kmock.resource(spec["group"], version["name"], spec["names"]["plural"])
            subresources = set((version.get("subresources") or {}).keys())
            self._custom.add(res)
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
            self._schemas.pop(res, None)
            if schema:
                self._schemas[res] = schema
                # Stored objects as reads now return them (pruned, defaulted): kube-apiserver
                # does so on every read and leaves etcd as it is; here they are written back,
                # with no new resourceVersion and no event, as no write happened.
                for key, entry in list(self._objects.items()):
                    if key[0] == res and not entry.deleted:
                        self._store(key, crd_schema.on_read(schema, entry.raw))

    def _establish(self, crd: dict[str, Any]) -> None:
        """What kube-apiserver's apiextensions controllers do with a written CRD: serve it
        (its current schema) and report its names accepted and the CRD Established."""
        self.install_crd(crd)
        now = _now()
        crd["status"] = {
            "acceptedNames": crd["spec"]["names"],
            "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
            "conditions": [
                {"type": t, "status": "True", "reason": r, "lastTransitionTime": now}
                for t, r in (
                    ("NamesAccepted", "NoConflicts"),
                    ("Established", "InitialNamesAccepted"),
                )
            ],
        }

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        """Discovery of one group/version. kmock names the core group's ``/v1``; the real
        one says ``v1``, and client-go's REST mapper (helm's) then finds no core kind."""
        payload = await super()._serve_version(request)
        if isinstance(payload, dict):
            payload["groupVersion"] = payload["groupVersion"].lstrip("/")
        return payload

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _validate(
        self, resource: Any, obj: dict[str, Any], old: dict[str, Any] | None = None
    ) -> None:
        """A custom resource's create (``old`` None) or update as its CRD's schema has it:
        ``obj`` pruned and defaulted in place, or 422 (testkit.crd_schema)."""
        schema = self._schemas.get(resource)
        if schema is None:
            return
        try:
            crd_schema.admit(schema, obj, old)
        except crd_schema.Invalid as exc:
            kind, name = self.resources[resource].kind, (obj.get("metadata") or {}).get("name")
            details = {"name": name, "group": resource.group, "kind": kind}
            details["causes"] = exc.causes()  # type: ignore[assignment]
            message = exc.message(f"{kind}.{resource.group}", str(name))
            raise kmock.KubernetesError(422, "Invalid", message, details) from None

    # -- writes --------------------------------------------------------------------------

    def _forget_served(self, request: rendering.Request) -> None:
        """Drop a served request from kmock's own history. kmock keeps every request for
        its assertions and finds which reaction sees the one being served by running each
        reaction's filters over that whole history until it meets the request itself, so
        each request costs time in proportion to the history: kept unbounded, a minutes-long
        replica-set test (Lease renewals, a kubelet, an operator) slowed the emulator until
        renewals missed their deadlines; kept at a hundred, the scan was still 0.1 s of CPU
        a request, half of what an operator end-to-end test spent. So the history holds
        only the requests still being served (open watches among them). ``requests`` (ours)
        keeps every call."""
        for index, kept in enumerate(self._requests):
            if kept is request:
                del self._requests[index]
                break
        for payload in self._payloads:
            if len(payload._requests) > 2 * KMOCK_HISTORY:
                del payload._requests[:-KMOCK_HISTORY]

    def _record(self, request: rendering.Request, verb: str) -> None:
        """Note the request as RBAC sees it (verb, group, resource[/subresource], agent)."""
        plural = request.resource.plural
        if request.subresource:
            plural = f"{plural}/{request.subresource}"
        agent = request.headers.get("User-Agent") or ""
        group = request.resource.group or ""
        name = request.name
        fields = request.params.get("fieldSelector") or ""
        if name is None and fields.startswith("metadata.name=") and "," not in fields:
            name = fields.partition("=")[2]
        self.requests.append(Call(verb, group, plural, agent, request.namespace, name))

    async def _handle(self, request: rendering.Request) -> Any:
        try:
            return await self._route(request)
        finally:
            self._forget_served(request)

    async def _route(self, request: rendering.Request) -> Any:  # noqa: C901 - the API server's routing of one request, as kube-apiserver orders it
        if request.method == enums.method.POST and request.subresource == "eviction":
            return await self._serve_eviction(request)  # kmock knows no such action
        if request.method == enums.method.PUT and request.resource and request.name:
            return await self._serve_put(request)  # kmock serves no PUT
        if pod_proxy.is_pod_proxy(request):
            agent = request.headers.get("User-Agent") or ""
            verb = pod_proxy.verb(request)
            self.requests.append(Call(verb, "", "pods/proxy", agent, request.namespace))
            name = pod_proxy.split_name(request.name or "")[1]
            key = (request.resource, request.namespace, name)
            alive = key in self._objects and not self._objects[key].deleted
            pod = self._objects[key].raw if alive else None
            return await pod_proxy.serve(request, pod, self.pod_network)
        if pod_logs.is_pod_log(request):
            self._record(request, "get")
            key = (request.resource, request.namespace, request.name)
            alive = key in self._objects and not self._objects[key].deleted
            return await pod_logs.serve(
                request, self._objects[key].raw if alive else None, self.pod_logs
            )
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
        self._settle(request.resource, obj)
        self._validate(request.resource, obj)
        self._owner_reference_checks(request, None, obj)
        meta.update(
            uid=str(uuid.uuid4()),
            creationTimestamp=_now(),
            resourceVersion=self._next_rv(),
            generation=1,
            managedFields=self._created_fields(request, obj),
        )
        if _is_crd(request.resource):
            self._establish(obj)
        self._store(key, obj)
        await self._buses[request.resource].put({"type": "ADDED", "object": obj})
        owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
        live = {o.raw["metadata"].get("uid") for o in self._objects.values() if not o.deleted}
        if owners and not owners & live:
            self._orphans[id(request)] = (key, meta["uid"])

    async def _update(self, request: rendering.Request) -> None:  # noqa: C901 - an update's checks in kube-apiserver's order
        key = (request.resource, request.namespace, request.name)
        ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip()
        if key not in self._objects or self._objects[key].deleted:
            if ctype == "application/apply-patch+yaml" and request.subresource is None:
                # Server-side apply creates what is missing, and RBAC then asks for the
                # create verb as well as patch (kube-apiserver's PatchResource).
                self._record(request, "create")
                _apply_manager(request)
                await self._create(request)
                return
            raise kmock.KubernetesObjectNotFoundError()
        if ctype == STRATEGIC_MERGE and request.resource in self._custom:
            # Custom resources have no patch strategies: kube-apiserver refuses it.
            raise kmock.KubernetesError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown "
                "format - accepted media types include: application/json-patch+json, "
                "application/merge-patch+json, application/apply-patch+yaml",
            )
        old = copy.deepcopy(self._objects[key].raw)
        _check_precondition(old, request.data)
        applying = ctype == APPLY_PATCH and request.subresource is None
        if applying:
            new = self._applied(request, old)
        elif request.method == enums.method.PUT:
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
        if not applying:
            # A status write is not admitted by the webhook: it registers for the main
            # resource (``pods``), not its subresources (``pods/status``).
            self._settle(request.resource, new, admit=request.subresource is None)
            manager = managed_fields.manager_of(request.params, _agent(request))
            fields = managed_fields.updated(old, new, manager, _now(), request.subresource)
            new["metadata"]["managedFields"] = fields
        if new == old:
            return  # a no-op write: no new version, no event
        if _is_pvc(request.resource):
            self._admit_resize(old, new)
        self._validate(request.resource, new, old)
        self._owner_reference_checks(request, old, new)
        if _body(new) != _body(old):
            new["metadata"]["generation"] = int(old["metadata"].get("generation") or 1) + 1
            if _is_crd(request.resource):
                self._establish(new)
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._store(key, new)
        await self._buses[request.resource].put({"type": "MODIFIED", "object": new})
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            await self._remove(key)

    # -- what is stored (testkit.canonical, testkit.managed_fields) -------------------------

    def _settle(self, resource: Any, obj: dict[str, Any], admit: bool = True) -> None:
        """A built-in object as kube-apiserver stores it: defaults, canonical quantities,
        and, unless ``admit`` is off, the mutating webhook (custom resources have their
        CRD's pruning and defaults instead, in ``_validate``)."""
        kind = (
            None
            if resource in self._custom
            else BUILT_IN.get((resource.group or "", resource.plural))
        )
        if kind is None:
            return
        try:
            webhook = self.webhook if admit else None
            canonical.settle(kind, obj, webhook, self._next_cluster_ip)
        except canonical.BadQuantity as exc:
            raise kmock.KubernetesError(400, "BadRequest", str(exc)) from None

    def _next_cluster_ip(self) -> str:
        self._cluster_ips += 1
        return f"10.96.{self._cluster_ips // 250}.{self._cluster_ips % 250 + 1}"

    def _created_fields(self, request: rendering.Request, obj: dict[str, Any]) -> list[Any]:
        """The managedFields of a new object: its applier's (what it sent) or its creator's."""
        ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip()
        manager = managed_fields.manager_of(request.params, _agent(request))
        if ctype != APPLY_PATCH:
            return managed_fields.updated(None, obj, manager, _now())
        return managed_fields.applied(
            {}, request.data or {}, manager, force=True, now=_now(), settle=lambda _: None
        )["metadata"]["managedFields"]

    def _applied(self, request: rendering.Request, old: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply (testkit.managed_fields): 409 for another manager's fields
        unless forced, 422 without a field manager, as kube-apiserver answers."""
        try:
            return managed_fields.applied(
                old,
                request.data if isinstance(request.data, dict) else {},
                _apply_manager(request),
                force=request.params.get("force") == "true",
                now=_now(),
                settle=lambda obj: self._settle(request.resource, obj),
            )
        except managed_fields.Conflicts as exc:
            details = {"name": request.name, "kind": request.resource.plural}
            details["causes"] = exc.causes()  # type: ignore[assignment]
            raise kmock.KubernetesError(409, "Conflict", str(exc), details) from None

    def _owner_reference_checks(
        self, request: rendering.Request, old: dict[str, Any] | None, new: dict[str, Any]
    ) -> None:
        """OwnerReferencesPermissionEnforcement (testkit.owner_refs): what it authorizes
        besides the request, recorded as the requests RBAC must allow."""
        if not owner_refs.changed(old, new):
            return
        agent = request.headers.get("User-Agent") or ""
        namespace = new["metadata"].get("namespace")
        if old is not None:
            group, plural = request.resource.group or "", request.resource.plural
            name = new["metadata"].get("name")
            self.requests.append(Call("delete", group, plural, agent, namespace, name))
        for ref in owner_refs.newly_blocking(old, new):
            group, plural = owner_refs.owner_resource(ref, KINDS)
            finalizers = f"{plural}/finalizers"
            self.requests.append(Call("update", group, finalizers, agent, namespace, ref["name"]))

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
        await self._delete_key(key)

    async def _delete_key(self, key: tuple) -> None:
        obj = copy.deepcopy(self._objects[key].raw)
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return
        if meta.get("finalizers"):
            meta["deletionTimestamp"] = _now()
            meta["resourceVersion"] = self._next_rv()
            self._store(key, obj)
            await self._buses[key[0]].put({"type": "MODIFIED", "object": obj})
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

    # -- evictions (testkit.disruption) --------------------------------------------------

    async def _serve_eviction(self, request: rendering.Request) -> aiohttp.web.Response:
        """``POST pods/{name}/eviction`` (policy/v1 Eviction): the pod is deleted if the
        budget that covers it allows, else 429 with a ``DisruptionBudget`` cause."""
        self._record(request, "create")
        data = request.data if isinstance(request.data, dict) else {}
        if (data.get("metadata") or {}).get("name") != request.name:
            message = "name in URL does not match name in Eviction object"
            raise kmock.KubernetesError(400, "BadRequest", message)
        dry = "All" in ((data.get("deleteOptions") or {}).get("dryRun") or [])
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                message = f'pods "{request.name}" not found'
                raise kmock.KubernetesError(404, "NotFound", message)
            pod = self._objects[key].raw
            if not disruption.ignores_budgets(pod):
                budgets = [
                    (k, b)
                    for k, b in self._live("poddisruptionbudgets")
                    if disruption.selects(b, pod)
                ]
                if len(budgets) > 1:
                    raise kmock.KubernetesError(500, "InternalError", disruption.MANY_BUDGETS)
                if budgets:
                    await self._spend_budget(*budgets[0], pod, dry)
            if not dry:
                await self._evict(key)
        status = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success"}
        return aiohttp.web.json_response({**status, "code": 201}, status=201)

    def _live(self, plural: str) -> list[tuple[tuple, dict[str, Any]]]:
        """(key, object) of every stored object of a resource."""
        return [
            (k, o.raw) for k, o in self._objects.items() if k[0].plural == plural and not o.deleted
        ]

    def _scale_of(self, namespace: str) -> Any:
        """How the disruption controller finds a controller's scale: its ``spec.replicas``."""

        def scale(ref: dict[str, Any]) -> int | None:
            plural = {"StatefulSet": "statefulsets", "ReplicaSet": "replicasets"}.get(ref["kind"])
            for _, obj in self._live(plural or ""):
                meta = obj["metadata"]
                if meta.get("namespace") == namespace and meta.get("uid") == ref.get("uid"):
                    return int((obj.get("spec") or {}).get("replicas", 1))
            return None

        return scale

    async def _spend_budget(
        self, key: tuple, pdb: dict[str, Any], pod: dict[str, Any], dry: bool
    ) -> None:
        """The disruption controller's status for ``pdb`` now, then the eviction's check
        and decrement (a refusal raises 429 with the status written)."""
        namespace = pdb["metadata"]["namespace"]
        pods = [p for _, p in self._live("pods") if disruption.selects(pdb, p)]
        status = disruption.budget_status(pdb, pods, self._scale_of(namespace))
        try:
            if disruption.admit(pod, pdb, status) and not dry:
                status["disruptionsAllowed"] -= 1
        except disruption.Refused as refused:
            raise kmock.KubernetesError(
                refused.code, refused.reason, refused.message, refused.details
            ) from None
        finally:
            if not dry:
                await self._write_status(key, status)

    async def _write_status(self, key: tuple, status: dict[str, Any]) -> None:
        obj = self._objects[key].raw
        if obj.get("status") == status:
            return
        new = {**copy.deepcopy(obj), "status": status}
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._store(key, new)
        await self._buses[key[0]].put({"type": "MODIFIED", "object": new})

    async def _evict(self, key: tuple) -> None:
        """Mark the pod as evicted (the DisruptionTarget condition), then delete it."""
        pod = copy.deepcopy(self._objects[key].raw)
        status = pod.setdefault("status", {})
        target = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
            "lastTransitionTime": _now(),
        }
        status["conditions"] = [*(status.get("conditions") or []), target]
        pod["metadata"]["resourceVersion"] = self._next_rv()
        self._store(key, pod)
        await self._buses[key[0]].put({"type": "MODIFIED", "object": pod})
        await self._delete_key(key)

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
        expired = self.watches.too_old(request.resource, request.params.get("resourceVersion"))
        if expired is not None:
            yield expired
            return
        async with self._lock:
            replay = [
                {"type": "ADDED", "object": obj}
                for obj in self._matching(request)
                if int(obj["metadata"]["resourceVersion"]) > since
            ]
            position = await self.watches.mark(request.resource)
        for event in replay:
            yield event
        res = request.resource
        bookmarks = request.params.get("allowWatchBookmarks") == "true"
        kind = self.resources[res].kind if res in self.resources else ""
        async for event in self.watches.follow(position, kind, bookmarks):
            if event["type"] == "BOOKMARK" or _selected(request, event.get("object") or {}):
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


def _is_crd(resource: Any) -> bool:
    return (
        resource.plural == "customresourcedefinitions" and resource.group == "apiextensions.k8s.io"
    )


def _is_pvc(resource: Any) -> bool:
    return resource.plural == "persistentvolumeclaims" and not resource.group


STRATEGIC_MERGE = "application/strategic-merge-patch+json"
# The lists a strategic merge patch merges element by element, by this key (the
# patchMergeKey of the built-in types' fields of that name); every other list is replaced
# whole, as in a merge patch.
MERGE_KEYS = {
    "conditions": "type",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "ownerReferences": "uid",
}


def _strategic(old: Any, patch: Any) -> Any:
    """A strategic merge patch, as kube-apiserver applies one to a built-in object: maps
    merge (null deletes a key), the lists of ``MERGE_KEYS`` merge by their key (an
    element named again is merged, a new one appended, the others kept: a pod condition
    written by one writer leaves the kubelet's alone), other lists are replaced. The
    ``$patch``/``$retainKeys`` directives are not modelled."""
    if not isinstance(old, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(old)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif key in MERGE_KEYS and isinstance(value, list) and isinstance(old.get(key), list):
            field = MERGE_KEYS[key]
            merged = copy.deepcopy(old[key])
            for item in value:
                at = next(
                    (
                        i
                        for i, have in enumerate(merged)
                        if isinstance(have, dict)
                        and isinstance(item, dict)
                        and have.get(field) == item.get(field)
                    ),
                    None,
                )
                if at is None:
                    merged.append(copy.deepcopy(item))
                else:
                    merged[at] = _strategic(merged[at], item)
            out[key] = merged
        else:
            out[key] = _strategic(old.get(key), value)
    return out


def _patched(old: dict[str, Any], data: Any, content_type: str) -> dict[str, Any]:
    if content_type == STRATEGIC_MERGE and isinstance(data, dict):
        return dict(_strategic(old, data))
    if content_type == "application/json-patch+json" or isinstance(data, list):
        try:
            return jsonpatch.apply_patch(old, data or [], in_place=False)
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise kmock.KubernetesError(422, "Invalid", f"the JSON patch failed: {exc}") from None
    try:
        return dict(dicts.merge_patch_dict(old, data or {}))
    except ValueError as exc:
        raise kmock.KubernetesError(422, "Invalid", str(exc)) from None


# Tests validate rendered objects against other CRDs' schemas with it.
openapi_as_jsonschema = crd_schema.openapi_as_jsonschema
