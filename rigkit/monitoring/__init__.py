"""Watching a fleet: Prometheus' scrape targets from the inventory, its alert rules and rigkit's Grafana dashboards,
every query declared once (rigkit.monitoring.queries) from the metric names the tier proof reads
(rigkit.metrics) and the rig's textfile collector writes (rigkit/files/node_textfile.py)."""
