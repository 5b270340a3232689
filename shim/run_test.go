package shim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// TestRunFailsFast checks that Run returns a clear error at once, instead of hanging,
// when the API server cannot be reached or a listen address cannot be bound.
func TestRunFailsFast(t *testing.T) {
	fakeServer := func(withCRD bool) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			switch {
			case r.URL.Path == "/version":
				_, _ = w.Write([]byte(`{"major":"1","minor":"36","gitVersion":"v1.36.3"}`))
			case r.URL.Path == "/apis/coroner.dev/v1alpha1" && withCRD:
				_, _ = w.Write([]byte(`{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"coroner.dev/v1alpha1","resources":[{"name":"jobrecords","singularName":"jobrecord","namespaced":true,"kind":"JobRecord","verbs":["get","create","patch","delete"]}]}`))
			default:
				http.NotFound(w, r)
			}
		}))
	}
	apiserver := fakeServer(true)
	defer apiserver.Close()
	noCRD := fakeServer(false)
	defer noCRD.Close()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	cases := []struct {
		name    string
		host    string
		opts    func(o *Options)
		wantErr string
	}{
		{
			name:    "API server unreachable",
			host:    "http://127.0.0.1:1",
			wantErr: "cannot reach the API server at http://127.0.0.1:1",
		},
		{
			name:    "JobRecord CRD not installed",
			host:    noCRD.URL,
			wantErr: "does not serve coroner.dev/v1alpha1 jobrecords: install the CRD",
		},
		{
			name:    "metrics address in use",
			host:    apiserver.URL,
			opts:    func(o *Options) { o.MetricsAddress = busy.Addr().String() },
			wantErr: "serving metrics",
		},
		{
			name: "health address in use",
			host: apiserver.URL,
			opts: func(o *Options) {
				o.MetricsAddress = "0"
				o.HealthAddress = busy.Addr().String()
			},
			wantErr: "serving health",
		},
	}
	defer func(d time.Duration) { jobRecordsWait = d }(jobRecordsWait)
	jobRecordsWait = 0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := NewOptions()
			if tc.opts != nil {
				tc.opts(opts)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := Run(ctx, &rest.Config{Host: tc.host}, opts)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Run = %v, want an error containing %q", err, tc.wantErr)
			}
			if ctx.Err() != nil {
				t.Errorf("Run took until the test's deadline")
			}
		})
	}
}

// recorder is a klog.LogSink that keeps what it is given, at every verbosity.
type recorder struct {
	mu     *sync.Mutex
	errors *[]string
	infos  *[]string
	inits  *atomic.Int32
}

func newRecorder() recorder {
	return recorder{mu: new(sync.Mutex), errors: new([]string), infos: new([]string), inits: new(atomic.Int32)}
}

func (r recorder) Init(klog.RuntimeInfo)  { r.inits.Add(1) }
func (r recorder) Enabled(level int) bool { return true }
func (r recorder) Info(level int, msg string, kv ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.infos = append(*r.infos, fmt.Sprintf("V(%d) %s %v", level, msg, kv))
}
func (r recorder) Error(err error, msg string, kv ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.errors = append(*r.errors, fmt.Sprintf("%s: %v %v", msg, err, kv))
}
func (r recorder) WithValues(kv ...any) klog.LogSink { return r }
func (r recorder) WithName(string) klog.LogSink      { return r }

func (r recorder) logs() (errs, infos []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(*r.errors), slices.Clone(*r.infos)
}

