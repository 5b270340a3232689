package cri

import "github.com/prometheus/client_golang/prometheus"

// statsCollector exposes a Watcher's Stats as Prometheus metrics, read once per scrape.
type statsCollector struct {
	w                                                  *Watcher
	info, connects, relists, stale, overflows, dropped *prometheus.Desc
}

// Collector returns a Prometheus collector of the Watcher's Stats, named
// <namespace>_<subsystem>_runtime_*:
//
//	runtime_info{endpoint,runtime,mode,no_stream}  1 for the runtime in use
//	runtime_connects_total                         connections (the first and reconnects)
//	runtime_relists_total                          completed relists
//	runtime_stale_events_total                     CRI events older than the subscription, ignored
//	runtime_stream_overflows_total{stream}         times a stream's queue overflowed (a relist followed)
//	runtime_stream_dropped_events_total{stream}    events dropped then
//
// stream is SourceCRIEvents or SourceContainerd.
func (w *Watcher) Collector(namespace, subsystem string) prometheus.Collector {
	name := func(n string) string { return prometheus.BuildFQName(namespace, subsystem, n) }
	return &statsCollector{
		w:         w,
		info:      prometheus.NewDesc(name("runtime_info"), "The container runtime in use: its CRI endpoint (configured or discovered), name and version, how container changes are followed (events or relist) and why not by the CRI event stream.", []string{"endpoint", "runtime", "mode", "no_stream"}, nil),
		connects:  prometheus.NewDesc(name("runtime_connects_total"), "Connections to the container runtime (the first and every reconnect).", nil, nil),
		relists:   prometheus.NewDesc(name("runtime_relists_total"), "Completed relists of the runtime's containers.", nil, nil),
		stale:     prometheus.NewDesc(name("runtime_stale_events_total"), "CRI container events created before the agent subscribed (replayed by the runtime), ignored.", nil, nil),
		overflows: prometheus.NewDesc(name("runtime_stream_overflows_total"), "Times a runtime event stream delivered faster than the agent handled it: events were dropped (never holding the runtime back) and a relist followed. stream: cri-events, containerd.", []string{"stream"}, nil),
		dropped:   prometheus.NewDesc(name("runtime_stream_dropped_events_total"), "Events of a runtime event stream dropped on overflow (found again by the relist that followed, but for OOM events of containers that keep running). stream: cri-events, containerd.", []string{"stream"}, nil),
	}
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.info, c.connects, c.relists, c.stale, c.overflows, c.dropped} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.w.Stats()
	if s.Connected {
		ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, 1, s.Endpoint, s.Runtime, string(s.Mode), s.NoStream)
	}
	ch <- prometheus.MustNewConstMetric(c.connects, prometheus.CounterValue, float64(s.Connects))
	ch <- prometheus.MustNewConstMetric(c.relists, prometheus.CounterValue, float64(s.Relists))
	ch <- prometheus.MustNewConstMetric(c.stale, prometheus.CounterValue, float64(s.StaleEvents))
	ch <- prometheus.MustNewConstMetric(c.overflows, prometheus.CounterValue, float64(s.StreamOverflows), SourceCRIEvents)
	ch <- prometheus.MustNewConstMetric(c.overflows, prometheus.CounterValue, float64(s.ContainerdOverflows), SourceContainerd)
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(s.StreamDropped), SourceCRIEvents)
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(s.ContainerdDropped), SourceContainerd)
}
