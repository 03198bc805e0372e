"""The manager image, built on this machine: with no registry to pull a base image from, the
base is made from Debian packages.

``python hack/image.py`` (``make image``) builds ``localhost/sdg-manager:dev`` from the
Dockerfile and prints the tag; ``--save PATH`` also writes it as a docker-archive tar, which
containerd imports on a node that pulls nothing (``ctr -n k8s.io images import PATH``).

- :func:`base_image`: ``mmdebstrap --variant=minbase`` of bookworm with Debian's python3.11,
  python3-venv, python3-pip and ca-certificates, imported into podman as
  ``localhost/sdg-base:bookworm``, the Dockerfile's ``PYTHON_IMAGE`` here (its default,
  python:3.11-slim-bookworm, stays for real registries). Once per machine: the tar is cached
  in ``~/.cache/sdg/image/`` under a digest of its inputs, and an image labelled with that
  digest is not made again.
- :func:`build_image`: ``podman build`` of the Dockerfile on that base, in two steps: the
  builder stage (kept as ``...:dev-builder``), then the image, given the builder by its image
  ID twice. Podman 4.3's buildah (1.28) gets ``RUN --mount=type=bind,from=builder`` wrong in
  two ways once layers are cached: it reuses that step's cached venv after the wheels
  changed (it does not key the step on the stage it mounts), and it mounts an empty folder
  when the builder stage came from the cache. So the image build mounts the builder image
  itself (``--build-context builder=container-image://<ID>``) and passes the ID as the
  Dockerfile's ``BUILDER_ID``, on which the step is keyed. docker build needs neither.
- :func:`save_image`: ``podman save --format docker-archive``.

It needs root (rootful podman, mmdebstrap's root mode), podman and mmdebstrap
(``apt-get install -y --no-install-recommends mmdebstrap podman``), and the network: a
Debian mirror for the base (mmdebstrap runs apt) and the package index (PyPI) for the
builder's ``pip wheel`` (the dependencies and the build backend). No container registry.

Two facts of these machines are handled here. Outbound TLS may be re-signed by a machine CA
that a fresh rootfs does not trust: the host's CA bundle is bind-mounted read-only into the
build's RUN steps, and it is not part of the image. Rootful podman asks by default for more
ulimits than such a VM grants (``error setting rlimit type 7``): podman runs with a private
containers.conf that asks for what this process may have (:func:`podman_env`).

Measured on 2 shared cores: the base 70-95 s (once per machine; a 248 MB tar), the image
64 s cold, 2-3 s when nothing changed, 40-47 s after a source change (the builder's pip
fetches every dependency again); the image is 451 MB, saving it takes 5 s.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("hack.image")

ROOT = Path(__file__).resolve().parents[1]
IMAGE_TAG = "localhost/sdg-manager:dev"
BASE_TAG = "localhost/sdg-base:bookworm"
#: The Dockerfile's stage that builds the wheels, and the ARG that keys the final stage's
#: cache on it.
BUILDER_STAGE = "builder"
BUILDER_ARG = "BUILDER_ID"
INSTALL_HINT = "apt-get install -y --no-install-recommends mmdebstrap podman"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
MMDEBSTRAP_ARGS = ("--variant=minbase", "--format=tar", f"--include={','.join(PACKAGES)}", SUITE)
#: What python:3.11-slim's config has and the Dockerfile relies on (ENV PATH=...:$PATH);
#: a rootfs imported as is has no config at all.
BASE_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
)
#: The label of the base image: the digest of the inputs it was made from.
INPUTS_LABEL = "io.deviceshare.sdg-base.inputs"
# The ulimits asked for in containers: podman's defaults, or what this process may have.
_ULIMITS = (("nofile", resource.RLIMIT_NOFILE, 1048576), ("nproc", resource.RLIMIT_NPROC, 32768))


class ImageError(RuntimeError):
    """The image cannot be built here, or a step failed (the message says which and why)."""


def cannot_build(tools: Sequence[str] = ("podman", "mmdebstrap")) -> str | None:
    """Why the image cannot be built on this machine, or ``None`` when it can."""
    reasons = []
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        reasons.append(f"{' and '.join(missing)} {verb} not installed ({INSTALL_HINT})")
    if os.geteuid() != 0:
        reasons.append(
            f"not root (uid {os.geteuid()}): it needs rootful podman and mmdebstrap's root mode"
        )
    if not reasons:
        return None
    return f"the manager image cannot be built here: {'; '.join(reasons)}"


def _require(tools: Sequence[str] = ("podman", "mmdebstrap")) -> None:
    reason = cannot_build(tools)
    if reason:
        raise ImageError(reason)


def cache_dir() -> Path:
    """~/.cache/sdg/image (or under $XDG_CACHE_HOME): beside the tools sdgruntime.envtest
    builds into ~/.cache/sdg."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sdg" / "image"


