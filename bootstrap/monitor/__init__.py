"""Prometheus/Grafana on the head, the metrics parser and the live `top`."""
