"""What kube-apiserver stores for a built-in object: canonical quantities and its defaults.

A real API server never stores what it was sent. It decodes the body into Go types, so
every ``resource.Quantity`` comes back in its canonical form (``1024Mi`` as ``1Gi``,
``cpu: 2`` as ``"2"``, ``0.5`` as ``500m``), and its defaulting functions fill in what
was left out (``imagePullPolicy``, ``protocol: TCP``, a Service's ``clusterIP`` ...).
A controller that compares what it rendered with what it reads back literally sees a
difference on every round; ``testkit.kube`` runs ``stored`` on every write of a
built-in kind so that the operator's tests meet the same objects.

Only the defaults of the kinds and fields the operator renders are modelled; each
names where kube-apiserver does it (paths in kubernetes/kubernetes).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Protocol

# -- quantities (k8s.io/apimachinery/pkg/api/resource/quantity.go) ------------------------

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {exp: suffix for suffix, exp in _DECIMAL.items()}
_BINARY_SUFFIX = {bits: suffix for suffix, bits in _BINARY.items()}
# <signedNumber><suffix>, the grammar in quantity.go's doc comment (no spaces anywhere).
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(.*)")
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)")
_NANO = Fraction(1, 10**9)


class BadQuantity(ValueError):
    """Not a quantity: kube-apiserver refuses such a body (400) before anything else."""


def parse(value: str | int | float) -> tuple[Fraction, str]:
    """The exact value and format ("BinarySI", "DecimalSI", "DecimalExponent") of a
    quantity, rounded up (away from zero) to nano precision as ``ParseQuantity`` does."""
    text = str(value)
    found = _QUANTITY.fullmatch(text)
    if found is None:
        raise BadQuantity(f"quantities must match the regular expression: {text!r}")
    number, suffix = found.groups()
    amount = Fraction(number)
    if suffix in _BINARY:
        amount, fmt = amount * 2 ** _BINARY[suffix], "BinarySI"
    elif suffix in _DECIMAL:
        amount, fmt = amount * Fraction(10) ** _DECIMAL[suffix], "DecimalSI"
    elif (exp := _EXPONENT.fullmatch(suffix)) is not None:
        amount, fmt = amount * Fraction(10) ** int(exp.group(1)), "DecimalExponent"
    else:
        raise BadQuantity(f"unable to parse quantity's suffix: {text!r}")
    nanos = abs(amount) / _NANO
    if nanos.denominator != 1:  # more precise than 1n: rounded up, away from zero
        rounded = Fraction(-(-nanos.numerator // nanos.denominator)) * _NANO
        amount = rounded if amount > 0 else -rounded
    return amount, fmt


def _decimal(amount: Fraction) -> tuple[int, int]:
    """(mantissa, exponent): an integer mantissa, the exponent a multiple of 3 and as
    large as it can be without losing a digit (``AsCanonicalBytes``)."""
    exp = -9
    m = int(amount * 10**9)  # exact: ``parse`` rounded to nano precision
    while m != 0 and m % 1000 == 0:
        m //= 1000
        exp += 3
    return m, exp


def canonical(value: str | int | float) -> str:
    """A quantity as kube-apiserver serializes it (``Quantity.String``, ``CanonicalizeBytes``).

    Binary quantities stay binary with the largest suffix that keeps an integer
    (``1024Mi`` -> ``1Gi``, ``1.5Gi`` -> ``1536Mi``) unless the value is below 1024 or
    not an integer, which are written as decimal SI (``0.5Ki`` -> ``512``); decimal ones
    get an integer mantissa and the largest SI suffix (``1.5`` -> ``1500m``, ``1000M`` ->
    ``1G``); an exponent stays an exponent, a multiple of 3 (``1e3`` -> ``1e3``,
    ``1.2e4`` -> ``12e3``).
    """
    amount, fmt = parse(value)
    if amount == 0:
        return "0"
    sign = "-" if amount < 0 else ""
    amount = abs(amount)
    if fmt == "BinarySI" and (amount < 1024 or amount.denominator != 1):
        fmt = "DecimalSI"
    if fmt == "BinarySI":
        m, bits = int(amount), 0
        while m % 1024 == 0 and bits < 60:
            m //= 1024
            bits += 10
        return f"{sign}{m}{_BINARY_SUFFIX.get(bits, '')}"
    m, exp = _decimal(amount)
    if fmt == "DecimalSI" and exp in _DECIMAL_SUFFIX:
        return f"{sign}{m}{_DECIMAL_SUFFIX[exp]}"
    return f"{sign}{m}" + (f"e{exp}" if exp else "")


# Where the built-in kinds the operator writes hold quantities: maps of them under these
# keys (a container's requests/limits, a claim's requests and capacity, a pod's overhead),
# and an emptyDir's sizeLimit.
_QUANTITY_MAPS = frozenset({"requests", "limits", "capacity", "allocatable", "overhead"})


def quantities(obj: Any) -> None:
    """Every quantity of a built-in object in its canonical form, in place."""
    if isinstance(obj, list):
        for item in obj:
            quantities(item)
    if not isinstance(obj, dict):
        return
    for key, value in obj.items():
        if key in _QUANTITY_MAPS and isinstance(value, dict):
            for name, amount in value.items():
                if isinstance(amount, (str, int, float)) and not isinstance(amount, bool):
                    value[name] = canonical(amount)
        elif key == "sizeLimit" and isinstance(value, (str, int, float)):
            obj[key] = canonical(value)
        else:
            quantities(value)


# -- defaults ------------------------------------------------------------------------------

# SetDefaults_Secret/ConfigMap/Projected/DownwardAPIVolumeSource (pkg/apis/core/v1/defaults.go):
# 0644 when the volume sets no mode.
DEFAULT_MODE = 0o644
TERMINATION_MESSAGE_PATH = "/dev/termination-log"


def _probe(probe: Any) -> None:
    """SetDefaults_Probe and SetDefaults_HTTPGetAction (pkg/apis/core/v1/defaults.go)."""
    if not isinstance(probe, dict):
        return
    for key, value in (
        ("timeoutSeconds", 1),
        ("periodSeconds", 10),
        ("successThreshold", 1),
        ("failureThreshold", 3),
    ):
        probe.setdefault(key, value)
    if isinstance(http := probe.get("httpGet"), dict):
        http.setdefault("path", "/")
        http.setdefault("scheme", "HTTP")


def _image_pull_policy(image: str) -> str:
    """SetDefaults_Container: Always for ``:latest`` or no tag, else IfNotPresent."""
    if "@" in image:
        return "IfNotPresent"
    tail = image.rsplit("/", 1)[-1]
    tag = tail.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _field_refs(items: Any) -> None:
    """SetDefaults_ObjectFieldSelector: a fieldRef without apiVersion means ``v1``."""
    for item in items or []:
        ref = ((item.get("valueFrom") or {}) if "valueFrom" in item else item).get("fieldRef")
        if isinstance(ref, dict):
            ref.setdefault("apiVersion", "v1")


def _container(container: dict[str, Any]) -> None:
    container.setdefault("terminationMessagePath", TERMINATION_MESSAGE_PATH)
    container.setdefault("terminationMessagePolicy", "File")
    if "image" in container:
        container.setdefault("imagePullPolicy", _image_pull_policy(str(container["image"])))
    for port in container.get("ports") or []:
        port.setdefault("protocol", "TCP")  # SetDefaults_ContainerPort
    for key in ("readinessProbe", "livenessProbe", "startupProbe"):
        _probe(container.get(key))
    _field_refs(container.get("env"))


def _volume(volume: dict[str, Any]) -> None:
    for source in ("secret", "configMap", "downwardAPI", "projected"):
        if isinstance(found := volume.get(source), dict):
            found.setdefault("defaultMode", DEFAULT_MODE)
    for projection in (volume.get("projected") or {}).get("sources") or []:
        _field_refs((projection.get("downwardAPI") or {}).get("items"))
    _field_refs((volume.get("downwardAPI") or {}).get("items"))


def pod_spec(spec: dict[str, Any]) -> None:
    """SetDefaults_PodSpec, _Container, _Volume... (pkg/apis/core/v1/defaults.go)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            _container(container)
    for volume in spec.get("volumes") or []:
        _volume(volume)


