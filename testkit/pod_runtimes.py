"""How the kubelet stand-in runs a pod's server container: as a process of this
checkout, or as a real container of the server image under podman.

``Processes`` is the fast default: ``python -m stream_server`` with the
container's args, its data volume and mounted Secrets translated to local
paths. ``Containers`` runs the image the pod template names (resolved to a
locally built image), with what the pod spec asks for that podman can give:
the data volume and the Secrets mounted at their paths, an ``emptyDir`` as
tmpfs, the pod's user and group, a read-only root file system, no
capabilities, no privilege escalation. The network is the host's (the
stand-in has no pod network): the server listens on the pod's own port on
127.0.0.1, as both runtimes are told through ``DS_HOST`` and ``DS_PORT``.

Either way the kubelet gets back something with the ``subprocess.Popen``
methods it uses (``poll``, ``wait``, ``send_signal``, ``kill``); a container's
signals go through ``podman kill``, since the podman client in front of it
cannot forward SIGKILL or SIGSTOP.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from testkit.containers import Podman
from testkit.pod_objects import translated


class Running(Protocol):
    """What the kubelet stand-in does with a started container (a ``Popen`` is one)."""

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


@dataclass
class ContainerLaunch:
    """A container about to start: its spec as the API holds it, and what the kubelet made
    for it here (its port, its data volume's directory, its Secrets written out)."""

    pod: str
    container: dict[str, Any]
    pod_spec: dict[str, Any]
    env: dict[str, str]  # as the container sees it, DS_HOST and DS_PORT included
    data_dir: Path
    secrets: dict[str, Path]  # mount path -> the directory holding the Secret's files
    log: IO[bytes]


class Runtime(Protocol):
    def start(self, launch: ContainerLaunch) -> Running: ...


# The image's entrypoint, which a container's ``command`` (an init container's) may name.
ENTRYPOINT = "durable-streams-server"


class Processes:
    """The server as a process of this checkout; paths inside the pod become local ones.

    A container with a ``command`` (the restore init container: ``/bin/sh -c SCRIPT``)
    runs that command here, its mount paths (the data volume's, a Secret's) replaced by
    the local directories in every argument, and ``durable-streams-server`` on its
    PATH running this checkout's ``python -m stream_server``, as the image's entrypoint
    would run the installed one."""

    def start(self, launch: ContainerLaunch) -> Running:
        env = {key: translated(value, launch.secrets) for key, value in launch.env.items()}
        env["DS_DATA_DIR"] = str(launch.data_dir)
        argv = [sys.executable, "-m", "stream_server", *launch.container.get("args", [])]
        if launch.container.get("command"):
            argv, env["PATH"] = self._command(launch), self._shim_path(launch)
        return subprocess.Popen(
            argv, stdout=launch.log, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )

    def _command(self, launch: ContainerLaunch) -> list[str]:
        volumes = {v["name"] for v in launch.pod_spec.get("volumes") or []}
        paths = dict(launch.secrets)
        for mount in launch.container.get("volumeMounts") or []:
            if mount["name"] not in volumes:  # a claim template's volume: the PVC
                paths[mount["mountPath"].rstrip("/")] = launch.data_dir
        argv = [*launch.container["command"], *launch.container.get("args", [])]
        if argv[0] == ENTRYPOINT:
            argv[:1] = [sys.executable, "-m", "stream_server"]
        return [translated_text(arg, paths) for arg in argv]

    def _shim_path(self, launch: ContainerLaunch) -> str:
        shims = launch.data_dir.parent / "bin"
        shims.mkdir(exist_ok=True)
        shim = shims / ENTRYPOINT
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m stream_server "$@"\n')
        shim.chmod(0o755)
        return f"{shims}{os.pathsep}{os.environ.get('PATH', '')}"


def translated_text(text: str, paths: Mapping[str, Path]) -> str:
    """``text`` (an argument, a shell script) with each path inside the container that
    starts with a mount path replaced by the local directory (a whole path component:
    ``/data`` in ``/data/x`` or ``ls -A /data``, never in ``/database``)."""
    for inside, local in sorted(paths.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(re.escape(inside) + r"(?![A-Za-z0-9_.\-])", str(local), text)
    return text


@dataclass
class Containers:
    """The image the template names, run by podman. ``images`` maps an image as a template
    names it (``durable-streams-server:0.1.0``) to a local reference; an image not in it
    cannot be pulled here, and the start fails as an ``ErrImagePull`` would."""

    podman: Podman
    images: Mapping[str, str]

    def start(self, launch: ContainerLaunch) -> Running:
        if launch.container.get("command"):
            raise NotImplementedError("an init container's command under podman is not played")
        image = self.images.get(launch.container["image"])
        if image is None:
            raise RuntimeError(f"no local image for {launch.container['image']!r}: {self.images}")
        name = f"ds-kubelet-{launch.pod}-{uuid.uuid4().hex[:6]}"
        argv = self.podman.cmd(
            "run", "--rm", f"--name={name}", "--stop-signal=SIGTERM",
            *self.podman.run_flags(
                env=launch.env,
                volumes=self._volumes(launch),
                read_only=bool(self._security(launch).get("readOnlyRootFilesystem")),
                tmpfs=self._empty_dirs(launch),
                extra=self._identity(launch),
            ),
            image,
            *launch.container.get("args", []),
        )  # fmt: skip
        proc = subprocess.Popen(argv, stdout=launch.log, stderr=subprocess.STDOUT)
        return ContainerProcess(self.podman, name, proc)

    def _security(self, launch: ContainerLaunch) -> dict[str, Any]:
        return dict(launch.container.get("securityContext") or {})

    def _identity(self, launch: ContainerLaunch) -> list[str]:
        pod = launch.pod_spec.get("securityContext") or {}
        flags = []
        if "runAsUser" in pod:
            flags.append(f"--user={pod['runAsUser']}:{pod.get('runAsGroup', pod['runAsUser'])}")
        if "fsGroup" in pod:
            flags.append(f"--group-add={pod['fsGroup']}")
        security = self._security(launch)
        if "ALL" in ((security.get("capabilities") or {}).get("drop") or []):
            flags.append("--cap-drop=ALL")
        if security.get("allowPrivilegeEscalation") is False:
            flags.append("--security-opt=no-new-privileges")
        return flags

    def _volumes(self, launch: ContainerLaunch) -> dict[Path | str, str]:
        """The data volume and the Secrets at their mount paths, owned as the kubelet
        leaves them: the volume by the pod's fsGroup, a Secret's files by root with the
        fsGroup as group and the volume's ``defaultMode``."""
        fs_group = int((launch.pod_spec.get("securityContext") or {}).get("fsGroup", 0))
        volumes = {v["name"]: v for v in launch.pod_spec.get("volumes") or []}
        mounted: dict[Path | str, str] = {}
        for mount in launch.container.get("volumeMounts") or []:
            inside = mount["mountPath"].rstrip("/")
            ro = ":ro" if mount.get("readOnly") else ""
            secret = (volumes.get(mount["name"]) or {}).get("secret")
            if inside in launch.secrets:
                local = launch.secrets[inside]
                mode = int((secret or {}).get("defaultMode", 0o644))
                for path in local.iterdir():
                    if os.geteuid() == 0:
                        os.chown(path, 0, fs_group)
                    else:  # rootless: the files stay ours, mapped to root inside
                        mode |= 0o444
                    path.chmod(mode)
                mounted[local] = inside + ro
            elif mount["name"] not in volumes:  # a claim template's volume: the PVC
                self.podman.own(launch.data_dir, fs_group)
                mounted[launch.data_dir] = inside + ro
        return mounted

    def _empty_dirs(self, launch: ContainerLaunch) -> list[str]:
        empty = {v["name"] for v in launch.pod_spec.get("volumes") or [] if "emptyDir" in v}
        mounts = launch.container.get("volumeMounts") or []
        return [m["mountPath"] for m in mounts if m["name"] in empty]


class ContainerProcess:
    """A container started in the foreground by ``podman run --rm``: it has exited when
    that client has; signals go to the container itself."""

    def __init__(self, podman: Podman, name: str, client: subprocess.Popen[bytes]) -> None:
        self.podman = podman
        self.name = name
        self.client = client

    def poll(self) -> int | None:
        return self.client.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.client.wait(timeout)

    def send_signal(self, sig: int) -> None:
        if self.client.poll() is None:
            self.podman.call("kill", f"--signal={signal.Signals(sig).name}", self.name, check=False)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
