// Package shim_test runs coroner's shim Job controller (package shim/controller, with
// node-failure recovery beside it, as shim.NewControllers wires them) against a
// real kube-apiserver v1.36.3 and checks the scenarios of issue 3 end to end: pod failure
// policy (S3), backoffLimit and backoffLimitPerIndex with their delays (S4-S6),
// podReplacementPolicy (S7), suspend/resume, activeDeadlineSeconds, successPolicy and plain
// completions (S2), restarts of the shim, and that Jobs it does not manage are left alone (S1).
//
// There is no scheduler and no kubelet. The test plays the kubelet (kubelet_test.go): it
// writes pod status through the status subresource (Running/Ready, Succeeded, Failed with
// container exit codes and finish times, DisruptionTarget conditions) and deletes pods. An
// unscheduled pod is deleted at once by the API server, but a pod with the Job tracking
// finalizer stays, with a deletionTimestamp, until the controller removes the finalizer; a
// pod the test bound to a (nonexistent) node is deleted gracefully and stays terminating
// until the test, as its kubelet, finishes it.
//
// Every test works in its own namespace with its own controller, and hands its Jobs to that
// controller with its own spec.managedBy value ("coroner.dev/t<N>"), so the controllers of
// parallel tests never see each other's Jobs. What a test observes comes from a watch of
// its namespace (observe_test.go), which also checks, on every event, invariants that must
// hold at all times (never more active pods than parallelism, at most one active pod per
// index, counters that never go down, terminal conditions only after the interim ones and
// only once no pod is terminating).
//
// CORONER_SHIM_TARGET=builtin runs the same scenarios against the built-in Job controller
// of kube-controller-manager v1.36.3 (Jobs without managedBy) instead of coroner: that is
// how the expectations written here were checked against the reference. The built-in
// controller's backoff is 10s doubling, so that run takes several minutes; the restart and
// managedBy scenarios do not apply to it.
package shim_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/coroner-dev/coroner/shim"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/wrappers"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// builtinTarget is true when CORONER_SHIM_TARGET=builtin: the scenarios then drive the
// built-in Job controller instead of coroner's.
var builtinTarget = os.Getenv("CORONER_SHIM_TARGET") == "builtin"

const (
	// batchPeriod is the controller's pod event batching in these tests.
	batchPeriod = 50 * time.Millisecond
	// pollInterval is how often waits look at the watched state.
	pollInterval = 75 * time.Millisecond
)

// fastBackoff is the replacement delay of the tests' controllers unless a test sets its
// own: short, so that replacements do not take the default 10s.
var fastBackoff = backoff.Policy{Base: 200 * time.Millisecond, Max: 5 * time.Second}

var managedBySeq atomic.Int32

// nextManagedBy returns a managedBy value no other test of this run uses.
func nextManagedBy() string {
	return fmt.Sprintf("coroner.dev/t%d", managedBySeq.Add(1))
}

// fixture is one test's namespace, controller and watch.
type fixture struct {
	t       *testing.T
	env     *harness.Env
	client  kubernetes.Interface
	ns      string
	builtin bool
	// cfg is the coroner controllers' config (Jobs.ManagedBy is the value the fixture's
	// Jobs carry); unused under the built-in controller.
	cfg shim.Config
	// shimClient is the typed client of coroner's controllers (newShimClients); nil under
	// the built-in controller.
	shimClient kubernetes.Interface
	// backoff is the replacement delay policy in effect: cfg.Jobs.Backoff, or the built-in
	// controller's 10s doubling.
	backoff backoff.Policy
	mirror  *mirror

	mu      sync.Mutex
	running bool
	stopFn  func()
}

// newFixture starts a controller of the package's target (coroner unless
// CORONER_SHIM_TARGET=builtin) for a new namespace. Zero fields of cfg get the tests'
// defaults: a fresh managedBy value, BatchPeriod 50ms, fastBackoff, 2 workers, the real
// clock; node-failure recovery has its package's defaults (see newShimFixture).
func newFixture(t *testing.T, cfg controller.Config) *fixture {
	t.Helper()
	return newShimFixture(t, shim.Config{Jobs: cfg})
}

