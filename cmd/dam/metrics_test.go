package main

import (
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newBuildInfo())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "dam_build_info" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v", mfs)
	}
	m := mfs[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if m.GetGauge().GetValue() != 1 || len(labels) != 2 || labels["version"] != version || labels["go_version"] != runtime.Version() {
		t.Fatalf("dam_build_info %v = %v", labels, m.GetGauge().GetValue())
	}
}
