package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/test/host"
)

// The processes' cost (issue 14, item 4): the agent's and the kubelet's resident memory
// and CPU time from their own /metrics (the Go process collectors), read through the API
// server's proxy as the e2e suite's cost_test.go does; containerd's from /proc: on a
// process node its process is this machine's (found in the lab's state.json, or by its
// configuration on its command line), on the VM node the guest's, read by a shell loop in
// the guest that answers each request on one ssh session (a new ssh login per sample
// would cost the emulated guest more than what is measured).

// usage is one read of a process: resident memory and CPU time used so far.
type usage struct {
	RSS float64 `json:"rssBytes"`
	CPU float64 `json:"cpuSeconds"`
	Err string  `json:"error,omitempty"`
}

func (u usage) ok() bool { return u.Err == "" }

// sample is one read of a node's processes.
type sample struct {
	At         time.Time `json:"at"`
	Agent      usage     `json:"agent"`
	Kubelet    usage     `json:"kubelet"`
	Containerd usage     `json:"containerd"`
	// Shims and ShimsRSS: the node's containerd-shim processes and their resident
	// memory (process nodes only: one per pod sandbox).
	Shims    int     `json:"shims,omitempty"`
	ShimsRSS float64 `json:"shimsRssBytes,omitempty"`
	// AgentCounters are the agent's counters of trouble (write errors, dropped
	// events, stream overflows) and of its work (stamps, pod writes), summed by name.
	AgentCounters map[string]float64 `json:"agentCounters,omitempty"`
	// agentHist are the agent's latency histograms (stageMetrics), for the stage
	// breakdown (stages.go); nil when its metrics could not be read.
	agentHist map[histKey]histogram
}

// costReader reads one node's processes.
type costReader struct {
	cs                     kubernetes.Interface
	node                   string
	agentPath, kubeletPath string
	containerd             func(ctx context.Context) usage
	shims                  func() (int, float64) // nil on the VM node
	// mode is the agent's runtime_info (runtime, version, mode), read once.
	mode string
}

// newCostReader finds the node's agent pod and its containerd.
func newCostReader(ctx context.Context, cs kubernetes.Interface, node string, containerd func(ctx context.Context) usage, shims func() (int, float64)) (*costReader, error) {
	agents, err := cs.CoreV1().Pods("coroner-system").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=coroner-agent", FieldSelector: "spec.nodeName=" + node,
	})
	if err != nil {
		return nil, err
	}
	if len(agents.Items) != 1 {
		return nil, fmt.Errorf("%s: %d coroner-agent pods, want 1", node, len(agents.Items))
	}
	return &costReader{cs: cs, node: node,
		agentPath:   fmt.Sprintf("/api/v1/namespaces/coroner-system/pods/%s:8090/proxy/metrics", agents.Items[0].Name),
		kubeletPath: fmt.Sprintf("/api/v1/nodes/%s/proxy/metrics", node),
		containerd:  containerd, shims: shims}, nil
}

// take reads every process of the node, at about the same time.
func (r *costReader) take(ctx context.Context) sample {
	s := sample{At: time.Now()}
	var wg sync.WaitGroup
	wg.Go(func() {
		var text []byte
		text, s.Agent = r.scrape(ctx, r.agentPath)
		if text != nil {
			s.AgentCounters = agentCounters(text)
			s.agentHist = parseHistograms(text, stageMetrics...)
			if r.mode == "" {
				r.mode = runtimeInfo(text)
			}
		}
	})
	wg.Go(func() { _, s.Kubelet = r.scrape(ctx, r.kubeletPath) })
	wg.Go(func() { s.Containerd = r.containerd(ctx) })
	if r.shims != nil {
		wg.Go(func() { s.Shims, s.ShimsRSS = r.shims() })
	}
	wg.Wait()
	return s
}

// scrape reads process_resident_memory_bytes and process_cpu_seconds_total at path; the
// text too.
func (r *costReader) scrape(ctx context.Context, path string) ([]byte, usage) {
	var raw []byte
	var err error
	for range 3 { // a busy API server or node may not answer in time
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		raw, err = r.cs.CoreV1().RESTClient().Get().AbsPath(path).DoRaw(actx)
		cancel()
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return nil, usage{Err: err.Error()}
	}
	m := promValues(raw, "process_resident_memory_bytes", "process_cpu_seconds_total")
	rss, ok1 := m["process_resident_memory_bytes"]
	cpu, ok2 := m["process_cpu_seconds_total"]
	if !ok1 || !ok2 {
		return raw, usage{Err: path + ": no process_resident_memory_bytes or process_cpu_seconds_total"}
	}
	return raw, usage{RSS: rss, CPU: cpu}
}

// promValues sums, by metric name, the samples of the named metrics in a Prometheus
// text exposition (labels ignored).
func promValues(text []byte, names ...string) map[string]float64 {
	out := map[string]float64{}
	forEachSample(text, func(name string, _ map[string]string, value float64) {
		if slices.Contains(names, name) {
			out[name] += value
		}
	})
	return out
}

