"""The string formats Kubernetes checks, each checked here by one function.

Quantities, durations, counts-or-percents, DNS-1123 names and container image references: a
value the API server or the kubelet would refuse later (when the rendered DaemonSet is applied,
or when its pod is created) is refused when the document is read, with the fix in the message.
Each check raises ``ValueError`` with a message a user can act on, so the models use it as a
pydantic validator and the commands for their own arguments alike.
"""

from __future__ import annotations

import re
from decimal import Decimal

from kubernetes.utils import parse_quantity

# -- quantities (resource.Quantity): Kubernetes' grammar, signed, and the non-negative variant
# the CRD publishes for resource requests and limits
_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
_SUFFIX = rf"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_NUMBER}))"
QUANTITY = rf"^(\+|-)?{_NUMBER}{_SUFFIX}?$"
NON_NEGATIVE_QUANTITY = rf"^\+?{_NUMBER}{_SUFFIX}?$"


def quantity(value: int | str) -> Decimal:
    """The amount a Kubernetes quantity (``500m``, ``2``, ``4Gi``, ``1e3``) stands for.

    The grammar is checked first: ``parse_quantity`` alone takes spaces, ``NaN`` and ``1K``,
    which the API server refuses.
    """
    if isinstance(value, bool) or (isinstance(value, str) and not re.fullmatch(QUANTITY, value)):
        raise ValueError(
            "must be a Kubernetes quantity such as 500m, 2 or 4Gi (suffixes are case-sensitive: "
            "Ki, Mi, Gi, Ti for powers of 1024; k, M, G, T for powers of 1000; m for 1/1000)"
        )
    amount: Decimal = parse_quantity(value)  # type: ignore[no-untyped-call]
    return amount


def resource_quantity(value: int | str) -> Decimal:
    """A quantity of a resource request or limit: never negative, as the API server says."""
    amount = quantity(value)
    if amount < 0:
        raise ValueError("must not be negative (write the amount without a leading '-')")
    return amount


# -- durations: hours, minutes and seconds as Go writes them ("90s", "5m", "1h30m")
DURATION = r"^([0-9]+h)?([0-9]+m)?([0-9]+s)?$"
_DURATION_PARTS = re.compile(r"([0-9]+)([hms])")
_UNIT_S = {"h": 3600, "m": 60, "s": 1}


def duration_seconds(value: str) -> float:
    """Seconds in a duration such as ``30s``, ``5m`` or ``1h30m``."""
    if not value or not re.fullmatch(DURATION, value):
        raise ValueError('must be a duration such as "30s", "5m" or "1h30m"')
    return float(sum(int(n) * _UNIT_S[unit] for n, unit in _DURATION_PARTS.findall(value)))


# -- a count or a percent (intstr.IntOrString as maxUnavailable takes it)
INT_OR_PERCENT = r"^([0-9]+|(100|[1-9]?[0-9])%)$"


def int_or_percent(value: int | str) -> int | str:
    """``value`` when it is a non-negative count (``1``, ``"1"``) or a percent up to 100%."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
    elif not re.fullmatch(INT_OR_PERCENT, value):
        raise ValueError('must be a count such as 1 or a percent from 0% to 100% such as "25%"')
    return value


# -- DNS-1123 names: labels (namespaces, Service names) and subdomains (most object names)
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL_MAX, DNS_SUBDOMAIN_MAX = 63, 253


def dns_name(value: str, *, label: bool = False, max_length: int | None = None) -> str:
    """``value`` when it is a DNS-1123 subdomain (a label with ``label``) of at most
    ``max_length`` characters; the message suggests a name that is one.

    Kubernetes names most objects with subdomains and namespaces with labels; a name the
    operator puts into a label value, or into a name of its own, must also be short enough.
    """
    limit = max_length or (DNS_LABEL_MAX if label else DNS_SUBDOMAIN_MAX)
    grammar = _DNS_LABEL if label else rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"
    if re.fullmatch(grammar, value) and len(value) <= limit:
        return value
    kind = "DNS-1123 label" if label else "DNS-1123 subdomain"
    allowed = "lowercase letters, digits and '-'" + ("" if label else " or '.'")
    suggestion = re.sub(r"[^a-z0-9.-]+" if not label else r"[^a-z0-9-]+", "-", value.lower())
    suggestion = suggestion.strip(".-")[:limit].rstrip(".-")
    hint = f", such as {suggestion!r}" if suggestion and suggestion != value else ""
    raise ValueError(
        f"must be a {kind}: at most {limit} {allowed}, starting and ending with a letter "
        f"or digit{hint}"
    )


# -- container image references (the distribution/reference grammar the kubelet parses):
# [registry[:port]/]path[:tag][@digest], path parts lowercase
_ALNUM = r"[a-z0-9]+"
_PATH_PART = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_HOST_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_REGISTRY = rf"(?:{_HOST_PART}(?:\.{_HOST_PART})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_REGISTRY}/)?{_PATH_PART}(?:/{_PATH_PART})*"
IMAGE_TAG = r"[\w][\w.-]{0,127}"
IMAGE_DIGEST = r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}"
IMAGE_REFERENCE = rf"{_NAME}(?::{IMAGE_TAG})?(?:@{IMAGE_DIGEST})?"
_REPOSITORY = rf"(?:{_REGISTRY}|{_NAME})/?"


def image_repository(value: str) -> str:
    """A registry and path (``nvcr.io/nvidia``, ``registry.local:5000/mirror``); ``""``: unset."""
    if value and not re.fullmatch(_REPOSITORY, value):
        raise ValueError(
            "must be a registry and path such as nvcr.io/nvidia: a host[:port], then lowercase "
            "parts of letters, digits, '.', '_' or '-' separated by '/' (no spaces or quotes)"
        )
    return value


def image_name(value: str) -> str:
    """An image name (``driver``) or a whole reference (``nvcr.io/nvidia/driver:580``)."""
    if value and not re.fullmatch(IMAGE_REFERENCE, value):
        raise ValueError(
            "must be an image name such as driver, or a whole reference such as "
            "nvcr.io/nvidia/driver:580.95.05 (lowercase path, then :tag and/or @sha256:digest)"
        )
    return value


def image_version(value: str) -> str:
    """A tag (``580.95.05``, ``v0.8.1``) or a digest (``sha256:<64 hex digits>``)."""
    if value and not re.fullmatch(rf"{IMAGE_TAG}|{IMAGE_DIGEST}", value):
        raise ValueError(
            "must be a tag such as 580.95.05 (at most 128 letters, digits, '_', '.' or '-', not "
            "starting with '.' or '-') or a digest such as sha256:<64 hex digits>"
        )
    return value
