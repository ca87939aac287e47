"""The storage contract (lakesink.storage_contract) on S3: a moto server on 127.0.0.1."""

from __future__ import annotations

from typing import ClassVar

import pytest
from s3server import BUCKET, S3Server

from lakesink.storage_contract import StorageContract
from lakesink_reader.storage import Storage, open_storage

pytestmark = pytest.mark.s3


class TestS3Storage(StorageContract):
    cannot: ClassVar[dict[str, str]] = {
        # AWS honours it; lakesink's foreach replacement of a truncated file relies on AWS's.
        "conditional_supersede": "moto ignores If-Match on CompleteMultipartUpload: its swap is blind",
    }

    @pytest.fixture
    def storage(self, s3: S3Server) -> Storage:
        return open_storage(f"s3://{BUCKET}/lake", s3.storage_options)