def _claim(claim: dict[str, Any]) -> None:
    """SetDefaults_PersistentVolumeClaimSpec: a claim's volume is a file system."""
    claim.setdefault("spec", {}).setdefault("volumeMode", "Filesystem")


def statefulset(obj: dict[str, Any]) -> None:
    """SetDefaults_StatefulSet (pkg/apis/apps/v1/defaults.go), then the pod template's."""
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("podManagementPolicy", "OrderedReady")
    spec.setdefault("revisionHistoryLimit", 10)
    strategy = spec.setdefault("updateStrategy", {})
    strategy.setdefault("type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        strategy.setdefault("rollingUpdate", {}).setdefault("partition", 0)
    retention = spec.setdefault("persistentVolumeClaimRetentionPolicy", {})
    retention.setdefault("whenDeleted", "Retain")
    retention.setdefault("whenScaled", "Retain")
    pod_spec(spec.setdefault("template", {}).setdefault("spec", {}))
    for claim in spec.get("volumeClaimTemplates") or []:
        claim.setdefault("apiVersion", "v1")
        claim.setdefault("kind", "PersistentVolumeClaim")
        _claim(claim)
        claim.setdefault("status", {}).setdefault("phase", "Pending")


def pod(obj: dict[str, Any]) -> None:
    """SetDefaults_Pod: a container's limits stand for its missing requests; then the spec's."""
    spec = obj.setdefault("spec", {})
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        for name, limit in (resources.get("limits") or {}).items():
            resources.setdefault("requests", {}).setdefault(name, limit)
    pod_spec(spec)


def service(obj: dict[str, Any], cluster_ip: str) -> None:
    """SetDefaults_Service (pkg/apis/core/v1/defaults.go) and what the Service REST
    storage allocates (pkg/registry/core/service/storage: one IPv4 ClusterIP, single-stack).
    ``cluster_ip`` is the address to allocate if the Service has none yet."""
    spec = obj.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec["sessionAffinity"] == "ClientIP":
        config = spec.setdefault("sessionAffinityConfig", {}).setdefault("clientIP", {})
        config.setdefault("timeoutSeconds", 10800)
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))
    if spec["type"] in ("ClusterIP", "NodePort", "LoadBalancer"):
        spec.setdefault("internalTrafficPolicy", "Cluster")
        if cluster_ip:
            spec.setdefault("clusterIP", cluster_ip)
        if spec.get("clusterIP"):
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")


