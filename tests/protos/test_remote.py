"""Remote repository URLs and the filesystem each selects. Reading them is tested against
real servers in the sidecar and end-to-end tests (moto's S3 server, a GCS emulator)."""

from __future__ import annotations

import pytest

from protos.remote import RemoteError, RemoteLocation, is_remote, open_filesystem, parse_location


@pytest.mark.parametrize(
    ("text", "bucket", "prefix", "endpoint"),
    [
        ("s3://bucket", "bucket", "", ""),
        ("s3://bucket/", "bucket", "", ""),
        ("s3://bucket/path/to/repo", "bucket", "path/to/repo", ""),
        ("s3://bucket//path///to/repo/", "bucket", "path/to/repo", ""),  # Triton cleans extra slashes
        ("s3://127.0.0.1:9000/bucket/repo", "bucket", "repo", "http://127.0.0.1:9000"),
        ("s3://minio.local:9000/bucket", "bucket", "", "http://minio.local:9000"),
        ("s3://http://minio.local:9000/bucket/a/b", "bucket", "a/b", "http://minio.local:9000"),
        ("s3://https://minio.local:443/bucket/a", "bucket", "a", "https://minio.local:443"),
        # Triton's endpoint form wants a lower-case bucket; otherwise the first part is the bucket.
        ("s3://host:9000/Bucket/a", "host:9000", "Bucket/a", ""),
        ("gs://bucket", "bucket", "", ""),
        ("gs://bucket/path//to/repo/", "bucket", "path/to/repo", ""),
    ],
)
def test_parse_location(text: str, bucket: str, prefix: str, endpoint: str) -> None:
    location = parse_location(text)
    assert (location.bucket, location.prefix, location.endpoint) == (bucket, prefix, endpoint)
    assert location.scheme == text[:2]


def test_fsspec_paths() -> None:
    location = parse_location("s3://127.0.0.1:9000/bucket/repo")
    assert location.path() == "bucket/repo"
    assert location.path("simple", "1/model.onnx") == "bucket/repo/simple/1/model.onnx"
    assert RemoteLocation("gs", "b", "").path("m", "config.pbtxt") == "b/m/config.pbtxt"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("s3://", "Invalid bucket name: ''"),
        ("gs:///", "Invalid bucket name: '/'"),
        ("as://account/container", "as:// file-system not supported"),
    ],
)
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(RemoteError) as caught:
        parse_location(text)
    assert str(caught.value) == message


def test_is_remote() -> None:
    assert is_remote("s3://bucket") and is_remote("gs://bucket") and is_remote("as://x")
    assert not is_remote("/models") and not is_remote("model_repository") and not is_remote("s3:bucket")


def test_filesystem_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    import gcsfs.core
    import s3fs

    # No machine identity is looked for: google-auth skips the metadata server, and the
    # credentials file is one that does not exist, so gcsfs falls back to anonymous access.
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/credentials.json")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert isinstance(open_filesystem(parse_location("gs://bucket/repo")), gcsfs.core.GCSFileSystem)

    plain = open_filesystem(parse_location("s3://bucket/repo"))
    assert isinstance(plain, s3fs.S3FileSystem)
    assert plain.client_kwargs == {"region_name": "eu-west-1"}
    named = open_filesystem(parse_location("s3://https://minio.local:9000/bucket"))
    assert named.client_kwargs == {"region_name": "eu-west-1", "endpoint_url": "https://minio.local:9000"}
    assert named.config_kwargs == {"s3": {"addressing_style": "path"}}

    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    assert open_filesystem(parse_location("s3://bucket")).client_kwargs == {"region_name": "ap-south-1"}
