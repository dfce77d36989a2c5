"""Model repositories in object stores (s3://, gs://): their URL forms, the fsspec
filesystem that reads each, and a repository's models found from one listing, with no
model file downloaded. The gateway scans with it at start; sidecars poll and load with it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protos import layout

# scheme -> (the extra that installs its filesystem, the module that extra provides)
EXTRAS: dict[str, tuple[str, str]] = {"s3": ("s3", "s3fs"), "gs": ("gcs", "gcsfs")}
# Triton's explicit-endpoint form: s3://[http://|https://]host:port/bucket[/path]
_S3_ENDPOINT = re.compile(r"(https?://|)([0-9a-zA-Z\-.]+):([0-9]+)/([0-9a-z.\-]+)((?:/[0-9a-zA-Z.\-_]+)*)")
_SCHEME = re.compile(r"^([a-z][a-z0-9+.\-]*)://")


class RemoteError(Exception):
    """A remote repository could not be read; the text is Triton's where it has one."""


@dataclass(frozen=True)
class RemoteLocation:
    """A repository URL taken apart: fsspec paths are `bucket/prefix/...`."""

    scheme: str  # "s3" or "gs"
    bucket: str
    prefix: str  # key prefix without leading or trailing slash; "" = the bucket's root
    endpoint: str = ""  # S3 only: the server named in the URL, e.g. "http://minio:9000"

    def path(self, *keys: str) -> str:
        return "/".join(part for part in (self.bucket, self.prefix, *keys) if part)


def is_remote(repository: str) -> bool:
    """Whether a --model-repository value names an object store rather than a folder."""
    return _SCHEME.match(repository) is not None


def parse_location(text: str) -> RemoteLocation:
    """Parse s3://bucket/path, s3://host:port/bucket/path (also with http:// or https://
    after s3://) and gs://bucket/path, with Triton's slash clean-up and texts."""
    match = _SCHEME.match(text)
    scheme = match.group(1) if match else ""
    if scheme not in EXTRAS:
        raise RemoteError(f"{scheme}:// file-system not supported")
    rest = text[match.end() :] if match else text
    protocol = ""
    if scheme == "s3":
        protocol = next((p for p in ("https://", "http://") if rest.startswith(p)), "")
        rest = rest[len(protocol) :]
    parts = [part for part in rest.split("/") if part]
    if not parts:
        raise RemoteError(f"Invalid bucket name: '{rest}'")
    if scheme == "s3":
        endpoint = _S3_ENDPOINT.fullmatch(protocol + "/".join(parts))
        if endpoint is not None:
            scheme_of_endpoint = "https" if endpoint.group(1) == "https://" else "http"
            server = f"{scheme_of_endpoint}://{endpoint.group(2)}:{endpoint.group(3)}"
            return RemoteLocation(scheme, endpoint.group(4), endpoint.group(5).strip("/"), server)
    return RemoteLocation(scheme, parts[0], "/".join(parts[1:]))


def check_extra(location: RemoteLocation) -> None:
    """Raise RemoteError naming the extra to install when the filesystem package is missing."""
    extra, module = EXTRAS[location.scheme]
    try:
        __import__(module)
    except ImportError as exc:
        raise RemoteError(
            f"{location.scheme}:// file-system not supported. To enable, install turnout[{extra}] "
            f"(pip install 'turnout[{extra}]')"
        ) from exc


def open_filesystem(location: RemoteLocation) -> Any:
    """A fresh fsspec filesystem for `location`, with no listings cache (polls must see changes).

    Credentials come the SDKs' usual way: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_SESSION_TOKEN, AWS_PROFILE, AWS_ENDPOINT_URL (botocore) and
    GOOGLE_APPLICATION_CREDENTIALS (google-auth), or the machine's own identity.
    """
    check_extra(location)
    if location.scheme == "gs":
        # gcsfs's plain JSON-API filesystem: its default subclass first probes the bucket's
        # type over gRPC, which lists, reads and downloads do not need.
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(use_listings_cache=False, skip_instance_cache=True)
    import s3fs

    client: dict[str, Any] = {}
    config: dict[str, Any] = {}
    # botocore reads the region from AWS_DEFAULT_REGION only; the other SDKs' AWS_REGION
    # is passed on here, the one variable no SDK beneath us reads.
    region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
    if region:
        client["region_name"] = region
    if location.endpoint:
        client["endpoint_url"] = location.endpoint
        config["s3"] = {"addressing_style": "path"}  # as Triton: servers named by host:port take path-style
    return s3fs.S3FileSystem(
        use_listings_cache=False, skip_instance_cache=True, client_kwargs=client, config_kwargs=config
    )


@dataclass(frozen=True)
class RemoteFile:
    key: str  # relative to the model folder: "1/model.onnx"
    size: int
    mark: str  # ETag, generation or modification time: changes when the object does


@dataclass(frozen=True)
class RemoteModel:
    """A model folder of a remote repository, known from a listing."""

    name: str
    files: tuple[RemoteFile, ...]
    framework: str | None
    config_text: str = ""


