package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/test/bench/measure"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/host"
)

// A controller under test as the benchmark drives it.
type controllerUnderTest interface {
	// snapshot reads the controller's request counters.
	snapshot(ctx context.Context) (calls, error)
	// synced reports whether the controller's caches have synced.
	synced(ctx context.Context) (bool, error)
	// cpu is the CPU time the controller's process used so far; ok is false when it
	// cannot be told apart (coroner in this process).
	cpu() (d time.Duration, ok bool)
	// exited is closed with an error when the controller stopped on its own.
	exited() <-chan error
	// pid is the controller's process; 0 when it runs in this process.
	pid() int
	// heapProfile is the controller process's heap profile (pprof format).
	heapProfile(ctx context.Context) ([]byte, error)
	stop()
}

// The ways to run coroner's controller (--coroner).
const (
	coronerProcess   = "process"
	coronerInProcess = "in-process"
)

// startCoroner runs coroner's controllers, shim.NewControllers(ctx, client,
// shim.Config{Jobs: controller.Config{Workers}}).Run with
// the client's requests counted by a RoundTripper, in this process or in a child
// process of its own (this program again, see childMain).
func startCoroner(api *harness.Env, c config) (controllerUnderTest, error) {
	if c.coroner == coronerInProcess {
		return startCoronerHere(api.Config, c.qps, c.burst, c.workers, !c.noJobRecords)
	}
	return startCoronerChild(api, c)
}

// inProcess is coroner's controller running in this process.
type inProcess struct {
	ctrl    *shim.Controllers
	counter *callCounter
	cancel  context.CancelFunc
	done    chan error
	exit    chan error
}

func startCoronerHere(base *rest.Config, qps float64, burst, workers int, jobRecords bool) (*inProcess, error) {
	counter := newCallCounter()
	// As coroner-shim builds them (shim.Run): one rate limiter for all, the pods decoded
	// by shim/podwire, the pod patches answered with metadata; with --job-records (on by
	// default), the JobRecords' writes are counted with the rest of the controller's calls.
	clients, err := shim.NewClients(clientConfig(base, conditions.ShimComponent, float32(qps), burst, counter.wrap), jobRecords, 0)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &inProcess{
		ctrl:    shim.NewControllers(ctx, clients.Kube, shim.Config{Jobs: controller.Config{Workers: workers, Records: clients.Records, PodMetadata: clients.PodMetadata}}),
		counter: counter,
		cancel:  cancel,
		done:    make(chan error, 1),
		exit:    make(chan error, 1),
	}
	go func() {
		err := p.ctrl.Run(ctx)
		if ctx.Err() == nil {
			p.exit <- fmt.Errorf("coroner's controller stopped: %v", err)
		}
		p.done <- err
	}()
	return p, nil
}

func (p *inProcess) snapshot(ctx context.Context) (calls, error) { return p.counter.snapshot(ctx) }
func (p *inProcess) synced(context.Context) (bool, error)        { return p.ctrl.HasSynced(), nil }
func (p *inProcess) cpu() (time.Duration, bool)                  { return 0, false }
func (p *inProcess) exited() <-chan error                        { return p.exit }
func (p *inProcess) pid() int                                    { return 0 }

func (p *inProcess) heapProfile(context.Context) ([]byte, error) {
	var b bytes.Buffer
	runtime.GC()
	err := pprof.Lookup("heap").WriteTo(&b, 0)
	return b.Bytes(), err
}

func (p *inProcess) stop() {
	p.cancel()
	select {
	case err := <-p.done:
		if err != nil { // stopped before its caches synced
			fmt.Fprintf(os.Stderr, "bench-shim: coroner's controller stopped: %v\n", err)
		}
	case <-time.After(30 * time.Second):
		fmt.Fprintln(os.Stderr, "bench-shim: coroner's controller did not stop within 30s")
	}
}

// childEnv names the environment variable that makes this program the child process
// that runs coroner's controller; its value is the childSpec in JSON.
const childEnv = "CORONER_BENCH_SHIM_CHILD"

type childSpec struct {
	Kubeconfig string  `json:"kubeconfig"`
	QPS        float64 `json:"qps"`
	Burst      int     `json:"burst"`
	Workers    int     `json:"workers"`
	JobRecords bool    `json:"jobRecords"`
	LogFile    string  `json:"logFile"`
	LogV       int     `json:"logV"`
	// ProfileDir, when set, receives coroner-cpu.pprof, the CPU profile of the process's
	// whole life.
	ProfileDir string `json:"profileDir"`
}

