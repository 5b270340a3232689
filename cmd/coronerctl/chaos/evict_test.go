package chaos

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes/fake"
)

func TestFakeEvict(t *testing.T) {
	fastClusterTimings(t)
	cases := []struct {
		name         string
		pod          string // the pod asked for; the fake holds default/foo on lab-node-2
		refuse       int
		fail         error
		timeout      time.Duration // of ctx; zero for none
		wantErr      string
		wantRequests int
		wantOut      []string
		wantGone     bool
	}{
		{
			name: "accepted", pod: "foo", wantRequests: 1, wantGone: true,
			wantOut: []string{"evict: requested eviction of default/foo (node lab-node-2)\n"},
		},
		{
			name: "refused twice by a budget, then accepted", pod: "foo", refuse: 2, wantRequests: 3, wantGone: true,
			wantOut: []string{
				"evict: default/foo: eviction refused for now (Cannot evict pod as it would violate the pod's disruption budget.); retrying every 10ms\n",
				"evict: requested eviction of default/foo (node lab-node-2)\n",
			},
		},
		{
			name: "refused until ctx ends", pod: "foo", refuse: 1 << 30, timeout: 50 * time.Millisecond,
			wantErr: "evicting pod default/foo: gave up (context deadline exceeded) while the eviction was refused: Cannot evict pod",
		},
		{name: "missing pod", pod: "bar", wantErr: "pod default/bar not found"},
		{
			name: "refused for another reason", pod: "foo", wantRequests: 1,
			fail:    apierrors.NewForbidden(podResource.GroupResource(), "foo", fixedError("not allowed")),
			wantErr: `evicting pod default/foo: pods "foo" is forbidden: not allowed`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset(fakePod("default", "foo", "lab-node-2"))
			f := &fakeEvictions{cs: cs, refuse: map[string]int{"foo": tc.refuse}, fail: map[string]error{"foo": tc.fail}}
			f.install(t)
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			var out bytes.Buffer
			undo, err := Evict(ctx, cs, &out, "default", tc.pod)
			t.Logf("output:\n%s", out.String())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Evict error = %v, want one containing %q", err, tc.wantErr)
				}
			} else {
				if err != nil {
					t.Fatalf("Evict: %v", err)
				}
				if undo != evictUndo {
					t.Errorf("undo = %q, want %q", undo, evictUndo)
				}
			}
			if tc.wantRequests > 0 && len(f.evictionRequests()) != tc.wantRequests {
				t.Errorf("eviction requests = %v, want %d", f.evictionRequests(), tc.wantRequests)
			}
			if got := out.String(); got != strings.Join(tc.wantOut, "") && tc.wantErr == "" {
				t.Errorf("output = %q, want %q", got, strings.Join(tc.wantOut, ""))
			}
			if gone := !fakeHasPod(t, cs, "default", "foo"); gone != tc.wantGone {
				t.Errorf("default/foo gone = %t, want %t", gone, tc.wantGone)
			}
		})
	}
}

// fixedError is an error with a fixed text.
type fixedError string

func (e fixedError) Error() string { return string(e) }
