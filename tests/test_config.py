"""``HARVEST_*`` settings: the seed's defaults, precedence, coercion and rejection of bad values."""

from __future__ import annotations

import dataclasses

import pytest

from flask_harvest.config import KEYS, Settings, load_settings
from flask_harvest.errors import ConfigurationError


def test_defaults_are_the_seeds() -> None:
    settings = load_settings({}, {})
    assert settings.webhooks_max_attempts == 5
    assert settings.webhooks_initial_backoff_ms == 1000
    assert settings.webhooks_max_backoff_ms == 3_600_000
    assert settings.webhooks_failure_threshold == 50
    assert settings.webhooks_signature_header == "Autumn-Signature"
    assert settings.jobs_backend == "local"
    assert settings.backoff == (1000, 3_600_000)
    assert settings == Settings()


def test_unrelated_app_config_is_ignored() -> None:
    assert load_settings({"SECRET_KEY": "x", "DEBUG": True, "MAX_ATTEMPTS": 0}, {}) == Settings()


def test_keys_are_all_prefixed_and_cover_every_setting() -> None:
    assert KEYS
    for name, key in KEYS.items():
        assert key.startswith("HARVEST_")
        assert key == "HARVEST_" + name.upper()
    assert set(KEYS) == {field.name for field in dataclasses.fields(Settings)}
    assert KEYS["jobs_backend"] == "HARVEST_JOBS_BACKEND"
    assert KEYS["webhooks_max_attempts"] == "HARVEST_WEBHOOKS_MAX_ATTEMPTS"


def test_app_config_wins_over_keyword_which_wins_over_default() -> None:
    key = KEYS["webhooks_max_attempts"]
    assert load_settings({key: 7}, {"webhooks_max_attempts": 3}).webhooks_max_attempts == 7
    assert load_settings({}, {"webhooks_max_attempts": 3}).webhooks_max_attempts == 3
    assert load_settings({key: 7}, {}).webhooks_max_attempts == 7
    assert load_settings({}, {}).webhooks_max_attempts == 5


def test_precedence_per_key_for_strings() -> None:
    settings = load_settings(
        {"HARVEST_WEBHOOKS_SIGNATURE_HEADER": "X-From-Config", "HARVEST_JOBS_BACKEND": "rq"},
        {"webhooks_signature_header": "X-From-Keyword", "webhooks_queue": "from-keyword"},
    )
    assert settings.webhooks_signature_header == "X-From-Config"
    assert settings.jobs_backend == "rq"
    assert settings.webhooks_queue == "from-keyword"
    assert settings.redis_url == Settings().redis_url


def test_a_bad_keyword_is_not_used_when_app_config_overrides_it() -> None:
    # The app's value wins, so the shadowed keyword is never read.
    settings = load_settings({"HARVEST_WEBHOOKS_MAX_ATTEMPTS": "4"}, {"webhooks_max_attempts": 4})
    assert settings.webhooks_max_attempts == 4


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("webhooks_max_attempts", "7", 7),
        ("webhooks_initial_backoff_ms", " 1500 ", 1500),
        ("webhooks_max_backoff_ms", "60000", 60_000),
        ("webhooks_failure_threshold", "10", 10),
        ("local_workers", "2", 2),
        ("webhooks_timeout_seconds", "2.5", 2.5),
        ("webhooks_timeout_seconds", "3", 3.0),
        ("webhooks_lease_seconds", 90, 90.0),
        ("sweep_interval_seconds", "0.25", 0.25),
    ],
)
def test_string_numbers_are_coerced(name: str, value: object, expected: float) -> None:
    for settings in (load_settings({KEYS[name]: value}, {}), load_settings({}, {name: value})):
        got = getattr(settings, name)
        assert got == expected
        assert type(got) is type(getattr(Settings(), name))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("webhooks_max_attempts", 0),
        ("webhooks_max_attempts", -1),
        ("webhooks_max_attempts", "0"),
        ("webhooks_max_attempts", "five"),
        ("webhooks_max_attempts", "2.5"),
        ("webhooks_max_attempts", ""),
        ("webhooks_max_attempts", None),
        ("webhooks_max_attempts", [5]),
        ("webhooks_initial_backoff_ms", -1000),
        ("webhooks_max_backoff_ms", 0),
        ("webhooks_failure_threshold", "-3"),
        ("local_workers", "many"),
        ("webhooks_timeout_seconds", 0.0),
        ("webhooks_timeout_seconds", "-0.5"),
        ("webhooks_timeout_seconds", "ten"),
        ("webhooks_timeout_seconds", "nan"),
        ("webhooks_deadline_seconds", float("nan")),
        ("webhooks_lease_seconds", "inf"),
        # An integer setting given an infinite float: int() overflows rather than refusing it.
        ("local_workers", float("inf")),
        ("webhooks_max_attempts", float("-inf")),
        ("sweep_interval_seconds", None),
    ],
)
def test_bad_numbers_are_rejected_naming_the_key(name: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=KEYS[name]):
        load_settings({KEYS[name]: value}, {})
    with pytest.raises(ConfigurationError, match=KEYS[name]):
        load_settings({}, {name: value})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("webhooks_signature_header", ""),
        ("webhooks_signature_header", None),
        ("redis_url", 6379),
        ("webhooks_queue", ""),
        ("jobs_backend", ""),
    ],
)
def test_bad_strings_are_rejected_naming_the_key(name: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=KEYS[name]):
        load_settings({KEYS[name]: value}, {})


