package main

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics registered by the binary itself, beside the pipeline's and the
// store's pool (dedup.Store.PoolCollector):
//
//	dam_build_info{version,go_version}              gauge, always 1

// newBuildInfo returns dam_build_info: 1, labelled with the version stamped
// at build time and the Go version, so that a dashboard can tell which
// build runs where.
func newBuildInfo() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "dam_build_info",
		Help:        "Always 1, labelled with dam's version and the Go version it was built with.",
		ConstLabels: prometheus.Labels{"version": version, "go_version": runtime.Version()},
	}, func() float64 { return 1 })
}