// The agent's counters the report shows the storm's increase of: trouble, and the
// stamps and pod writes (how many API writes a stamp took).
var agentCounterNames = []string{
	metricStamps,
	metricPodWrites,
	"coroner_agent_pod_write_errors_total",
	"coroner_agent_dropped_events_total",
	"coroner_agent_runtime_stream_overflows_total",
	"coroner_agent_runtime_connects_total",
}

const (
	metricStamps    = "coroner_agent_stamps_total"
	metricPodWrites = "coroner_agent_pod_writes_total"
)

func agentCounters(text []byte) map[string]float64 { return promValues(text, agentCounterNames...) }

// runtimeInfo is "runtime mode" of the agent's coroner_agent_runtime_info.
func runtimeInfo(text []byte) string {
	info := ""
	forEachSample(text, func(name string, labels map[string]string, _ float64) {
		if name == "coroner_agent_runtime_info" && info == "" {
			info = strings.TrimSpace(labels["runtime"] + ", agent: " + labels["mode"])
		}
	})
	return info
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times (100 on Linux).
const clockTicks = 100

// procUsage reads a process of this machine.
func procUsage(pid int) usage {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return usage{Err: err.Error()}
	}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return usage{Err: err.Error()}
	}
	ticks, err := statCPUTicks(string(stat))
	if err != nil {
		return usage{Err: fmt.Sprintf("pid %d: %v", pid, err)}
	}
	rss, err := statusRSS(string(status))
	if err != nil {
		return usage{Err: fmt.Sprintf("pid %d: %v", pid, err)}
	}
	return usage{RSS: rss, CPU: float64(ticks) / clockTicks}
}

// statCPUTicks is utime + stime (fields 14 and 15) of a /proc/PID/stat line.
func statCPUTicks(stat string) (int64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("odd stat: no ')'")
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, errors.New("odd stat: too few fields")
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return u + s, nil
}

// statusRSS is VmRSS of a /proc/PID/status, in bytes.
func statusRSS(status string) (float64, error) {
	b, err := host.KiBField(status, "VmRSS")
	return float64(b), err
}

// labProc is an entry of the lab's state.json (test/lab.Proc).
type labProc struct {
	Name string `json:"name"`
	PID  int    `json:"pid"`
}

// readLabState reads the processes of the lab's state.json.
func readLabState(labDir string) ([]labProc, error) {
	b, err := os.ReadFile(filepath.Join(labDir, "state.json"))
	if err != nil {
		return nil, err
	}
	var st struct {
		Processes []labProc `json:"processes"`
	}
	return st.Processes, json.Unmarshal(b, &st)
}

