package agent_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/ktesting"

	"github.com/coroner-dev/coroner/agent"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/containerd/containerdtest"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/integration/agent/kubeletsim"
)

const (
	nodeA = "node-a"
	nodeB = "node-b"
	// phaseGrace is the agent's --phase-grace in these tests.
	phaseGrace = 2 * time.Second
	// wait bounds every wait for the agent.
	wait = 30 * time.Second
)

// runningAgent is an agent started with agent.Run, as coroner-agent's main does.
type runningAgent struct {
	addr string // /metrics, /healthz and /readyz
}

// startAgent runs the agent for node in-process until the test ends, on the shared
// containerd (or another endpoint) and the API server, and waits until it serves.
func startAgent(t *testing.T, api *harness.Env, node, endpoint string) *runningAgent {
	t.Helper()
	a, _ := startStoppableAgent(t, api, node, endpoint)
	return a
}

// freeAddr returns a 127.0.0.1 address with a port nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func (a *runningAgent) scrape() (string, error) {
	resp, err := http.Get("http://" + a.addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// metric sums the samples of name whose labels include every label given ("k=v").
func (a *runningAgent) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	body, err := a.scrape()
	if err != nil {
		t.Fatalf("scraping the agent: %v", err)
	}
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			if !strings.Contains(line, k+`="`+v+`"`) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// healthz is the agent's liveness probe (/healthz), readyz its readiness (/readyz):
// status code and body.
func (a *runningAgent) healthz(t *testing.T) (int, string) { return a.probe(t, "/healthz") }
func (a *runningAgent) readyz(t *testing.T) (int, string)  { return a.probe(t, "/readyz") }

func (a *runningAgent) probe(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + a.addr + path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, wait)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type fixture struct {
	t      *testing.T
	ctx    context.Context
	api    *harness.Env
	cri    *containerd.Env
	client kubernetes.Interface
	ns     string
}

func newFixture(t *testing.T, cri *containerd.Env) *fixture {
	t.Helper()
	api := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return &fixture{t: t, ctx: ctx, api: api, cri: cri, client: kubernetes.NewForConfigOrDie(api.Config), ns: api.Namespace(t)}
}

func (f *fixture) node(name string) *kubeletsim.Node {
	return &kubeletsim.Node{Name: name, Client: f.client, CRI: f.cri}
}

// pod creates a pod with one container "main" running command on node; the test's end
// removes its sandbox and the Pod object.
func (f *fixture) pod(node, name string, memoryLimit int64, command ...string) *kubeletsim.Pod {
	f.t.Helper()
	return f.podWith(node, name, kubeletsim.PodOptions{
		Containers: []containerd.Container{{Name: "main", Command: command, MemoryLimit: memoryLimit}},
	})
}

// podWith creates a pod on node with opts; the test's end removes its sandbox and the
// Pod object.
func (f *fixture) podWith(node, name string, opts kubeletsim.PodOptions) *kubeletsim.Pod {
	f.t.Helper()
	p, err := f.node(node).CreatePod(f.ctx, f.ns, name, opts)
	if p != nil {
		f.t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if p.SandboxID != "" {
				_ = p.Remove(ctx)
			}
			_ = p.ForceDelete(ctx)
		})
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

func (f *fixture) start(p *kubeletsim.Pod) string {
	f.t.Helper()
	id, err := p.StartContainer(f.ctx, "main")
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

func (f *fixture) get(p *kubeletsim.Pod) *corev1.Pod {
	f.t.Helper()
	got, err := p.Get(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	return got
}

// waitCondition waits until the pod has condition typ True and returns it.
func (f *fixture) waitCondition(p *kubeletsim.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	f.t.Helper()
	var c *corev1.PodCondition
	waitFor(f.t, "condition "+string(typ)+" on "+p.Object.Name, func() bool {
		got := f.get(p)
		c = conditions.Find(&got.Status, typ)
		return c != nil && c.Status == corev1.ConditionTrue
	})
	return c
}

// writtenByAgent reports whether the agent's field manager ever wrote the pod.
func writtenByAgent(p *corev1.Pod) bool {
	for _, mf := range p.ManagedFields {
		if mf.Manager == agent.Component {
			return true
		}
	}
	return false
}

// waitExited waits for the container's exit over CRI and returns its status.
func (f *fixture) waitExited(p *kubeletsim.Pod, id string) (code int32, reason string, finished time.Time) {
	f.t.Helper()
	waitFor(f.t, "the container exiting", func() bool {
		st, err := p.Status(f.ctx, id)
		if err != nil {
			return false
		}
		code, reason, finished = st.GetExitCode(), st.GetReason(), kubeletsim.FinishedAt(st)
		return st.GetState().String() == "CONTAINER_EXITED"
	})
	return code, reason, finished
}

// TestExitCodeLeftToTheKubelet (a): exit 3 of a restartPolicy Never pod is seen by the
// agent, and it writes nothing: no phase while the pod is not being deleted, and nothing
// over the kubelet's status when it comes.
func TestExitCodeLeftToTheKubelet(t *testing.T) { containerdtest.Each(t, testExitCodeLeftToTheKubelet) }

func testExitCodeLeftToTheKubelet(t *testing.T, env *containerd.Env) {
	f := newFixture(t, env)
	a := startAgent(t, f.api, nodeA, f.cri.Endpoint)
	p := f.pod(nodeA, "exit3", 0, "sh", "-c", "sleep 0.3; exit 3")
	id := f.start(p)
	code, reason, _ := f.waitExited(p, id)
	if code != 3 {
		t.Fatalf("exit code %d (%s), want 3", code, reason)
	}
	waitFor(t, "the agent classifying the exit", func() bool {
		return a.metric(t, "coroner_agent_container_exits_total", "verdict=NotOOM") == 1
	})
	time.Sleep(500 * time.Millisecond) // a few batch periods
	got := f.get(p)
	if got.ResourceVersion != p.Object.ResourceVersion || writtenByAgent(got) {
		t.Fatalf("the agent wrote the pod: phase %q, conditions %+v, managers %+v", got.Status.Phase, got.Status.Conditions, got.ManagedFields)
	}

	// The kubelet's word comes; the agent adds nothing to it.
	st, err := p.Status(f.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WriteTerminated(f.ctx, corev1.PodFailed, "main", st); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	got = f.get(p)
	if writtenByAgent(got) || got.Status.Phase != corev1.PodFailed || len(got.Status.Conditions) != 0 {
		t.Errorf("after the kubelet's status: phase %q, conditions %+v, agent wrote: %v", got.Status.Phase, got.Status.Conditions, writtenByAgent(got))
	}
	if v := a.metric(t, "coroner_agent_stamps_total"); v != 0 {
		t.Errorf("stamps_total = %v, want 0", v)
	}
}

// TestLimitOOM (b): a container over its 20 MiB limit is stamped coroner.dev/OOMKilled,
// reason MemoryLimitExceeded, with a message naming the container and the limit.
func TestLimitOOM(t *testing.T) { containerdtest.Each(t, testLimitOOM) }

func testLimitOOM(t *testing.T, env *containerd.Env) {
	f := newFixture(t, env)
	a := startAgent(t, f.api, nodeA, f.cri.Endpoint)
	p := f.pod(nodeA, "hog", 20<<20, "/bin/memhog")
	id := f.start(p)
	c := f.waitCondition(p, conditions.OOMKilled)
	if c.Reason != conditions.ReasonMemoryLimitExceeded || !strings.Contains(c.Message, "container main") || !strings.Contains(c.Message, "20Mi") {
		t.Errorf("condition %+v, want reason MemoryLimitExceeded naming container main and 20Mi", c)
	}
	code, reason, finished := f.waitExited(p, id)
	t.Logf("exit %d (%s); condition: %q; stamped %v after the exit", code, reason, c.Message, c.LastTransitionTime.Sub(finished))
	got := f.get(p)
	if got.Status.Phase != corev1.PodPending || conditions.Find(&got.Status, conditions.DisruptionTarget) != nil {
		t.Errorf("phase %q, conditions %+v: only OOMKilled is the agent's to write", got.Status.Phase, got.Status.Conditions)
	}
	waitFor(t, "the stamp counted", func() bool {
		return a.metric(t, "coroner_agent_stamps_total", "kind=LimitOOM", "reason=MemoryLimitExceeded") == 1
	})
	if n := a.metric(t, "coroner_agent_detection_latency_seconds_count", "kind=LimitOOM"); n != 1 {
		t.Errorf("latency samples %v, want 1", n)
	}
	if v := a.metric(t, "coroner_agent_unknown_oom_total"); v != 0 {
		t.Errorf("unknown OOMs %v", v)
	}
}

// TestChildOOM (c): the kernel kills a child over the limit while PID 1 survives: the
// pod is stamped all the same, and the container keeps running.
func TestChildOOM(t *testing.T) { containerdtest.Each(t, testChildOOM) }

func testChildOOM(t *testing.T, env *containerd.Env) {
	f := newFixture(t, env)
	startAgent(t, f.api, nodeA, f.cri.Endpoint)
	p := f.pod(nodeA, "child-hog", 20<<20, "/bin/memhog", "-child")
	id := f.start(p)
	c := f.waitCondition(p, conditions.OOMKilled)
	if c.Reason != conditions.ReasonMemoryLimitExceeded || !strings.Contains(c.Message, "container main") {
		t.Errorf("condition %+v", c)
	}
	st, err := p.Status(f.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetState().String() != "CONTAINER_RUNNING" {
		t.Errorf("container %v, want it still running", st.GetState())
	}
}

// TestRuntimeRestart (d): containerd dies, the container is OOM-killed while it is down,
// containerd comes back: the stamp still appears; /readyz fails meanwhile and says why,
// while /healthz (liveness) stays ok: restarting the agent would not bring containerd back.
func TestRuntimeRestart(t *testing.T) { containerdtest.Each(t, testRuntimeRestart) }

func testRuntimeRestart(t *testing.T, env *containerd.Env) {
	f := newFixture(t, env)
	a := startAgent(t, f.api, nodeA, f.cri.Endpoint)
	p := f.pod(nodeA, "restart", 20<<20, "sh", "-c", "while [ ! -e /tmp/go ]; do sleep 0.05; done; exec /bin/memhog")
	id := f.start(p)
	pid, err := p.PID(f.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := a.readyz(t); code != http.StatusOK {
		t.Fatalf("/readyz %d %q before the restart", code, body)
	}
	time.Sleep(1500 * time.Millisecond) // a relist: the agent has seen the container start

	f.cri.Kill()
	waitFor(t, "/readyz failing", func() bool {
		code, _ := a.readyz(t)
		return code == http.StatusServiceUnavailable
	})
	_, body := a.readyz(t)
	t.Logf("/readyz while containerd is down: %q", body)
	if !strings.Contains(body, "container runtime unreachable") {
		t.Errorf("/readyz body %q does not say why", body)
	}
	if code, body := a.healthz(t); code != http.StatusOK {
		t.Errorf("/healthz %d %q while containerd is down: the kubelet would restart the agent for nothing", code, body)
	}
	if err := os.WriteFile(filepath.Join("/proc", strconv.Itoa(pid), "root/tmp/go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the container dying", func() bool { return !alive(pid) })
	time.Sleep(300 * time.Millisecond)
	if got := f.get(p); writtenByAgent(got) {
		t.Fatal("stamped before containerd was back: the exit cannot have been seen")
	}

	restarted := time.Now()
	if err := f.cri.StartAgain(f.ctx); err != nil {
		t.Fatal(err)
	}
	c := f.waitCondition(p, conditions.OOMKilled)
	t.Logf("stamped %v after containerd's restart: %q", time.Since(restarted).Round(time.Millisecond), c.Message)
	waitFor(t, "/readyz ok again", func() bool {
		code, _ := a.readyz(t)
		return code == http.StatusOK
	})
	if n := a.metric(t, "coroner_agent_container_exits_total", "verdict=LimitOOM"); n != 1 {
		t.Errorf("LimitOOM exits %v, want 1", n)
	}
}

// TestTerminalPhaseOnDeletion (e, A4): a pod whose container exited 0 is deleted; with no
// kubelet to finish it, the agent sets phase Succeeded after --phase-grace, not before,
// and never deletes it.
func TestTerminalPhaseOnDeletion(t *testing.T) { containerdtest.Each(t, testTerminalPhaseOnDeletion) }

func testTerminalPhaseOnDeletion(t *testing.T, env *containerd.Env) {
	f := newFixture(t, env)
	a := startAgent(t, f.api, nodeA, f.cri.Endpoint)
	p := f.pod(nodeA, "done", 0, "sh", "-c", "sleep 0.3; exit 0")
	id := f.start(p)
	f.waitExited(p, id)
	waitFor(t, "the agent classifying the exit", func() bool {
		return a.metric(t, "coroner_agent_container_exits_total", "verdict=NotOOM") == 1
	})
	time.Sleep(phaseGrace + 500*time.Millisecond)
	if got := f.get(p); writtenByAgent(got) || got.Status.Phase != corev1.PodPending {
		t.Fatalf("phase %q before the deletion (agent wrote: %v)", got.Status.Phase, writtenByAgent(got))
	}

	deleted := time.Now()
	if err := f.client.CoreV1().Pods(f.ns).Delete(f.ctx, "done", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	waitFor(t, "phase Succeeded", func() bool {
		got = f.get(p)
		return got.Status.Phase == corev1.PodSucceeded
	})
	took := time.Since(deleted)
	t.Logf("phase Succeeded %v after the deletion (grace %v)", took.Round(time.Millisecond), phaseGrace)
	// deletionTimestamp has a precision of a second, so the grace may end up to a
	// second early, measured from the deletion call.
	if took < phaseGrace-time.Second {
		t.Errorf("phase written %v after the deletion, before the grace of %v", took, phaseGrace)
	}
	if got.DeletionTimestamp == nil {
		t.Error("the pod lost its deletionTimestamp")
	}
	if !writtenByAgent(got) {
		t.Error("the phase is not the agent's")
	}
	waitFor(t, "the stamp counted", func() bool {
		return a.metric(t, "coroner_agent_stamps_total", "kind=TerminalPhase", "reason=Succeeded") == 1
	})
}

// TestOtherNodeUntouched (f): a pod of another node, OOM-killed on the same containerd,
// is never written by node-a's agent, while node-a's own pod is.
func TestOtherNodeUntouched(t *testing.T) { containerdtest.Each(t, testOtherNodeUntouched) }

func testOtherNodeUntouched(t *testing.T, env *containerd.Env) {
	f := newFixture(t, env)
	a := startAgent(t, f.api, nodeA, f.cri.Endpoint)
	theirs := f.pod(nodeB, "theirs", 20<<20, "/bin/memhog")
	ours := f.pod(nodeA, "ours", 20<<20, "/bin/memhog")
	f.start(theirs)
	f.start(ours)
	f.waitCondition(ours, conditions.OOMKilled)
	waitFor(t, "the other node's events dropped", func() bool {
		return a.metric(t, "coroner_agent_dropped_events_total", "reason=OtherNode") >= 1
	})
	time.Sleep(500 * time.Millisecond)
	got := f.get(theirs)
	if writtenByAgent(got) || len(got.Status.Conditions) != 0 || got.ResourceVersion != theirs.Object.ResourceVersion {
		t.Errorf("node-b's pod was written: conditions %+v, managers %+v", got.Status.Conditions, got.ManagedFields)
	}
}

// TestMissingRuntimeSocket: an agent whose runtime socket does not exist keeps running,
// /readyz answers 503 and says why, /healthz ok (no crash loop), and runtime_connected is
// 0.
func TestMissingRuntimeSocket(t *testing.T) {
	api := apiServer(t)
	a := startAgent(t, api, nodeA, "unix:///tmp/coroner-no-such-dir/containerd.sock")
	var code int
	var body string
	waitFor(t, "/readyz failing", func() bool {
		code, body = a.readyz(t)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "does not exist")
	})
	t.Logf("/readyz: %d %q", code, strings.TrimSpace(body))
	if code, body := a.healthz(t); code != http.StatusOK {
		t.Errorf("/healthz %d %q: a missing socket must not make the kubelet restart the agent", code, body)
	}
	if v := a.metric(t, "coroner_agent_runtime_connected"); v != 0 {
		t.Errorf("runtime_connected = %v", v)
	}
	if v := a.metric(t, "coroner_agent_fenced"); v != 0 {
		t.Errorf("fenced = %v", v)
	}
}

// TestUnreachableAPIServer: agent.Run fails at once, saying so, when the API server does
// not answer at start.
func TestUnreachableAPIServer(t *testing.T) {
	opts := agent.NewOptions()
	opts.NodeName = nodeA
	opts.MetricsAddress = "0"
	cfg := &rest.Config{Host: "https://" + freeAddr(t)}
	_, ctx := ktesting.NewTestContext(t)
	start := time.Now()
	err := agent.Run(ctx, cfg, opts)
	if err == nil || !strings.Contains(err.Error(), "cannot reach the API server") {
		t.Fatalf("Run = %v, want an error saying the API server cannot be reached", err)
	}
	t.Logf("%v after %v", err, time.Since(start).Round(time.Millisecond))
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
