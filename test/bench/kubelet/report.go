package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/coroner-dev/coroner/test/bench/measure"
)

// The goal of issue 14, item 3: in events mode coroner's p99 within 200 ms of the
// container's finish, and within 0.3 of the kubelet's p99.
const (
	goalP99      = 200 * time.Millisecond
	goalRatioP99 = 0.3
)

// report is what the bench prints and writes to p2.json.
type report struct {
	Started  time.Time   `json:"started"`
	Seconds  float64     `json:"seconds"`
	Options  jsonOptions `json:"options"`
	HostCPUs int         `json:"hostCPUs"`
	// HostIdle and HostStorm: this machine's CPU use, in percent of all its CPUs, and
	// its busiest processes, during the idle period and the storm.
	HostIdle  hostUse      `json:"hostIdle"`
	HostStorm hostUse      `json:"hostStorm"`
	Nodes     []nodeReport `json:"nodes"`
}

type jsonOptions struct {
	Exits, OOMs, VMExits, VMOOMs int
	Rate, VMRate                 float64
	MaxLive, VMMaxLive           int
	RunFor, VMRunFor, PodTimeout string
	Idle, MemoryLimit            string
}

type nodeReport struct {
	Node    string `json:"node"`
	What    string `json:"what"`
	Runtime string `json:"runtime"`
	// AgentMode is the agent's coroner_agent_runtime_info: runtime and mode.
	AgentMode string `json:"agentMode"`
	// Rate: pods created per second (exits and OOMs interleaved).
	Rate float64 `json:"rate"`
	// StormSeconds: from the first pod's creation to the last one's deletion.
	StormSeconds float64 `json:"stormSeconds"`
	// ClockOffsetMs is the VM guest's clock minus this machine's, subtracted from its
	// finish times; ClockUncertaintyMs half the round trip it was measured with.
	ClockOffsetMs      *float64      `json:"clockOffsetMs,omitempty"`
	ClockUncertaintyMs *float64      `json:"clockUncertaintyMs,omitempty"`
	Exits              kindReport    `json:"exits"`
	OOMs               kindReport    `json:"ooms"`
	CreateErrors       int           `json:"createErrors"`
	Cost               []procCost    `json:"cost"`
	AgentCounters      countersDelta `json:"agentCountersDuringStorm,omitempty"`
	// Stages: where the time from finishedAt to the stamp seen through a watch goes,
	// from the agent's latency histograms over the storm and the bench's own latencies
	// (stages.go); StagesNote what could not be had.
	Stages     []stageReport `json:"stages,omitempty"`
	StagesNote string        `json:"stagesNote,omitempty"`
	Samples    []sample      `json:"samples"`
}

type countersDelta map[string]float64

// kindReport is the latencies of one kind of exit on one node.
type kindReport struct {
	Pods    int   `json:"pods"`
	Coroner stats `json:"coroner"`
	Kubelet stats `json:"kubelet"`
	// RatioP50 and RatioP99: coroner's over the kubelet's.
	RatioP50 float64 `json:"ratioP50"`
	RatioP99 float64 `json:"ratioP99"`
	// NeverStamped: pods whose container exited (the kubelet or the runtime said so)
	// and that coroner did not stamp within the pod timeout; Wrong: stamped otherwise
	// than expected.
	NeverStamped []string `json:"neverStamped"`
	Wrong        []string `json:"wrong"`
	// KubeletNever: stamped, not reported by the kubelet within the timeout.
	KubeletNever []string `json:"kubeletNever"`
	// Failed: the pod failed without the exit it was made for (rejected, evicted, a
	// container that did not end as meant); NoExit: no exit seen within the timeout.
	Failed []string `json:"failed"`
	NoExit []string `json:"noExit"`
	// Untimed: reported, but the container's finishedAt could not be read.
	Untimed []string `json:"untimed"`
	// CoronerMs and KubeletMs are the timed pods' latencies, in creation order.
	CoronerMs []float64 `json:"coronerMs"`
	KubeletMs []float64 `json:"kubeletMs"`
}

type stats struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50Ms"`
	P90 float64 `json:"p90Ms"`
	P99 float64 `json:"p99Ms"`
	Max float64 `json:"maxMs"`
}