def claim(obj: dict[str, Any]) -> None:
    """SetDefaults_PersistentVolumeClaim(Spec): file system mode, Pending until bound."""
    _claim(obj)
    obj.setdefault("status", {}).setdefault("phase", "Pending")


# kind -> its defaulting; ConfigMaps and PodDisruptionBudgets (policy/v1) have none.
STORED = {"StatefulSet": statefulset, "Pod": pod, "PersistentVolumeClaim": claim}


def stored(kind: str, obj: dict[str, Any], cluster_ip: str = "") -> None:
    """Default and canonicalise ``obj`` (a ``kind``) in place, as kube-apiserver stores it."""
    if kind == "Service":
        service(obj, cluster_ip)
    elif kind in STORED:
        STORED[kind](obj)
        quantities(obj)  # the kinds that hold quantities


class Webhook(Protocol):
    """A mutating admission webhook (``testkit.mutating_webhook``)."""

    def mutate(self, kind: str, obj: dict[str, Any]) -> None: ...


def settle(
    kind: str, obj: dict[str, Any], webhook: Webhook | None, cluster_ip: Callable[[], str]
) -> None:
    """What happens to a built-in object between the request and storage, in
    kube-apiserver's order: decoded (quantities canonical) and defaulted, then the
    mutating webhooks, whose answer is decoded and defaulted again. ``cluster_ip``
    allocates an address for a Service that has none. A malformed quantity is the 400
    kube-apiserver answers for a body it cannot decode (``BadQuantity``)."""
    needs_ip = kind == "Service" and not (obj.get("spec") or {}).get("clusterIP")
    ip = cluster_ip() if needs_ip else ""
    stored(kind, obj, ip)
    if webhook is not None:
        webhook.mutate(kind, obj)
        stored(kind, obj, ip)