@pytest.mark.parametrize("backend", ["celery", "RQ", "Local", "redis"])
def test_unknown_backend_is_rejected(backend: str) -> None:
    with pytest.raises(ConfigurationError, match="HARVEST_JOBS_BACKEND") as info:
        load_settings({"HARVEST_JOBS_BACKEND": backend}, {})
    assert "local" in str(info.value)
    assert "rq" in str(info.value)
    with pytest.raises(ConfigurationError, match="HARVEST_JOBS_BACKEND"):
        load_settings({}, {"jobs_backend": backend})


@pytest.mark.parametrize("backend", ["local", "rq"])
def test_known_backends(backend: str) -> None:
    assert load_settings({"HARVEST_JOBS_BACKEND": backend}, {}).jobs_backend == backend


@pytest.mark.parametrize("keyword", ["max_attempts", "HARVEST_WEBHOOKS_MAX_ATTEMPTS", "webhook_max_attempts"])
def test_unknown_keyword_is_rejected_naming_it(keyword: str) -> None:
    with pytest.raises(ConfigurationError, match=keyword) as info:
        load_settings({}, {keyword: 3})
    assert "webhooks_max_attempts" in str(info.value)  # the message lists the known options


def test_initial_backoff_must_not_exceed_the_cap() -> None:
    with pytest.raises(ConfigurationError, match="HARVEST_WEBHOOKS_INITIAL_BACKOFF_MS"):
        load_settings(
            {"HARVEST_WEBHOOKS_INITIAL_BACKOFF_MS": 5000, "HARVEST_WEBHOOKS_MAX_BACKOFF_MS": 4000}, {}
        )
    settings = load_settings(
        {"HARVEST_WEBHOOKS_INITIAL_BACKOFF_MS": 4000, "HARVEST_WEBHOOKS_MAX_BACKOFF_MS": 4000}, {}
    )
    assert settings.backoff == (4000, 4000)


def test_settings_are_frozen() -> None:
    settings = load_settings({}, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.webhooks_max_attempts = 1  # type: ignore[misc]


def test_the_in_flight_floor_must_not_exceed_the_ceiling() -> None:
    key = "HARVEST_WEBHOOKS_MIN_INFLIGHT_PER_SUBSCRIPTION"
    with pytest.raises(ConfigurationError, match=f"{key} must not exceed .*fixed cap"):
        load_settings({key: 33}, {})
    with pytest.raises(ConfigurationError, match=key):
        load_settings({key: 9}, {"webhooks_max_inflight_per_subscription": 8})
    # Equal: a fixed cap, the behaviour before the limit adapted.
    fixed = load_settings({key: 16, "HARVEST_WEBHOOKS_MAX_INFLIGHT_PER_SUBSCRIPTION": "16"}, {})
    assert fixed.webhooks_min_inflight_per_subscription == fixed.webhooks_max_inflight_per_subscription == 16
    assert Settings().webhooks_min_inflight_per_subscription == 1
    assert Settings().webhooks_max_inflight_per_subscription == 32


def test_a_process_has_twice_one_endpoint_s_ceiling_by_default() -> None:
    # One busy endpoint's next deliveries wait in the process for its next free attempt.
    settings = Settings()
    assert settings.worker_concurrency == 2 * settings.webhooks_max_inflight_per_subscription == 64


@pytest.mark.parametrize("value", [0, -1, "0.5", 0.99, "nan", "inf", "fast", None])
def test_the_latency_tolerance_must_be_a_finite_number_of_at_least_one(value: object) -> None:
    with pytest.raises(ConfigurationError, match="HARVEST_WEBHOOKS_LATENCY_TOLERANCE"):
        load_settings({"HARVEST_WEBHOOKS_LATENCY_TOLERANCE": value}, {})
    assert load_settings({"HARVEST_WEBHOOKS_LATENCY_TOLERANCE": "1"}, {}).webhooks_latency_tolerance == 1.0


@pytest.mark.parametrize("key", ["HARVEST_ACTUATOR_PREFIX", "HARVEST_WORKFLOW_API_PREFIX"])
@pytest.mark.parametrize("value", ["0", "api", "/a/<int:x>", "/a b"])
def test_a_url_prefix_that_is_not_a_plain_path_is_refused(key: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match=key):
        load_settings({key: value}, {})


def test_the_schedule_catchup_may_be_zero_but_not_negative() -> None:
    assert load_settings({"HARVEST_WORKFLOW_SCHEDULE_CATCHUP": 0}, {}).workflow_schedule_catchup == 0
    assert load_settings({}, {}).workflow_schedule_catchup == 1
    with pytest.raises(ConfigurationError, match="HARVEST_WORKFLOW_SCHEDULE_CATCHUP"):
        load_settings({"HARVEST_WORKFLOW_SCHEDULE_CATCHUP": -1}, {})
