package cri

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestCollector(t *testing.T) {
	path := socketIn(t)
	rt := newFakeRuntime("cri-o", true)
	rt.version, rt.endAtOnce = "1.36.0", true
	serve(t, path, rt, nil)
	w, _, _ := testWatcher(t, path, Options{})
	settled(t, w)
	w.updateStats(func(s *Stats) { s.StreamOverflows, s.StreamDropped, s.StaleEvents = 2, 7, 3 })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(w.Collector("coroner", "agent"))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "stream" || l.GetName() == "mode" || l.GetName() == "runtime" {
					key += "/" + l.GetValue()
				}
			}
			got[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	for key, want := range map[string]float64{
		"coroner_agent_runtime_stale_events_total":                     3,
		"coroner_agent_runtime_stream_overflows_total/cri-events":      2,
		"coroner_agent_runtime_stream_overflows_total/containerd":      0,
		"coroner_agent_runtime_stream_dropped_events_total/cri-events": 7,
		"coroner_agent_runtime_connects_total":                         1,
		"coroner_agent_runtime_info/relist/cri-o 1.36.0":               1,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v; all: %v", key, v, ok, want, got)
		}
	}
}
