// Package monitoring holds what an operator loads into Grafana and
// Prometheus to watch llmq: grafana-dashboard.json, a dashboard of the
// health measures over the metrics the code exports, and alerts.yml, alert
// rules for the same measures, each with a runbook entry in
// docs/operations.md ("Alerts and runbook"). It has no Go API.
//
// Its test keeps both files true to the code: every metric they name must
// be one the packages register (read from their sources and named as the
// OpenTelemetry Prometheus exporter names it), every runbook link must
// reach a heading of the runbook, and the operations guide's metrics table
// must list every registered metric.
package monitoring