// newShimFixture is newFixture with the configuration of both of coroner's controllers and
// their informers. Zero fields of cfg.Jobs get newFixture's defaults; an empty
// cfg.Informers.OtherPodsNamespace is the test's namespace.
func newShimFixture(t *testing.T, cfg shim.Config) *fixture {
	t.Helper()
	return newFixtureFor(t, builtinTarget, cfg)
}

// newFixtureFor is newShimFixture with the target chosen by the caller: the built-in Job
// controller when builtin is true, else coroner's.
func newFixtureFor(t *testing.T, builtin bool, cfg shim.Config) *fixture {
	t.Helper()
	env := harness.Shared(t)
	f := &fixture{
		t:       t,
		env:     env,
		client:  newClient(env, "coroner-shim-integration-test"),
		ns:      env.Namespace(t),
		builtin: builtin,
	}
	f.mirror = startMirror(t, f.client, f.ns)
	if builtin {
		f.backoff = backoff.Default
	} else {
		if cfg.Jobs.ManagedBy == "" {
			cfg.Jobs.ManagedBy = nextManagedBy()
		}
		if cfg.Jobs.BatchPeriod == 0 {
			cfg.Jobs.BatchPeriod = batchPeriod
		}
		if cfg.Jobs.Backoff == (backoff.Policy{}) {
			cfg.Jobs.Backoff = fastBackoff
		}
		if cfg.Informers.OtherPodsNamespace == "" {
			// Recovery of pods that are not of managed Jobs stays in the test's namespace:
			// the controllers of parallel tests share the API server.
			cfg.Informers.OtherPodsNamespace = f.ns
		}
		if cfg.Jobs.Workers == 0 {
			cfg.Jobs.Workers = 2
		}
		if cfg.Jobs.Clock == nil {
			cfg.Jobs.Clock = clock.RealClock{}
		}
		// The clients as deployed (shim.NewClients): pods decoded by shim/podwire, pod
		// patches answered with metadata, the JobRecords (the harness installs their CRD).
		clients := newShimClients(t, env, cfg.Jobs.Records.MaxPods)
		f.shimClient = clients.Kube
		if cfg.Jobs.Records.Client == nil {
			cfg.Jobs.Records = clients.Records
		}
		if cfg.Jobs.PodMetadata == nil {
			cfg.Jobs.PodMetadata = clients.PodMetadata
		}
		f.backoff = cfg.Jobs.Backoff
	}
	f.cfg = cfg
	f.startController()
	// Cleanups run last-in first-out: the final checks run while the controller and the
	// watch are still up; then the controller stops, then the watch, then the namespace
	// goes.
	t.Cleanup(func() { f.stopController() })
	t.Cleanup(f.finalChecks)
	return f
}

func newClient(env *harness.Env, userAgent string) kubernetes.Interface {
	cfg := rest.CopyConfig(env.Config)
	cfg.UserAgent = userAgent
	return kubernetes.NewForConfigOrDie(cfg)
}

// newShimClients builds the clients of the shim under test as coroner-shim builds them
// (shim.NewClients), with the JobRecords' (maxPods is their RecordsConfig.MaxPods).
func newShimClients(t testing.TB, env *harness.Env, maxPods int) *shim.Clients {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.UserAgent = "coroner-shim"
	clients, err := shim.NewClients(cfg, true, maxPods)
	if err != nil {
		t.Fatalf("building the shim's clients: %v", err)
	}
	return clients
}

func (f *fixture) target() string {
	if f.builtin {
		return "the built-in Job controller"
	}
	return "coroner's shim"
}

// startController starts the fixture's controller: a new coroner controller, or a hold on
// the shared built-in one.
func (f *fixture) startController() {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.running {
		f.t.Fatal("startController: the controller is already running")
	}
	if f.builtin {
		f.stopFn = holdBuiltin(f.t, f.env)
	} else {
		f.stopFn = startShim(f.t, f.shimClient, f.cfg)
	}
	f.running = true
}

