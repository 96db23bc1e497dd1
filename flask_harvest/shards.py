"""Where a workflow run lives when ``HARVEST_WORKFLOW_SHARDS`` lists several databases.

Pure rules, the same in every process and in any language:

- a ``workflow_id`` routes to shard ``int.from_bytes(sha256(utf8(workflow_id))[:8], "big") % n``
  (:func:`shard_for_key`);
- an execution id made on a shard is ``s<shard>-`` and a UUID's hex digits
  (``s2-5f0c0e...``); an id without that
  prefix (every id of an unsharded deployment) is on shard 0, the default shard (:func:`shard_of_id`).

A run that another run creates in its own transaction (a continue-as-new successor, a child run,
a fork) lives on that run's shard, whatever its ``workflow_id`` hashes to: the two rows must change
together.
"""

from __future__ import annotations

import hashlib
import re
import uuid

__all__ = ["MAX_SHARDS", "encode_id", "new_id", "new_id_beside", "shard_for_key", "shard_of_id"]

#: The most shards a deployment may list: ``s63-`` and a UUID's 32 hex digits fill the 36
#: characters an execution id has had room for since the first release.
MAX_SHARDS = 64

_PREFIX = re.compile(r"s(0|[1-9][0-9]?)-")


def shard_for_key(key: str, count: int) -> int:
    """The shard a ``workflow_id`` routes to among ``count`` shards (0 when there is one)."""
    if count <= 1:
        return 0
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % count


def encode_id(shard: int | None, raw: str) -> str:
    """``raw`` marked as made on ``shard``; unchanged when the deployment is not sharded (``None``)."""
    return raw if shard is None else f"s{shard}-{uuid.UUID(raw).hex}"


def new_id(shard: int | None) -> str:
    """A fresh execution (or callback delivery) id made on ``shard`` (see :func:`encode_id`)."""
    return encode_id(shard, str(uuid.uuid4()))


def new_id_beside(execution_id: str) -> str:
    """A fresh id on the same shard as ``execution_id`` (a plain UUID beside an unmarked id)."""
    match = _PREFIX.match(execution_id)
    return new_id(int(match.group(1)) if match is not None else None)


def shard_of_id(identifier: str, count: int) -> int | None:
    """The shard an id was made on, 0 for an id with no shard prefix, or ``None`` when its prefix
    names a shard that does not exist among ``count`` (no row can have that id)."""
    match = _PREFIX.match(identifier)
    if match is None:
        return 0
    shard = int(match.group(1))
    return shard if shard < max(count, 1) else None