// childMain is the child process: coroner's controller with counted requests, and an
// HTTP server on 127.0.0.1 whose address it prints as its first line of output:
// GET /calls answers the counters, GET /synced whether the caches synced. It stops on
// SIGTERM or when its standard input closes (the parent is gone).
func childMain(spec string) int {
	var s childSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		fmt.Fprintf(os.Stderr, "bench-shim child: bad %s: %v\n", childEnv, err)
		return 2
	}
	measure.QuietKlog(s.LogFile, s.LogV)
	defer klog.Flush()
	stopProfile := func() {}
	if s.ProfileDir != "" {
		stop, err := startProfiles(s.ProfileDir)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench-shim child: %v\n", err)
			return 1
		}
		stopProfile = sync.OnceFunc(stop)
		defer stopProfile()
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-shim child: %v\n", err)
		return 1
	}
	p, err := startCoronerHere(cfg, s.QPS, s.Burst, s.Workers, s.JobRecords)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-shim child: %v\n", err)
		return 1
	}
	defer p.stop()
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	mux := http.NewServeMux()
	mux.HandleFunc("/calls", func(w http.ResponseWriter, r *http.Request) {
		c, _ := p.snapshot(r.Context())
		var out []callSample
		for k, v := range c {
			out = append(out, callSample{Method: k.method, Code: k.code, N: v})
		}
		_ = json.NewEncoder(w).Encode(out)
	})
	mux.HandleFunc("/debug/pprof/heap", func(w http.ResponseWriter, _ *http.Request) {
		runtime.GC()
		_ = pprof.Lookup("heap").WriteTo(w, 0)
	})
	mux.HandleFunc("/debug/cpu-stop", func(w http.ResponseWriter, _ *http.Request) {
		stopProfile() // the parent asks at the end of the round: the process may not get to its defers
		// A failed write is the asking parent's error to see.
		_, _ = fmt.Fprint(w, true)
	})
	mux.HandleFunc("/synced", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprint(w, p.ctrl.HasSynced()) // a failed write is the asking parent's error
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-shim child: %v\n", err)
		return 1
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }() // at the child's exit
	fmt.Println(ln.Addr().String())
	select {
	case <-ctx.Done():
		return 0
	case err := <-p.exit:
		fmt.Fprintf(os.Stderr, "bench-shim child: %v\n", err)
		return 1
	}
}

type callSample struct {
	Method string `json:"method"`
	Code   string `json:"code"`
	N      int64  `json:"n"`
}

// childProcess is coroner's controller in a child process.
type childProcess struct {
	proc  *host.Process
	base  string
	stdin io.Closer
	http  *http.Client
	exit  chan error
	// stopping is set by stop, so that the exit is not reported as a failure.
	stopping atomic.Bool
}

func startCoronerChild(api *harness.Env, c config) (*childProcess, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	spec, err := json.Marshal(childSpec{Kubeconfig: api.Kubeconfig, QPS: c.qps, Burst: c.burst, Workers: c.workers, JobRecords: !c.noJobRecords, LogFile: c.logFile, LogV: c.logV, ProfileDir: c.profileDir})
	if err != nil {
		return nil, err
	}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	cmd.Stdin, cmd.Stdout = stdinR, stdoutW
	proc, err := host.StartCommand(api.Dir, "coroner-shim", cmd)
	// The child's ends: it has its own descriptors of them. Closing pipes loses nothing.
	_ = stdinR.Close()
	_ = stdoutW.Close()
	if err != nil {
		_ = stdinW.Close()
		_ = stdoutR.Close()
		return nil, err
	}
	cp := &childProcess{proc: proc, stdin: stdinW, http: &http.Client{Timeout: 10 * time.Second}, exit: make(chan error, 1)}
	line := make(chan string, 1)
	go func() {
		defer func() { _ = stdoutR.Close() }() // read only
		s, _ := bufio.NewReader(stdoutR).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case addr := <-line:
		if addr == "" {
			cp.stop()
			return nil, fmt.Errorf("coroner's controller process exited during start-up\n%s", proc.LogTail(4000))
		}
		cp.base = "http://" + addr
	case <-time.After(30 * time.Second):
		cp.stop()
		return nil, fmt.Errorf("coroner's controller process did not start within 30s\n%s", proc.LogTail(4000))
	}
	go func() {
		<-proc.Done()
		if !cp.stopping.Load() {
			cp.exit <- fmt.Errorf("coroner's controller process exited: %v\n%s", proc.Err(), proc.LogTail(4000))
		}
	}()
	return cp, nil
}

func (cp *childProcess) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := cp.http.Do(req)
	if err != nil {
		return fmt.Errorf("asking coroner's controller process: %w", err)
	}
	defer func() { _ = resp.Body.Close() }() // read only
	return json.NewDecoder(resp.Body).Decode(v)
}

func (cp *childProcess) snapshot(ctx context.Context) (calls, error) {
	var samples []callSample
	if err := cp.get(ctx, "/calls", &samples); err != nil {
		return nil, err
	}
	c := calls{}
	for _, s := range samples {
		c[callKey{s.Method, s.Code}] = s.N
	}
	return c, nil
}

func (cp *childProcess) synced(ctx context.Context) (bool, error) {
	var ok bool
	err := cp.get(ctx, "/synced", &ok)
	return ok, err
}

func (cp *childProcess) cpu() (time.Duration, bool) { return measure.CPUTime(cp.proc.PID()) }
func (cp *childProcess) exited() <-chan error       { return cp.exit }
func (cp *childProcess) pid() int                   { return cp.proc.PID() }

func (cp *childProcess) heapProfile(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.base+"/debug/pprof/heap", nil)
	if err != nil {
		return nil, err
	}
	resp, err := cp.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }() // read only
	return io.ReadAll(resp.Body)
}

func (cp *childProcess) stop() {
	cp.stopping.Store(true)
	_ = cp.stdin.Close() // its EOF asks the child to stop; Stop makes sure it does
	cp.proc.Stop(30 * time.Second)
}

// startProfiles starts the CPU profile of this process into dir; stop ends it.
func startProfiles(dir string) (stop func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(dir, "coroner-cpu.pprof"))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close() // nothing written
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "bench-shim child: CPU profile %s: %v\n", f.Name(), err)
		}
	}, nil
}
