"""The experiment's top-level ``sharedStorage`` (NFS or AzureBlob, NNI's fields) as local and remote
services use it: code and trial directories live on the share, so nothing is uploaded per machine.

Layout on the share (NNI's trial layout; code bundles shared by content, as on job platforms)::

    nni/code/<content hash>/                   an extracted code bundle
    nni/<experiment>/trials/<trial>/           the trial directory (parameter.cfg, logs, .nni/)
    nni/<experiment>/trials/<trial>/nnioutput  the trial's NNI_OUTPUT_DIR

``localMountPoint`` is where this machine sees the share, ``remoteMountPoint`` where the training
machines see it (relative: under their ``remoteWorkingDirectory``). ``localMounted``:

* ``usermount``: you mounted it (here and on the machines); trialflow checks that every machine sees
  what this machine wrote, and says where it does not;
* ``nnimount``: trialflow runs NNI's mount command (``mount -t nfs`` / ``blobfuse``, through ``sudo``
  when not root) where the share is not visible yet, here and on each machine; a missing tool or
  a refused mount is an error naming the command and the fix;
* ``nomount``: refused, as NNI refuses it for both storage types.

Lifecycle: :meth:`Share.prepare_local` once per experiment start, :meth:`Share.check_marker` /
:meth:`Share.mount_command` per machine; the AzureBlob key only ever goes into a 0600 file that is
removed after the mount, and blobfuse caches the share's files only in a folder of the user's own.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ..config.platforms import SharedStorageConfig
from .errors import PlatformError
from .mounted_share import MountedShare
from .trialfs import TrialFS

MARKER = ".trialflow-share"
OUTPUT_DIR = "nnioutput"
MOUNT_CONFIG = re.compile(r"\.blobfuse-\d+\.cfg")  # the AzureBlob key written for a mount (removed after it)
CACHE_REFUSED = 97  # the mount command's exit when blobfuse's cache folder is not the user's own


class Share:
    def __init__(self, config: SharedStorageConfig, experiment_id: str) -> None:
        if config.local_mounted == "nomount":
            raise PlatformError(f"sharedStorage.localMounted: nomount is not supported for {config.storage_type} "
                                "(NNI refuses it too): mount the share yourself (usermount) or let trialflow mount "
                                "it (nnimount)")
        self.config = config
        self.experiment_id = experiment_id
        self.local_mount = Path(config.local_mount_point)
        self.storage = MountedShare(self.local_mount, config.remote_mount_point, f"sharedStorage {self.what}")
        self.token = ""

    @property
    def what(self) -> str:
        c = self.config
        if c.storage_type == "NFS":
            return f"NFS {c.nfs_server}:{c.exported_directory}"
        return f"AzureBlob {c.storage_account_name}/{c.container_name}"

    # ---- paths ------------------------------------------------------------------------------

    def local(self, *parts: str) -> Path:
        """``nni/<parts>`` on the share, as this machine sees it."""
        return self.local_mount.joinpath("nni", *parts)

    def remote_mount(self, working_directory: str) -> str:
        point = self.config.remote_mount_point
        return posixpath.normpath(point if point.startswith("/") else posixpath.join(working_directory, point))

    def remote(self, working_directory: str, *parts: str) -> str:
        """``nni/<parts>`` on the share, as a machine with that working directory sees it."""
        return posixpath.join(self.remote_mount(working_directory), "nni", *parts)

    def trial_dir(self, trial_id: str) -> Path:
        return self.local(self.experiment_id, "trials", trial_id)

    def install_code(self, code_dir: Path, experiment_dir: Path) -> str:
        """Extract the code bundle on the share once per content hash (no upload to any machine)."""
        return self.storage.install_code(code_dir, experiment_dir)

    # ---- mounting and checking ----------------------------------------------------------------

    def prepare_local(self) -> None:
        """Make the share usable here (mounting it for nnimount) and write the marker the machines
        look for."""
        if self.config.local_mounted == "nnimount" and not _is_mount(self.local_mount):
            self._mount_here()
        try:
            self.local(self.experiment_id).mkdir(parents=True, exist_ok=True)
            self.token = secrets.token_hex(16)
            (self.local(self.experiment_id) / MARKER).write_text(self.token, encoding="utf-8")
        except OSError as exc:
            raise PlatformError(f"sharedStorage: cannot write under localMountPoint {self.local_mount} "
                                f"({exc.strerror}); mount the {self.what} share there and make it writable") from None

    def marker_path(self, working_directory: str) -> str:
        return self.remote(working_directory, self.experiment_id, MARKER)

    def check_marker(self, seen: str | None, where: str, mount_point: str) -> None:
        """``seen``: the marker's content as the machine read it (None: missing)."""
        if seen is not None and seen.strip() == self.token:
            return
        how = ("mount it there, or set sharedStorage.localMounted: nnimount to let trialflow run the mount"
               if self.config.local_mounted == "usermount" else "the mount trialflow ran did not show it")
        raise PlatformError(f"sharedStorage: {where} does not see the {self.what} share at remoteMountPoint "
                            f"{mount_point} (what this machine wrote under {self.local_mount} is not there); {how}")

    def attach(self, fs: TrialFS, run: Callable[[str], tuple[int, str, str]], working_directory: str) -> None:
        """Check that a training machine sees the share (mounting it there first for nnimount, as NNI
        did); ``fs`` is the machine's filesystem, ``run`` runs a shell command there. Raises
        ``PlatformError`` naming the machine and the fix."""
        marker, mount_point = self.marker_path(working_directory), self.remote_mount(working_directory)

        def read() -> str | None:
            try:
                data = fs.read(marker)
            except OSError:
                return None
            return None if data is None else data.decode(errors="replace")

        seen = read()
        if seen != self.token and self.config.local_mounted == "nnimount":
            self._mount_there(fs, run, working_directory, mount_point)
            seen = read()
        self.check_marker(seen, fs.where, mount_point)

    def _mount_there(self, fs: TrialFS, run: Callable[[str], tuple[int, str, str]], working_directory: str,
                     mount_point: str) -> None:
        tool = self.tool()
        if run(f"command -v {tool} || test -x /sbin/{tool} || test -x /usr/sbin/{tool}")[0] != 0:
            raise PlatformError(f"sharedStorage: localMounted: nnimount needs {tool} on {fs.where}: "
                                f"{self.missing_tool_hint()} there, or mount the share yourself (usermount)")
        command, cfg = self.mount_command(mount_point)
        cfg_path = None
        if cfg is not None:  # the AzureBlob key: a 0600 file, removed right after the mount
            cfg_path = posixpath.join(working_directory, f".blobfuse-{time.time_ns()}.cfg")  # a MOUNT_CONFIG
            fs.write(cfg_path, cfg.encode(), mode=0o600)
            command = f"TRIALFLOW_BLOBFUSE_CFG={shlex.quote(cfg_path)}; export TRIALFLOW_BLOBFUSE_CFG; {command}"
        try:
            status, out, err = run(f"sh -c {shlex.quote(command)}")
        finally:
            if cfg_path is not None:
                fs.remove(cfg_path)
        if status == CACHE_REFUSED:
            raise PlatformError(f"sharedStorage: on {fs.where}: {err.strip()[-300:]}")
        if status != 0:
            raise PlatformError(f"sharedStorage: mounting the {self.what} share at {mount_point} on {fs.where} "
                                f"failed: {(err or out).strip()[-300:]}; mounting needs root or passwordless sudo "
                                "there -- or mount it yourself (usermount)")

    def mount_command(self, mount_point: str) -> tuple[str, str | None]:
        """The shell command NNI ran to mount the share at ``mount_point`` (through ``sudo -n`` unless
        root) and, for AzureBlob, the blobfuse config file's content (read from ``$TRIALFLOW_BLOBFUSE_CFG``)."""
        sudo = '$([ "$(id -u)" = 0 ] || echo sudo -n) '
        q = shlex.quote
        if self.config.storage_type == "NFS":
            source = f"{self.config.nfs_server}:{self.config.exported_directory}"
            return f"mkdir -p {q(mount_point)} && {sudo}mount -t nfs {q(source)} {q(mount_point)}", None
        key = self.config.storage_account_key.get_secret_value() if self.config.storage_account_key else ""
        cfg = (f"accountName {self.config.storage_account_name}\naccountKey {key}\n"
               f"containerName {self.config.container_name}\n")
        return (f"{_private_cache(mount_point)} && mkdir -p {q(mount_point)} && {sudo}blobfuse {q(mount_point)} "
                '--tmp-path="$cache" --config-file="$TRIALFLOW_BLOBFUSE_CFG" -o attr_timeout=240 '
                "-o entry_timeout=240 -o negative_timeout=120 -o allow_other"), cfg

    def tool(self) -> str:
        return "mount.nfs" if self.config.storage_type == "NFS" else "blobfuse"

    def missing_tool_hint(self) -> str:
        return ("install the NFS client (Debian/Ubuntu: apt-get install nfs-common)" if self.config.storage_type ==
                "NFS" else "install blobfuse (https://github.com/Azure/azure-storage-fuse)")

    def _mount_here(self) -> None:
        tool = self.tool()
        if shutil.which(tool) is None and shutil.which(tool, path="/sbin:/usr/sbin") is None:
            raise PlatformError(f"sharedStorage: localMounted: nnimount needs {tool} on this machine: "
                                f"{self.missing_tool_hint()}, or mount the share yourself (usermount)")
        command, cfg = self.mount_command(str(self.local_mount))
        env = dict(os.environ)
        cfg_file = None
        try:
            if cfg is not None:
                fd, cfg_file = tempfile.mkstemp(prefix="trialflow-blobfuse-", suffix=".cfg")
                with os.fdopen(fd, "w") as f:
                    f.write(cfg)
                env["TRIALFLOW_BLOBFUSE_CFG"] = cfg_file
            done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, timeout=120)
        finally:
            if cfg_file is not None:
                os.unlink(cfg_file)
        if done.returncode == CACHE_REFUSED:
            raise PlatformError(f"sharedStorage: {done.stderr.strip()[-300:]}")
        if done.returncode != 0:
            raise PlatformError(f"sharedStorage: mounting the {self.what} share at {self.local_mount} failed "
                                f"(`{command.split(' && ')[-1]}`): {done.stderr.strip()[-300:] or done.returncode}; "
                                "mounting needs root or passwordless sudo -- or mount it yourself (usermount)")


