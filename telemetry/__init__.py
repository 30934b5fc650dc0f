"""Prometheus metrics and W3C/OpenTelemetry tracing shared by every ratifier service."""
