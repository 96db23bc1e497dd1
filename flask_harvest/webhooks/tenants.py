"""Tenants: whose a subscription, and so each of its deliveries, is. Pure: no Flask, SQL or network.

A tenant is an id the application chooses (its customer or account id), or ``None``: no tenant. A
dispatch reaches only the subscriptions of its tenant (an untenanted dispatch only untenanted
ones), and a read or change scoped to a tenant sees only that tenant's rows: a row of another
tenant is "not found".

A *scope* is what a store or service method is narrowed to: a tenant, ``None`` (the untenanted rows
only) or :data:`ALL_TENANTS` (every row: the operator's view, and the default).
"""

from __future__ import annotations

import enum
import re
from typing import Final, Literal, TypeAlias

from ..errors import InvalidFieldError

__all__ = [
    "ALL_TENANTS",
    "MAX_TENANT_LENGTH",
    "AllTenants",
    "TenantScope",
    "in_scope",
    "validate_scope",
    "validate_tenant",
]

#: The longest tenant id.
MAX_TENANT_LENGTH = 128
# Printable and without spaces: a tenant id travels in query strings, command lines and log lines,
# where a space, a control character or an invisible one would be ambiguous or unreadable.
_TENANT = re.compile(r"[^\s\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]+")


class AllTenants(enum.Enum):
    """The scope of every tenant's rows (its one member, :data:`ALL_TENANTS`)."""

    ALL = "all"

    def __repr__(self) -> str:
        return "ALL_TENANTS"


#: The scope of every row, whatever its tenant: the default of every scoped method.
ALL_TENANTS: Final = AllTenants.ALL

#: What a scoped method is narrowed to: a tenant's rows, the untenanted rows (``None``) or every row.
TenantScope: TypeAlias = str | Literal[AllTenants.ALL] | None


def validate_tenant(value: object, field_name: str = "tenant") -> str | None:
    """Return ``value`` if it is a tenant (``None``: no tenant), else raise.

    A tenant is a string of 1 to :data:`MAX_TENANT_LENGTH` printable characters without spaces
    (letters of any script, digits, punctuation).

    :raises InvalidFieldError: the message says what is wrong, and never shows the value.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidFieldError(field_name, "must be a string or null")
    if not value or len(value) > MAX_TENANT_LENGTH:
        raise InvalidFieldError(field_name, f"must be 1 to {MAX_TENANT_LENGTH} characters")
    if not _TENANT.fullmatch(value) or not value.isprintable():
        raise InvalidFieldError(
            field_name, "must be printable characters without spaces, control or invisible characters"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidFieldError(field_name, "must be valid Unicode text (no lone surrogates)") from None
    return value


def validate_scope(value: object, field_name: str = "tenant") -> TenantScope:
    """Return ``value`` if it is a scope (:data:`ALL_TENANTS`, ``None`` or a valid tenant), else raise
    :class:`InvalidFieldError`."""
    if value is ALL_TENANTS:
        return ALL_TENANTS
    return validate_tenant(value, field_name)


def in_scope(scope: TenantScope, tenant: str | None) -> bool:
    """Whether a row of ``tenant`` is visible in ``scope``."""
    return scope is ALL_TENANTS or tenant == scope