def _private_cache(mount_point: str) -> str:
    """Shell that sets ``$cache`` to blobfuse's file cache for ``mount_point``: a folder of the calling
    user's own, ``${TMPDIR:-/tmp}/trialflow-blobfuse-<uid>/<mount point's hash>``, both levels 0700.
    A level that is a link, not a folder, or another user's (made there first to read the share's
    files as they are cached, or to send them elsewhere) exits :data:`CACHE_REFUSED` with one line on
    stderr naming it; blobfuse is not run then."""
    refuse = ('echo "blobfuse\'s cache folder $d is not a folder of your own (a link, another user\'s, or it '
              f'cannot be made): remove it, or set TMPDIR to a folder of yours" >&2; exit {CACHE_REFUSED}')
    return (f'top="${{TMPDIR:-/tmp}}/trialflow-blobfuse-$(id -u)"; cache="$top/{cache_key(mount_point)}"; '
            'for d in "$top" "$cache"; do mkdir -m 700 "$d" 2>/dev/null; '
            'if [ -L "$d" ] || [ ! -d "$d" ] || [ ! -O "$d" ] || ! chmod 700 "$d" 2>/dev/null; '
            f'then {refuse}; fi; done')


def cache_key(mount_point: str) -> str:
    """The name of ``mount_point``'s folder in the user's blobfuse cache."""
    return hashlib.sha256(mount_point.encode()).hexdigest()[:16]


def _is_mount(path: Path) -> bool:
    try:
        return path.is_mount()
    except OSError:
        return False