// TestStandbyLogsNoError races two leader electors for a Lease that neither finds (as two
// replicas of a fresh install do): both create it, one wins. The loser must log no error
// through standbyLogger, and does through the plain logger (else the race was not run).
func TestStandbyLogsNoError(t *testing.T) {
	for _, tc := range []struct {
		name       string
		filtered   bool
		wantErrors bool
	}{
		{name: "through standbyLogger", filtered: true},
		{name: "plain logger (the race happened)", filtered: false, wantErrors: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			// The first two Gets find no Lease: both electors go on to create it.
			var gets atomic.Int32
			client.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
				if gets.Add(1) <= 2 {
					return true, nil, apierrors.NewNotFound(coordinationv1.Resource("leases"), "coroner-shim")
				}
				return false, nil, nil
			})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()

			type replica struct {
				leading, sawLeader atomic.Bool
				rec                recorder
			}
			var replicas [2]*replica
			var wg sync.WaitGroup
			for i := range replicas {
				r := &replica{rec: newRecorder()}
				replicas[i] = r
				id := fmt.Sprintf("replica-%d", i)
				le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
					Lock: &resourcelock.LeaseLock{
						LeaseMeta:  metav1.ObjectMeta{Namespace: "coroner-system", Name: "coroner-shim"},
						Client:     client.CoordinationV1(),
						LockConfig: resourcelock.ResourceLockConfig{Identity: id},
					},
					LeaseDuration: 4 * time.Second,
					RenewDeadline: 2 * time.Second,
					RetryPeriod:   200 * time.Millisecond,
					Callbacks: leaderelection.LeaderCallbacks{
						OnStartedLeading: func(context.Context) { r.leading.Store(true) },
						OnStoppedLeading: func() { r.leading.Store(false) },
						OnNewLeader: func(leader string) {
							if leader != id {
								r.sawLeader.Store(true)
							}
						},
					},
				})
				if err != nil {
					t.Fatal(err)
				}
				logger := klog.New(r.rec)
				if tc.filtered {
					logger = standbyLogger(logger, &r.leading)
				}
				wg.Go(func() { le.Run(klog.NewContext(ctx, logger)) })
			}
			// Until one leads and the other has seen it lead.
			var loser *replica
			for loser == nil {
				switch {
				case ctx.Err() != nil:
					t.Fatal("no leader seen by the other replica within 20s")
				case replicas[0].leading.Load() && replicas[1].sawLeader.Load():
					loser = replicas[1]
				case replicas[1].leading.Load() && replicas[0].sawLeader.Load():
					loser = replicas[0]
				default:
					time.Sleep(20 * time.Millisecond)
				}
			}
			cancel()
			wg.Wait()
			errs, infos := loser.rec.logs()
			if gotErrors := len(errs) > 0; gotErrors != tc.wantErrors {
				t.Errorf("the standby logged errors %q, want errors: %v", errs, tc.wantErrors)
			}
			if tc.filtered && !slices.ContainsFunc(infos, func(s string) bool {
				return strings.HasPrefix(s, "V(2) Another replica got to the leader Lease first") && strings.Contains(s, "already exists")
			}) {
				t.Errorf("the standby did not say at V(2) that it lost the race: %q", infos)
			}
		})
	}
}

// TestStandbyLoggerPassesOtherErrors checks that standbyLogger keeps as errors what is not
// a race with another replica, and a race lost while leading.
func TestStandbyLoggerPassesOtherErrors(t *testing.T) {
	conflict := apierrors.NewConflict(coordinationv1.Resource("leases"), "coroner-shim", errors.New("changed"))
	for _, tc := range []struct {
		name      string
		leading   bool
		err       error
		wantError bool
	}{
		{name: "standby, Conflict", err: conflict},
		{name: "standby, AlreadyExists", err: apierrors.NewAlreadyExists(coordinationv1.Resource("leases"), "coroner-shim")},
		{name: "standby, Forbidden", err: apierrors.NewForbidden(coordinationv1.Resource("leases"), "coroner-shim", errors.New("RBAC")), wantError: true},
		{name: "standby, timeout", err: context.DeadlineExceeded, wantError: true},
		{name: "leader, Conflict", leading: true, err: conflict, wantError: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder()
			var leading atomic.Bool
			leading.Store(tc.leading)
			standbyLogger(klog.New(rec), &leading).WithValues("k", "v").Error(tc.err, "Failed to update lease")
			// Initialising the wrapped sink again would change the original logger's call
			// depth (klog's sink adds to it).
			if n := rec.inits.Load(); n != 1 {
				t.Errorf("the sink was initialised %d times, want once (by its own logger)", n)
			}
			errs, infos := rec.logs()
			if got := len(errs) == 1; got != tc.wantError {
				t.Errorf("errors %q, infos %q: want an error: %v", errs, infos, tc.wantError)
			}
			if len(errs)+len(infos) != 1 {
				t.Errorf("errors %q, infos %q: want one line", errs, infos)
			}
		})
	}
}
