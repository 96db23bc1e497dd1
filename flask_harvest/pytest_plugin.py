"""pytest fixtures for apps that send webhooks; pytest loads this plugin when flask-harvest is installed.

``harvest_receiver``
    A started :class:`~flask_harvest.testing.CapturingReceiver` on 127.0.0.1, stopped after the
    test. Subscribe ``harvest_receiver.url("/hook")``, dispatch, then
    :func:`~flask_harvest.testing.drain` the app (or ``harvest_receiver.wait_for(n)``) and look at
    ``harvest_receiver.requests``.

Disable the plugin with ``-p no:flask_harvest``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .testing import CapturingReceiver


@pytest.fixture
def harvest_receiver() -> Iterator[CapturingReceiver]:
    """A capturing HTTP receiver on 127.0.0.1, started for the test and stopped after it."""
    # Imported here: pytest loads plugins before a test session configures anything, and the
    # package (Flask, SQLAlchemy, RQ) is only needed by tests that use the fixture.
    from .testing import CapturingReceiver

    with CapturingReceiver() as receiver:
        yield receiver
