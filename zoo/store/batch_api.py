"""The Git LFS Batch API's answer, as the zoo's HTTP remotes read it (anything else a server sends is its fault, said
in one line by zoo.store.remotes)."""

from __future__ import annotations

from pydantic import BaseModel, Field

LFS_MEDIA_TYPE = "application/vnd.git-lfs+json"


class Action(BaseModel):
    """One transfer action of a Batch API answer (download, upload or verify)."""

    href: str
    header: dict[str, str] = Field(default_factory=dict)


class ObjectError(BaseModel):
    code: int | None = None
    message: str = "object not found"


class BatchObject(BaseModel):
    oid: str
    size: int | None = None
    actions: dict[str, Action] = Field(default_factory=dict)
    error: ObjectError | None = None


class BatchAnswer(BaseModel):
    """What a Git LFS server answers to a batch request; anything else is the server's fault, said in one line."""

    objects: list[BatchObject] = Field(default_factory=list)