func statsOf(ds []time.Duration) stats {
	if len(ds) == 0 {
		return stats{}
	}
	return stats{N: len(ds), P50: ms(measure.Percentile(ds, 50)), P90: ms(measure.Percentile(ds, 90)),
		P99: ms(measure.Percentile(ds, 99)), Max: ms(slices.Max(ds))}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// procCost is one process's memory and CPU, idle and during the storm.
type procCost struct {
	Process string `json:"process"`
	// RSS at the end of the idle period, the highest read during the storm, MiB.
	RSSIdleMiB  float64 `json:"rssIdleMiB"`
	RSSStormMiB float64 `json:"rssStormPeakMiB"`
	// CPU in percent of one core over the idle period and over the storm; -1 when
	// it could not be read.
	CPUIdlePct  float64 `json:"cpuIdlePct"`
	CPUStormPct float64 `json:"cpuStormPct"`
	Note        string  `json:"note,omitempty"`
}

func buildReport(o options, nodes []*node, hostIdle, hostStorm hostUse, began time.Time) *report {
	r := &report{Started: began, Seconds: time.Since(began).Seconds(), HostCPUs: runtime.NumCPU(),
		HostIdle: hostIdle, HostStorm: hostStorm,
		Options: jsonOptions{Exits: o.exits, OOMs: o.ooms, VMExits: o.vmExits, VMOOMs: o.vmOOMs, Rate: o.rate, VMRate: o.vmRate,
			MaxLive: o.maxLive, VMMaxLive: o.vmMaxLive, RunFor: o.runFor.String(), VMRunFor: o.vmRunFor.String(),
			PodTimeout: o.podTimeout.String(), Idle: o.idle.String(), MemoryLimit: o.memoryLimit}}
	for _, n := range nodes {
		nr := nodeReport{Node: n.run.plan.node, What: n.what, Runtime: n.runtime, AgentMode: n.cost.mode,
			Rate: n.run.plan.rate, CreateErrors: n.run.createErrors, Samples: n.samples}
		if !n.run.ended.IsZero() {
			nr.StormSeconds = n.run.ended.Sub(n.run.started).Seconds()
		}
		var offset time.Duration
		if n.guest != nil {
			c := n.guest.clock()
			if c.Samples > 0 {
				offset = c.Offset
				off, unc := ms(c.Offset), ms(c.RoundTrip/2)
				nr.ClockOffsetMs, nr.ClockUncertaintyMs = &off, &unc
			}
		}
		n.run.tracker.mu.Lock()
		nr.Exits = kindOf(n.run.records, kindExit, offset)
		nr.OOMs = kindOf(n.run.records, kindOOM, offset)
		n.run.tracker.mu.Unlock()
		nr.Cost = costOf(n.samples)
		if len(n.samples) >= 3 {
			nr.AgentCounters = countersDelta{}
			first, last := n.samples[1].AgentCounters, n.samples[len(n.samples)-1].AgentCounters
			for k, v := range last {
				if d := v - first[k]; d != 0 {
					nr.AgentCounters[k] = d
				}
			}
			nr.Stages, nr.StagesNote = stagesOf(n.samples[1], n.samples[len(n.samples)-1], nr.Exits, nr.OOMs)
		}
		r.Nodes = append(r.Nodes, nr)
	}
	return r
}

// kindOf sums up the records of kind k; offset is the runtime's clock minus this
// machine's.
func kindOf(recs []*record, k kind, offset time.Duration) kindReport {
	kr := kindReport{NeverStamped: []string{}, Wrong: []string{}, KubeletNever: []string{}, Failed: []string{}, NoExit: []string{}, Untimed: []string{}}
	var coroner, kubelet []time.Duration
	for _, r := range recs {
		if r.kind != k {
			continue
		}
		kr.Pods++
		exited := !r.kubeletAt.IsZero() || !r.finishedAt.IsZero()
		switch {
		case r.wrong != "":
			kr.Wrong = append(kr.Wrong, r.name+": "+r.wrong)
		case r.failed != "":
			kr.Failed = append(kr.Failed, r.name+": "+r.failed)
		case !exited && r.stampAt.IsZero():
			kr.NoExit = append(kr.NoExit, r.name)
		case r.stampAt.IsZero():
			kr.NeverStamped = append(kr.NeverStamped, r.name)
		}
		if !r.stampAt.IsZero() && r.kubeletAt.IsZero() {
			kr.KubeletNever = append(kr.KubeletNever, r.name)
		}
		if r.finishedAt.IsZero() {
			if exited {
				kr.Untimed = append(kr.Untimed, r.name+": "+orNone(r.finishedErr))
			}
			continue
		}
		finished := r.finishedAt.Add(-offset)
		if !r.stampAt.IsZero() && r.wrong == "" {
			d := r.stampAt.Sub(finished)
			coroner = append(coroner, d)
			kr.CoronerMs = append(kr.CoronerMs, ms(d))
		}
		if !r.kubeletAt.IsZero() {
			d := r.kubeletAt.Sub(finished)
			kubelet = append(kubelet, d)
			kr.KubeletMs = append(kr.KubeletMs, ms(d))
		}
	}
	kr.Coroner, kr.Kubelet = statsOf(coroner), statsOf(kubelet)
	if kr.Kubelet.P50 > 0 {
		kr.RatioP50 = kr.Coroner.P50 / kr.Kubelet.P50
	}
	if kr.Kubelet.P99 > 0 {
		kr.RatioP99 = kr.Coroner.P99 / kr.Kubelet.P99
	}
	return kr
}

func orNone(s string) string {
	if s == "" {
		return "not read"
	}
	return s
}

// costOf sums up a node's samples: [0] and [1] bound the idle period, [1] and the last
// the storm.
func costOf(samples []sample) []procCost {
	if len(samples) < 3 {
		return nil
	}
	idle0, idle1, end := samples[0], samples[1], samples[len(samples)-1]
	storm := samples[1:]
	one := func(name string, get func(sample) usage) procCost {
		c := procCost{Process: name, CPUIdlePct: cpuPct(get(idle0), get(idle1), idle0.At, idle1.At),
			CPUStormPct: cpuPct(get(idle1), get(end), idle1.At, end.At)}
		if u := get(idle1); u.ok() {
			c.RSSIdleMiB = u.RSS / (1 << 20)
		}
		for _, s := range storm {
			if u := get(s); u.ok() {
				c.RSSStormMiB = max(c.RSSStormMiB, u.RSS/(1<<20))
			} else if c.Note == "" {
				c.Note = u.Err
			}
		}
		return c
	}
	out := []procCost{
		one("coroner-agent", func(s sample) usage { return s.Agent }),
		one("kubelet", func(s sample) usage { return s.Kubelet }),
		one("containerd", func(s sample) usage { return s.Containerd }),
	}
	if idle1.Shims > 0 {
		c := procCost{Process: "containerd shims", RSSIdleMiB: idle1.ShimsRSS / (1 << 20), CPUIdlePct: -1, CPUStormPct: -1}
		most := idle1.Shims
		for _, s := range storm {
			c.RSSStormMiB = max(c.RSSStormMiB, s.ShimsRSS/(1<<20))
			most = max(most, s.Shims)
		}
		c.Note = fmt.Sprintf("%d processes idle, up to %d in the storm; CPU not summed (they come and go)", idle1.Shims, most)
		out = append(out, c)
	}
	return out
}

func cpuPct(a, b usage, at, bt time.Time) float64 {
	if !a.ok() || !b.ok() || !bt.After(at) || b.CPU < a.CPU {
		return -1
	}
	return 100 * (b.CPU - a.CPU) / bt.Sub(at).Seconds()
}

// unstamped counts the exits and OOM kills never stamped or stamped wrong.
func (r *report) unstamped() int {
	n := 0
	for _, nr := range r.Nodes {
		for _, k := range []kindReport{nr.Exits, nr.OOMs} {
			n += len(k.NeverStamped) + len(k.Wrong)
		}
	}
	return n
}

func (r *report) print(out io.Writer) {
	fmt.Fprintf(out, "\nP2 against the kubelet: container finishedAt -> visible through a watch, ms (coroner: its stamp; kubelet: terminated status)\n")
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "node\tagent\texits\tn\tcoroner p50\tp90\tp99\tmax\tkubelet p50\tp90\tp99\tmax\tratio p50\tratio p99\tnever stamped\t")
	for _, n := range r.Nodes {
		for _, k := range []struct {
			name string
			kr   kindReport
		}{{"exit", n.Exits}, {"limit OOM", n.OOMs}} {
			if k.kr.Pods == 0 {
				continue
			}
			c, kl := k.kr.Coroner, k.kr.Kubelet
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t%.2f\t%d\t\n",
				n.Node, mode(n.AgentMode), k.name, c.N, c.P50, c.P90, c.P99, c.Max, kl.P50, kl.P90, kl.P99, kl.Max, k.kr.RatioP50, k.kr.RatioP99,
				len(k.kr.NeverStamped)+len(k.kr.Wrong))
		}
	}
	w.Flush()
	for _, n := range r.Nodes {
		fmt.Fprintf(out, "%s: %s; agent: %s; %.2g pods/s (~%.1f agent writes/s), storm %.0fs", n.Node, n.What, orNone(n.AgentMode),
			n.Rate, n.Rate*float64(n.Exits.Pods+2*n.OOMs.Pods)/float64(max(n.Exits.Pods+n.OOMs.Pods, 1)), n.StormSeconds)
		if n.ClockOffsetMs != nil {
			fmt.Fprintf(out, "; guest clock %+.1f ms (±%.1f) from this machine's, corrected", *n.ClockOffsetMs, *n.ClockUncertaintyMs)
		}
		fmt.Fprintln(out)
		for _, k := range []struct {
			name string
			kr   kindReport
		}{{"exits", n.Exits}, {"OOMs", n.OOMs}} {
			for _, l := range []struct {
				what  string
				names []string
			}{{"never stamped", k.kr.NeverStamped}, {"stamped wrong", k.kr.Wrong}, {"failed before their exit", k.kr.Failed},
				{"no exit within the timeout", k.kr.NoExit}, {"not reported by the kubelet", k.kr.KubeletNever}, {"untimed (no finishedAt)", k.kr.Untimed}} {
				if len(l.names) > 0 {
					fmt.Fprintf(out, "  %s %s: %d: %s\n", k.name, l.what, len(l.names), short(l.names))
				}
			}
		}
		if n.CreateErrors > 0 {
			fmt.Fprintf(out, "  pod creations failed (retried): %d\n", n.CreateErrors)
		}
		if len(n.AgentCounters) > 0 {
			fmt.Fprintf(out, "  agent counters during the storm: %v\n", map[string]float64(n.AgentCounters))
		}
		if st, w := n.AgentCounters[metricStamps], n.AgentCounters[metricPodWrites]; st > 0 {
			fmt.Fprintf(out, "  agent pod writes per stamp: %.2f (%.0f patches for %.0f stamps, every stamp of the node's agent)\n", w/st, w, st)
		}
	}

	fmt.Fprintf(out, "\nWhere the time goes, ms, over the storm: the agent's stages from its own histograms (p50 and p99 estimated from\n"+
		"the buckets by linear interpolation within the bucket; every stamp of the kind the node's agent wrote meanwhile, the\n"+
		"bench's pods or not), then the bench's own measurement (nearest rank); the watch's delivery is not measured apart:\n"+
		"compare the last two rows of a kind (their percentiles come from different estimates, within a bucket's width)\n")
	for _, n := range r.Nodes {
		printStages(out, n)
	}

	fmt.Fprintf(out, "\nCost: resident memory (MiB) and CPU (%% of one core), idle (%s) and during the storm\n", r.Options.Idle)
	w = tabwriter.NewWriter(out, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "node\tprocess\tRSS idle\tRSS storm peak\tCPU idle\tCPU storm\t")
	for _, n := range r.Nodes {
		for _, c := range n.Cost {
			fmt.Fprintf(w, "%s\t%s\t%.1f\t%.1f\t%s\t%s\t\n", n.Node, c.Process, c.RSSIdleMiB, c.RSSStormMiB, pct(c.CPUIdlePct), pct(c.CPUStormPct))
		}
	}
	w.Flush()
	for _, n := range r.Nodes {
		for _, c := range n.Cost {
			if c.Note != "" {
				fmt.Fprintf(out, "%s %s: %s\n", n.Node, c.Process, c.Note)
			}
		}
	}
	fmt.Fprintf(out, "this machine: %d CPUs, %s busy idle, %s during the storm (every lab process, the VM and this bench share them)\n",
		r.HostCPUs, pct(r.HostIdle.BusyPct), pct(r.HostStorm.BusyPct))
	fmt.Fprintf(out, "  busiest idle (%% of one core): %s\n", strings.Join(r.HostIdle.Busiest, ", "))
	fmt.Fprintf(out, "  busiest in the storm: %s\n", strings.Join(r.HostStorm.Busiest, ", "))
	if r.HostIdle.BusyPct > 50 {
		fmt.Fprintf(out, "  WARNING: this machine was %.0f%% busy before the storm: other load competes with the nodes, the figures measure that too\n", r.HostIdle.BusyPct)
	}

	fmt.Fprintf(out, "\nGoal (events mode): coroner p99 <= %v and <= %.1fx the kubelet's p99\n", goalP99, goalRatioP99)
	for _, n := range r.Nodes {
		if mode(n.AgentMode) != "events" {
			continue
		}
		for _, k := range []struct {
			name string
			kr   kindReport
		}{{"exits", n.Exits}, {"OOMs", n.OOMs}} {
			if k.kr.Coroner.N == 0 {
				continue
			}
			fmt.Fprintf(out, "  %s %s: p99 %.0f ms (%s), %.2fx the kubelet's (%s)\n", n.Node, k.name,
				k.kr.Coroner.P99, met(k.kr.Coroner.P99 <= ms(goalP99)), k.kr.RatioP99, met(k.kr.RatioP99 <= goalRatioP99))
		}
	}
}

func mode(agentMode string) string {
	_, m, ok := strings.Cut(agentMode, "agent: ")
	if !ok || m == "" {
		return "?"
	}
	return m
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func pct(v float64) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", v)
}

func short(names []string) string {
	if len(names) > 8 {
		return strings.Join(names[:8], ", ") + fmt.Sprintf(", ... (%d more)", len(names)-8)
	}
	return strings.Join(names, ", ")
}

func (r *report) write(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