def _write_if_changed(path: Path, text: str) -> None:
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def podman_env() -> dict[str, str]:
    """The environment for podman: ``CONTAINERS_CONF`` names a private containers.conf whose
    ``default_ulimits`` this process can grant (here nofile 20000, nproc 32768), unless
    ``CONTAINERS_CONF`` is set already."""
    if os.environ.get("CONTAINERS_CONF"):
        return dict(os.environ)
    limits = []
    for name, kind, default in _ULIMITS:
        hard = resource.getrlimit(kind)[1]
        n = default if hard == resource.RLIM_INFINITY else min(hard, default)
        limits.append(f'"{name}={n}:{n}"')
    conf = cache_dir() / "containers.conf"
    _write_if_changed(conf, f"[containers]\ndefault_ulimits = [{', '.join(limits)}]\n")
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _run(cmd: Sequence[str], what: str) -> str:
    """Run ``cmd`` (podman with :func:`podman_env`); its stdout, or ImageError with the end
    of its output."""
    proc = subprocess.run(
        list(cmd),
        env=podman_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-4000:]
        raise ImageError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{output}")
    return proc.stdout


def image_info(ref: str) -> dict[str, Any] | None:
    """``podman image inspect`` of ``ref``, or ``None`` when there is no such image."""
    proc = subprocess.run(
        ["podman", "image", "inspect", ref],
        env=podman_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    found: list[dict[str, Any]] = json.loads(proc.stdout)
    return found[0] if found else None


def _image_id(ref: str) -> str | None:
    image = image_info(ref)
    return str(image["Id"]) if image else None


def _remove_superseded(old: str | None, new: str) -> None:
    """Remove the image a tag pointed to before a build, with the layers only it used; kept
    if anything else still uses or names it (podman refuses then)."""
    if old and old.removeprefix("sha256:") != new.removeprefix("sha256:"):
        subprocess.run(["podman", "rmi", old], env=podman_env(), capture_output=True, check=False)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One maker at a time per machine (parallel test sessions wait for the first)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _base_digest() -> str:
    inputs = {"mmdebstrap": MMDEBSTRAP_ARGS, "changes": BASE_CHANGES}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _has_base(digest: str) -> bool:
    image = image_info(BASE_TAG)
    return bool(image and (image.get("Labels") or {}).get(INPUTS_LABEL) == digest)


def _mmdebstrap(tar: Path) -> None:
    partial = tar.with_name(f".{tar.name}.partial")
    log.info(
        "making the base image with mmdebstrap (%s, minbase, %s) from a Debian mirror: once "
        "per machine, about 1.5 minutes…",
        SUITE,
        ", ".join(PACKAGES),
    )
    started = time.monotonic()
    try:
        _run(["mmdebstrap", *MMDEBSTRAP_ARGS, str(partial)], "mmdebstrap")
        partial.rename(tar)
    finally:
        partial.unlink(missing_ok=True)
    size = tar.stat().st_size / 1e6
    log.info(
        "… base rootfs made in %s (%.0f MB): %s", _elapsed(time.monotonic() - started), size, tar
    )


def base_image() -> str:
    """``localhost/sdg-base:bookworm``, made once per machine (mmdebstrap, then ``podman
    import``) and again only when its inputs change; returns the tag."""
    _require()
    digest = _base_digest()
    if _has_base(digest):
        return BASE_TAG
    folder = cache_dir() / f"base-{SUITE}-{digest[:12]}"
    with _locked(folder):
        if _has_base(digest):  # made by another session while this one waited
            return BASE_TAG
        tar = folder / "base.tar"
        if not tar.is_file():
            _mmdebstrap(tar)
        old = _image_id(BASE_TAG)
        changes = [*BASE_CHANGES, f"LABEL {INPUTS_LABEL}={digest}"]
        flags = [arg for change in changes for arg in ("--change", change)]
        new = _run(["podman", "import", *flags, str(tar), BASE_TAG], "podman import").strip()
        _remove_superseded(old, new)
        log.info("imported %s into podman as %s", tar, BASE_TAG)
    return BASE_TAG


def builder_tag(tag: str) -> str:
    """The tag the builder stage of ``tag`` is kept under: ``...:dev`` -> ``...:dev-builder``."""
    name, sep, version = tag.rpartition(":")
    if not sep or "/" in version:
        return f"{tag}:builder"
    return f"{name}:{version}-builder"


def build_image(tag: str = IMAGE_TAG) -> str:
    """Build the Dockerfile on :func:`base_image` as ``tag`` (and its builder stage as
    :func:`builder_tag`); logs how long it took. Returns the tag."""
    base = base_image()
    builder = builder_tag(tag)
    before = {ref: _image_id(ref) for ref in (builder, tag)}
    build = ["podman", "build", "--file", str(ROOT / "Dockerfile")]
    build += ["--build-arg", f"PYTHON_IMAGE={base}"]
    if HOST_CA_BUNDLE.is_file():
        build += ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
    log.info(
        "building %s on %s: the first build about 1 minute (pip reaches the package index), "
        "later ones reuse what did not change…",
        tag,
        base,
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sdg-image-") as tmp:
        iid = Path(tmp) / "iid"
        stage = ["--target", BUILDER_STAGE, "--tag", builder, "--iidfile", str(iid)]
        _run([*build, *stage, str(ROOT)], "podman build (the builder stage)")
        builder_id = iid.read_text().strip()
        final = [
            *("--build-context", f"{BUILDER_STAGE}=container-image://{builder_id}"),
            *("--build-arg", f"{BUILDER_ARG}={builder_id}"),
            *("--tag", tag, "--iidfile", str(iid)),
        ]
        _run([*build, *final, str(ROOT)], "podman build")
        image_id = iid.read_text().strip()
    for ref, new in ((builder, builder_id), (tag, image_id)):
        _remove_superseded(before[ref], new)
    image = image_info(tag) or {}
    size = int(image.get("Size") or 0) / 1e6
    log.info("built %s in %s (%.0f MB)", tag, _elapsed(time.monotonic() - started), size)
    return tag


def save_image(tag: str, path: str | os.PathLike[str]) -> Path:
    """``tag`` as a docker-archive tar at ``path`` (what ``docker save`` writes and
    ``ctr -n k8s.io images import`` reads); written whole or not at all."""
    _require(("podman",))
    out = Path(path)
    partial = out.with_name(f".{out.name}.partial")
    partial.unlink(missing_ok=True)
    try:
        save = ["podman", "save", "--format", "docker-archive", "--output", str(partial), tag]
        _run(save, "podman save")
        partial.replace(out)
    finally:
        partial.unlink(missing_ok=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build the manager image with podman on a Debian base made by mmdebstrap "
        "(root; no registry needed) and print its tag."
    )
    parser.add_argument("--tag", default=IMAGE_TAG, help=f"the image's tag (default {IMAGE_TAG})")
    parser.add_argument(
        "--save",
        metavar="PATH",
        type=Path,
        help="also write it as a docker-archive tar (for ctr -n k8s.io images import PATH)",
    )
    args = parser.parse_args(argv)
    # What is made and how long it took to stderr, for the person waiting; stdout is the tag.
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        tag = build_image(args.tag)
        if args.save:
            started = time.monotonic()
            saved = save_image(tag, args.save)
            log.info("saved %s to %s in %s", tag, saved, _elapsed(time.monotonic() - started))
    except ImageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