class RemoteRepository:
    """One repository in an object store. Lists it whole in one call and reads only the
    config.pbtxt files, each again only when its object changed."""

    def __init__(self, location: RemoteLocation, config_name: str = "") -> None:
        self.location = location
        self.config_name = config_name  # Triton's --model-config-name (layout.config_key)
        self._filesystem: Any = None
        self._configs: dict[str, tuple[tuple[str, str], str]] = {}  # model -> ((key, mark), text)

    @property
    def filesystem(self) -> Any:
        if self._filesystem is None:
            self._filesystem = open_filesystem(self.location)
        return self._filesystem

    def scan(self) -> dict[str, RemoteModel]:
        """Every model folder in the repository, by name (any framework or none)."""
        by_model: dict[str, list[RemoteFile]] = {}
        for key, found in self._list("").items():
            model, _, inside = key.partition("/")
            if inside:  # files at the repository's root are no models
                by_model.setdefault(model, []).append(RemoteFile(inside, found.size, found.mark))
        return {name: self._model(name, files) for name, files in sorted(by_model.items())}

    def model(self, name: str) -> RemoteModel | None:
        """One model folder, listed alone (an explicit load)."""
        inside = name + "/"
        files = [
            RemoteFile(key.removeprefix(inside), f.size, f.mark)
            for key, f in self._list(name).items()
            if key.startswith(inside)
        ]
        return self._model(name, files) if files else None

    def download(self, name: str, keys: Iterable[str], target: Path) -> None:
        """Copy the files `keys` (relative to the model folder `name`) into the local folder `target`."""
        keys = list(keys)
        for key in keys:
            (target / key).parent.mkdir(parents=True, exist_ok=True)
        sources = [self.location.path(name, key) for key in keys]
        try:
            self.filesystem.get(sources, [str(target / key) for key in keys])
        except Exception as exc:  # the SDKs raise many types; the reason is what matters
            raise self._error(exc, self.location.path(name)) from exc

    def _model(self, name: str, files: list[RemoteFile]) -> RemoteModel:
        key = layout.config_key((f.key for f in files), self.config_name)
        config = next((f for f in files if f.key == key), None)
        text = self._config_text(name, config) if config is not None else ""
        versions: dict[str, set[str]] = {}
        for found in files:
            version, _, inside = found.key.partition("/")
            if inside and layout.is_version_dir(version):
                versions.setdefault(version, set()).add(inside.partition("/")[0])
        framework = layout.framework_of_listing(text, versions)
        return RemoteModel(name, tuple(sorted(files, key=lambda f: f.key)), framework, text)

    def _config_text(self, name: str, config: RemoteFile) -> str:
        cached = self._configs.get(name)
        if cached is not None and cached[0] == (config.key, config.mark):
            return cached[1]
        path = self.location.path(name, config.key)
        try:
            data: bytes = self.filesystem.cat_file(path)
        except Exception as exc:  # the SDKs raise many types; the reason is what matters
            raise self._error(exc, path) from exc
        text = data.decode()
        self._configs[name] = ((config.key, config.mark), text)
        return text

    def _list(self, under: str) -> dict[str, RemoteFile]:
        """The objects below `under` (relative to the repository), keyed relative to it."""
        root = self.location.path(under)
        try:
            found: Mapping[str, Mapping[str, Any]] = self.filesystem.find(root, detail=True)
        except Exception as exc:  # the SDKs raise many types; the reason is what matters
            # Listing a prefix that holds nothing is no error: "not found" is the bucket.
            raise RemoteError(
                describe(self.location, exc, root, bucket_missing=isinstance(exc, FileNotFoundError))
            ) from exc
        base = self.location.path()
        listed = {}
        for path, info in found.items():
            key = path.removeprefix(base).lstrip("/")
            parts = key.split("/")
            # Folder markers and keys no local folder can hold ("a//b", "../x") are no files.
            if info.get("type") != "file" or any(part in ("", ".", "..") for part in parts):
                continue
            listed[key] = RemoteFile(key, int(info.get("size") or 0), _mark(info))
        return listed

    def _error(self, exc: Exception, path: str) -> RemoteError:
        return RemoteError(describe(self.location, exc, path))


def _mark(info: Mapping[str, Any]) -> str:
    for field in ("ETag", "etag", "generation", "md5Hash", "LastModified", "updated", "mtime"):
        if info.get(field):
            return str(info[field])
    return ""


def describe(location: RemoteLocation, exc: BaseException, path: str, *, bucket_missing: bool = False) -> str:
    """Triton's text for a failed read of `path`: a missing bucket, refused credentials, or else."""
    name, message = _error_name(exc)
    store = "S3" if location.scheme == "s3" else "GCS"
    if bucket_missing or name == "NoSuchBucket":
        if location.scheme == "s3":
            return (
                f"Could not get MetaData for bucket with name {location.bucket} due to exception: "
                f"NoSuchBucket, error message: {message}"
            )
        # gcsfs says only which URL answered 404
        return f"Could not get MetaData for bucket with name {location.bucket} : bucket not found ({name}: {message})"
    if name in _CREDENTIAL_ERRORS or isinstance(exc, PermissionError):
        if location.scheme == "s3":
            return (
                f"Unable to create S3 filesystem client. Check account credentials. "
                f"Exception: '{name}' Message: '{message}'"
            )
        return f"Unable to create GCS client. Check account credentials. {name}: {message}"
    return f"Failed to read {store} path {location.scheme}://{path} due to exception: {name}, error message: {message}"


_CREDENTIAL_ERRORS = {
    "NoCredentialsError",
    "PartialCredentialsError",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "ExpiredToken",
    "InvalidToken",
    "DefaultCredentialsError",
    "RefreshError",
}


def _error_name(exc: BaseException) -> tuple[str, str]:
    """The service's error code and message where the SDK kept them (s3fs chains botocore's)."""
    cause = exc.__cause__
    response = getattr(cause, "response", None)
    if isinstance(response, Mapping):
        error = response.get("Error", {})
        if error.get("Code"):
            return str(error["Code"]), str(error.get("Message") or exc)
    return type(exc).__name__, str(exc)