// containerdPID finds the process node's containerd: the lab's state names it
// containerd-<node>; its command line must name the node's configuration (a PID taken by
// another process since, or a containerd restarted by the chaos suite, is looked for on
// /proc instead).
func containerdPID(labDir, node string) (int, error) {
	config := filepath.Join(labDir, "nodes", node, "containerd.toml")
	if st, err := readLabState(labDir); err == nil {
		for _, p := range st {
			if p.Name == "containerd-"+node && cmdlineHas(p.PID, config) {
				return p.PID, nil
			}
		}
	}
	for _, pid := range allPIDs() {
		if cmdlineHas(pid, config) && strings.HasSuffix(cmdlineArg0(pid), "containerd") {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no containerd process with --config %s", config)
}

// shimsOf counts the containerd-shim processes of the node (their -address is its
// containerd's socket) and their resident memory.
func shimsOf(socket string) (int, float64) {
	n, rss := 0, 0.0
	for _, pid := range allPIDs() {
		if strings.Contains(cmdlineArg0(pid), "containerd-shim") && cmdlineHas(pid, socket) {
			n++
			if u := procUsage(pid); u.ok() {
				rss += u.RSS
			}
		}
	}
	return n, rss
}

func allPIDs() []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

func cmdline(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

func cmdlineArg0(pid int) string {
	if a := cmdline(pid); len(a) > 0 {
		return a[0]
	}
	return ""
}

func cmdlineHas(pid int, s string) bool {
	for _, a := range cmdline(pid) {
		if strings.Contains(a, s) {
			return true
		}
	}
	return false
}

// procTicks reads the CPU time of every process of this machine, by PID, with its name.
func procTicks() map[int]procTime {
	out := map[int]procTime{}
	for _, pid := range allPIDs() {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		t, err := statCPUTicks(string(b))
		if err != nil {
			continue
		}
		name := ""
		if i, j := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')'); i >= 0 && j > i {
			name = string(b[i+1 : j])
		}
		if a := cmdline(pid); len(a) > 1 && (name == "exe" || name == "go") {
			name += " " + strings.Join(a[1:min(len(a), 3)], " ")
		}
		out[pid] = procTime{name: name, ticks: t}
	}
	return out
}

type procTime struct {
	name  string
	ticks int64
}

// busiest returns the n processes that used the most CPU between a and b (over d), as
// "name pid: N%" of one core.
func busiest(a, b map[int]procTime, d time.Duration, n int) []string {
	type use struct {
		pid   int
		name  string
		ticks int64
	}
	var us []use
	for pid, t := range b {
		if t0, ok := a[pid]; ok && t0.name == t.name && t.ticks > t0.ticks {
			us = append(us, use{pid, t.name, t.ticks - t0.ticks})
		}
	}
	slices.SortFunc(us, func(x, y use) int { return int(y.ticks - x.ticks) })
	var out []string
	for _, u := range us[:min(n, len(us))] {
		out = append(out, fmt.Sprintf("%s (pid %d) %.0f%%", u.name, u.pid, 100*float64(u.ticks)/clockTicks/d.Seconds()))
	}
	return out
}

// hostCPU reads this machine's CPU time from /proc/stat: busy and total, in clock ticks.
func hostCPU() (busy, total float64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0, errors.New("odd /proc/stat")
	}
	for i, s := range f[1:] {
		if i >= 8 { // guest and guest_nice are counted in user already
			break
		}
		v, _ := strconv.ParseFloat(s, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total, nil
}

// guestSampler reads the VM node's containerd from a shell loop in the guest: each line
// written to it is answered with "sample <guest time, µs> <CPU ticks> <CLK_TCK> <VmRSS
// kB>". The guest's time, against this machine's at the request and the answer, gives
// the guest clock's offset (the guest runs no time synchronisation).
type guestSampler struct {
	mu     sync.Mutex
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	done   chan struct{}
	dead   bool // an answer did not come: the session is closed
	offset clockOffset
}

// clockOffset is the guest clock minus this machine's, from the sample with the
// shortest round trip; uncertain by half that round trip.
type clockOffset struct {
	Offset, RoundTrip time.Duration
	Samples           int
}

const guestLoop = `hz=$(getconf CLK_TCK); p=
while read -r _; do
	[ -n "$p" ] && [ -e /proc/$p/stat ] || p=$(pgrep -xo containerd)
	s=; r=0
	if [ -n "$p" ]; then
		read -r s </proc/$p/stat
		while read -r k v _; do [ "$k" = VmRSS: ] && r=$v; done </proc/$p/status
	fi
	s=${s##*) }
	set -- $s
	echo "sample ${EPOCHREALTIME/./} $(( ${12:-0} + ${13:-0} )) $hz $r"
done`

func startGuestSampler(key, ip string) (*guestSampler, error) {
	args := []string{"-i", key, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
		"-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=15",
		"root@" + ip, "exec bash -c " + shellQuote(guestLoop)}
	cmd := exec.Command("ssh", args...)
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g := &guestSampler{cmd: cmd, in: in, out: bufio.NewReader(out), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(g.done) }()
	return g, nil
}

// read asks the guest for one sample.
func (g *guestSampler) read(ctx context.Context) usage {
	g.mu.Lock()
	defer g.mu.Unlock()
	type answer struct {
		line string
		err  error
	}
	if g.dead {
		return usage{Err: "guest sampler: closed after an earlier failure"}
	}
	sent := time.Now()
	if _, err := io.WriteString(g.in, "s\n"); err != nil {
		return usage{Err: "guest sampler: " + err.Error()}
	}
	ch := make(chan answer, 1)
	go func() {
		l, err := g.out.ReadString('\n')
		ch <- answer{l, err}
	}()
	var a answer
	select {
	case a = <-ch:
	case <-time.After(30 * time.Second):
		a.err = errors.New("no answer within 30s")
	case <-ctx.Done():
		a.err = ctx.Err()
	}
	if a.err != nil && !g.dead {
		// The reader may still be waiting: no other may read after it.
		g.dead = true
		go g.close()
	}
	got := time.Now()
	if a.err != nil {
		return usage{Err: "guest sampler: " + a.err.Error()}
	}
	f := strings.Fields(a.line)
	if len(f) != 5 || f[0] != "sample" {
		return usage{Err: fmt.Sprintf("guest sampler: odd answer %q", a.line)}
	}
	var v [4]float64
	for i := range v {
		v[i], _ = strconv.ParseFloat(f[i+1], 64)
	}
	if v[2] <= 0 || v[3] == 0 {
		return usage{Err: "guest sampler: no containerd process in the guest"}
	}
	guest := time.UnixMicro(int64(v[0]))
	rt := got.Sub(sent)
	if g.offset.Samples == 0 || rt < g.offset.RoundTrip {
		g.offset.Offset, g.offset.RoundTrip = guest.Sub(sent.Add(rt/2)), rt
	}
	g.offset.Samples++
	return usage{RSS: v[3] * 1024, CPU: v[1] / v[2]}
}

func (g *guestSampler) clock() clockOffset {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.offset
}

func (g *guestSampler) close() {
	_ = g.in.Close()
	select {
	case <-g.done:
	case <-time.After(5 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
	}
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
