// Package metrics exports a runtime's state and call outcomes (package
// system) to Prometheus: [NewMetrics] returns a collector to register on
// the registry the application serves. Gauges come from one snapshot per
// scrape; counters are the runtime's exact counts
// ([system.System.CallStats], [system.Snapshot].TransitionCounts and
// RemovalCounts), labelled with the runtime's own enums (error classes,
// removal and eviction kinds). docs/metrics.md lists every metric.
package metrics
