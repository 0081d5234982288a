// Package telemetry is the OpenTelemetry plumbing the llmq packages share:
// providers that default to no-ops (llmq never reads the global ones), the
// W3C trace-context encoding of a job's acceptance span, and the cached
// snapshot that keeps database-derived gauges from querying on every
// scrape.
package telemetry