// stopController stops the fixture's controller (for the built-in one: releases this
// test's hold; it stops when no test holds it).
func (f *fixture) stopController() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.running {
		return
	}
	f.stopFn()
	f.running = false
}

// startShim runs shim.NewControllers(client, cfg).Run (the Job controller and node-failure
// recovery, as coroner-shim runs them) in a goroutine until the returned stop function is
// called (also at the end of the test). Run returning before stop, or not returning within
// 30s of its context being cancelled, fails the test.
func startShim(t *testing.T, client kubernetes.Interface, cfg shim.Config) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := shim.NewControllers(ctx, client, cfg)
	done := make(chan error, 1)
	go func() {
		err := c.Run(ctx)
		if ctx.Err() == nil {
			t.Errorf("controller (managedBy %q): Run returned before it was stopped: %v", cfg.Jobs.ManagedBy, err)
		}
		done <- err
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("controller (managedBy %q): Run returned %v after its context was cancelled, want nil", cfg.Jobs.ManagedBy, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("controller (managedBy %q): Run did not return within 30s after its context was cancelled", cfg.Jobs.ManagedBy)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// builtinJC is the shared kube-controller-manager running the built-in Job controller.
// Only one may run per API server; tests that need it hold it (gate read-locked), the one
// test that needs it stopped takes the gate exclusively.
var builtinJC struct {
	gate  sync.RWMutex
	mu    sync.Mutex
	users int
	stop  func()
}

// holdBuiltin makes sure the built-in Job controller runs until the returned release is
// called (also at the end of the test).
func holdBuiltin(t *testing.T, env *harness.Env) (release func()) {
	t.Helper()
	builtinJC.gate.RLock()
	builtinJC.mu.Lock()
	if builtinJC.users == 0 {
		stop, err := env.StartControllerManager("job")
		if err != nil {
			builtinJC.mu.Unlock()
			builtinJC.gate.RUnlock()
			t.Fatalf("starting the built-in Job controller: %v", err)
		}
		builtinJC.stop = stop
	}
	builtinJC.users++
	builtinJC.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			builtinJC.mu.Lock()
			builtinJC.users--
			if builtinJC.users == 0 {
				builtinJC.stop()
				builtinJC.stop = nil
			}
			builtinJC.mu.Unlock()
			builtinJC.gate.RUnlock()
		})
	}
	t.Cleanup(release)
	return release
}

// withoutBuiltin waits until the built-in Job controller is stopped and keeps it stopped
// until the end of the test.
func withoutBuiltin(t *testing.T) {
	builtinJC.gate.Lock()
	t.Cleanup(builtinJC.gate.Unlock)
}

// createJob creates the Job built by w in the fixture's namespace, handed to the fixture's
// controller (spec.managedBy set for coroner, left unset for the built-in controller), and
// tracks it in the watch.
func (f *fixture) createJob(w *wrappers.JobWrapper) *batchv1.Job {
	f.t.Helper()
	job := w.Obj().DeepCopy()
	job.Namespace = f.ns
	job.Spec.ManagedBy = nil
	if !f.builtin {
		mb := f.cfg.Jobs.ManagedBy
		job.Spec.ManagedBy = &mb
	}
	created, err := f.client.BatchV1().Jobs(f.ns).Create(context.Background(), job, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatalf("creating Job %s: %v", job.Name, err)
	}
	f.mirror.track(created)
	f.t.Logf("created Job %s/%s for %s", f.ns, created.Name, f.target())
	return created
}

// replacementWait is how long a wait for a pod replacing the n-th consecutive failure may
// take: the backoff in effect plus a margin for syncs and a loaded machine.
func (f *fixture) replacementWait(n int) time.Duration {
	return f.backoff.Delay(n) + 20*time.Second
}

// settle is the timeout of waits that involve no backoff.
const settle = 20 * time.Second
