"""The broker's HTTP endpoint (a part of the services role): Prometheus /metrics, the dashboard
and its JSON API. `sources.py` reads, `prometheus.py` renders /metrics, `server.py` serves;
static/ holds the dashboard's page, script and style (no CDN: it works offline)."""
