"""The admin wing: adapter management, usage, live stats, the dashboard, /metrics and health."""
