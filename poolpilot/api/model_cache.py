"""Where the weights come from and where they are kept: the object-store source and the
model cache (spec.model.source.objectStore, spec.model.cache).

Part of the InferencePool API (poolpilot.api); no I/O. The operator renders each cache option
(operator/model_cache.py); docs/operator.md "Model and compile caches" says what each costs.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import Field

from poolpilot.apitypes import (
    ApiModel,
    Matching,
    ObjectName,
    Rule,
    TrimmedString,
)


class CacheType(StrEnum):
    # Each pod fetches the weights into its own emptyDir (the fallback: nothing shared).
    EMPTY_DIR = "EmptyDir"
    # One ReadWriteMany PVC per pool, filled once by a prefetch Job; engines mount it read-only.
    SHARED_VOLUME = "SharedVolume"
    # A hostPath folder on every GPU node the pool may use, filled by a prefetcher DaemonSet.
    NODE_LOCAL = "NodeLocal"
    # vLLM streams the safetensors from the object store straight to the GPU (Run:ai streamer).
    STREAMING = "Streaming"


class CompileCache(StrEnum):
    # On the model cache's volume kind (the shared PVC's sibling, or the node's folder) when
    # the cache is SharedVolume or NodeLocal, so a role's second replica skips compilation.
    SHARED = "Shared"
    # An emptyDir per pod (every replica compiles and captures again).
    PER_POD = "PerPod"


S3_URI = r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[^\s]*)?$"


class ObjectStoreSource(ApiModel):
    """Weights in an S3-compatible bucket (AWS S3, MinIO, R2, GCS through its S3 endpoint):
    the safetensors, config and tokenizer files under one prefix."""

    uri: Annotated[str, Matching(S3_URI, "must be s3://BUCKET/PREFIX, e.g. "
                                 "s3://models/llama-3.1-8b-instruct", max_length=1024)] = Field(
        description="s3://BUCKET/PREFIX of the model's folder.")
    credentials_secret: ObjectName | None = Field(
        default=None,
        description="Secret whose keys become the environment of whatever reads the bucket "
        "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION); unset: "
        "the pod's own identity (IRSA, workload identity).",
    )
    endpoint: TrimmedString | None = Field(
        default=None,
        description="AWS_ENDPOINT_URL for S3-compatible stores, e.g. http://minio.storage:9000 "
        "or https://storage.googleapis.com; unset: AWS S3.",
    )


class SharedVolumeCache(ApiModel):
    """The shared volume: one ReadWriteMany PVC per pool (NAME-model-cache), sized by
    runtime.storage.modelCache, that the prefetch Job writes once and engines on any node mount
    read-only; the compile cache is a second one (NAME-compile-cache). A ReadOnlyMany volume
    someone else filled is spec.model.source.pvc instead."""

    storage_class_name: ObjectName | None = Field(
        default=None,
        description="A StorageClass that provisions ReadWriteMany volumes (NFS, CephFS, EFS, "
        "Filestore, Azure Files); unset: the cluster's default class.",
    )



AbsolutePath = Annotated[str, Matching(
    r"^/([A-Za-z0-9._-]+/?)*$",
    "must be an absolute folder path of letters, digits, '.', '_' and '-', e.g. "
    "/var/lib/poolpilot",
    max_length=512,
)]


# The node's root and the folders its system lives in (a hostPath the prefetcher mounts
# read-write, as root with CHOWN, must not be one of them): RE2 and Python alike.
HOST_SYSTEM_PATHS = (
    r"^/+((proc|sys|dev|etc|boot|bin|sbin|lib|lib32|lib64|libx32|usr|run|root)(/.*)?"
    r"|var/+(run|lib/+kubelet|lib/+containerd|lib/+docker|lib/+dockershim)(/.*)?)?$")


class NodeLocalCache(ApiModel):
    """The node-local cache: a hostPath folder on each node the engines may run on."""

    rules = (
        Rule(
            field="path",
            cel=r"!self.path.matches('(^|/)\.\.(/|$)')",
            message="must not contain '..' (Kubernetes refuses such a hostPath); write the "
            "folder without it, e.g. /var/lib/poolpilot",
            check=lambda s: ".." not in s.path.split("/"),
        ),
        Rule(
            field="path",
            cel=r"!self.path.matches('(^|/)\\.(/|$)') && !self.path.matches('"
            + HOST_SYSTEM_PATHS + "')",
            message="must be a folder of its own below the node's root, not the root or a "
            "system folder (/proc, /sys, /dev, /etc, /boot, /usr, /bin, /sbin, /lib, /run, "
            "/var/run, /var/lib/kubelet, ...) and without '.' parts: the prefetcher mounts "
            "it read-write and creates PATH/models and PATH/compile in it; e.g. "
            "/var/lib/poolpilot",
            check=lambda s: "." not in s.path.split("/")
            and re.match(HOST_SYSTEM_PATHS, s.path) is None,
        ),
    )

    path: AbsolutePath = Field(
        default="/var/lib/poolpilot",
        description="Folder on the node (created by the prefetcher, owned by the engines' "
        "user); weights go to PATH/models, compile caches to PATH/compile. hostPath volumes "
        "need a namespace whose Pod Security level is privileged.",
    )



class ModelCacheSpec(ApiModel):
    """How the weights reach the engines, and where vLLM's compile cache lives."""

    type: CacheType = Field(
        default=CacheType.EMPTY_DIR,
        strict=False,
        description="EmptyDir: each pod fetches the weights (the fallback). SharedVolume: a "
        "ReadWriteMany PVC filled once by a prefetch Job; the engines start once it has "
        "succeeded. NodeLocal: a hostPath folder on each node filled by a prefetcher "
        "DaemonSet; each engine waits for its node's copy. Streaming: vLLM streams the "
        "weights from source.objectStore (load format runai_streamer).",
    )
    shared_volume: SharedVolumeCache = Field(
        default_factory=SharedVolumeCache, description="The SharedVolume cache's PVC.")
    node_local: NodeLocalCache = Field(
        default_factory=NodeLocalCache, description="The NodeLocal cache's folder.")
    compile: CompileCache = Field(
        default=CompileCache.SHARED,
        strict=False,
        description="Shared: vLLM's, torch.compile's and Triton's caches on a volume the "
        "replicas share (SharedVolume: a ReadWriteMany PVC; NodeLocal: the node's folder), so "
        "a second replica skips compilation. PerPod: an emptyDir per pod. EmptyDir and "
        "Streaming caches keep it per pod.",
    )
    # Not Int32: its own le (the int32 maximum) would override this one.
    prefetch_backoff_limit: int = Field(
        default=3, ge=0, le=20, json_schema_extra={"format": "int32"},
        description="Retries of the SharedVolume prefetch Job before ModelCached turns "
        "False with reason PrefetchFailed.",
    )
