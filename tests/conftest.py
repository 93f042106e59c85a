"""Settings for the whole suite."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# Property tests assert behaviour, never speed: no per-example deadline and no "too slow" health check, so a
# loaded machine cannot fail them (hypothesis' defaults are a 200 ms deadline per example).
settings.register_profile("llm-epp", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("llm-epp")
