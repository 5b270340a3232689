package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/lab"
)

// deviceExit is the code a device storm pod exits with when its test GPU fails (as a
// CUDA program dies when its GPU falls off the bus); a bug of the program exits 1.
const deviceExit = 7

// deviceScript is truthScript for a pod that holds a test GPU: it records its start (and
// its device), watches the device's health file (which the plugin mounts) every 0.2 s for
// RUN_TICKS ticks and exits deviceExit the moment the device is not Healthy; else it exits
// 1 if its index is in FAIL and no attempt of the index failed so before, 0 otherwise.
const deviceScript = `set -u
d=/truth/$JOB/$JOB_COMPLETION_INDEX
mkdir -p $d
f=$d/$POD
g=/run/coroner-test-gpu/$CORONER_TEST_GPU
now() { read u r < /proc/uptime; echo $u; }
echo "start $(now) $NODE $CORONER_TEST_GPU" >> $f
i=0
while [ $i -lt $RUN_TICKS ]; do
  if [ "$(cat $g)" != Healthy ]; then echo "exit 7 $(now)" >> $f; exit 7; fi
  now > $f.beat
  sleep 0.2
  i=$((i+1))
done
code=0
case ",$FAIL," in *",$JOB_COMPLETION_INDEX,"*) if mkdir $d/failed 2>/dev/null; then code=1; fi;; esac
echo "exit $code $(now)" >> $f
exit $code
`

// deviceStorm: a storm Job whose pods each hold a test GPU on the process nodes while
// their devices fail and heal at random (the two of each node, one every 2-4 s, healed
// 2-5 s later, 40 failures in all): a failing device kills the pod that holds it, and a
// pod the scheduler placed on a device that fails before the kubelet admits it is refused
// (UnexpectedAdmissionError). Its rule ignores
// disruptions (backoffLimitPerIndex 1), and some indexes fail once by a bug of their own.
// Nothing may be miscounted: every pod a device killed, or the kubelet refused for its
// device, is stamped DeviceFailure and not counted, every bug counted (the Job's failed count is the bugs' count exactly), no
// index runs twice at once, and the Job completes. A bug whose device failed within the
// agent's window after it (the kubelet reports both in one status) is ambiguous by
// design and only noted.
func deviceStorm(ctx context.Context, e *env, o options) result {
	r := result{Name: "device-storm"}
	st, err := e.stage(ctx, "devices")
	if err != nil {
		return r.fail(err)
	}
	defer func() { st.end(len(r.Problems) > 0) }()
	ns, dir, tr := st.ns, st.dir, st.tr
	nodes := []string{"lab-node-1", "lab-node-2", "lab-node-3"}
	const completions, parallelism = 30, 6
	fail := randomIndexes(e.rng, completions, 0.3)
	j := deviceStormJob(ns, dir, nodes, completions, parallelism, fail)
	if _, err := e.cs.BatchV1().Jobs(ns).Create(ctx, j, metav1.CreateOptions{}); err != nil {
		return r.fail(err)
	}
	defer func() {
		for _, n := range nodes {
			if g, release, err := e.cfg.TestGPUDevices(context.Background(), n); err == nil {
				_, _ = g.Heal(context.Background(), "")
				release()
			}
		}
	}()
	if err := lab.Poll(ctx, 2*time.Minute, "the storm to start", func() (bool, error) {
		return tr.active(j.Name) >= parallelism/2, nil
	}); err != nil {
		return r.fail(err)
	}

	// The faults, until the Job ends.
	fctx, stop := context.WithCancel(ctx)
	var failures []deviceFault
	var fmu sync.Mutex
	done := make(chan error, 1)
	go func() { done <- failDevices(fctx, e, nodes, 40, &fmu, &failures) }()
	jobs, werr := e.waitJobsFinished(ctx, ns, []string{j.Name}, 6*time.Minute)
	stop()
	if err := <-done; err != nil {
		r.problem("failing devices: %v", err)
	}
	if werr != nil {
		r.problem("%v", werr)
	}
	truth, err := readDeviceTruth(dir, j.Name)
	if err != nil {
		return r.fail(err)
	}
	fmu.Lock()
	c := checkDeviceStorm(jobs[j.Name], truth, tr.jobPodsOf(j.Name), failures)
	fmu.Unlock()
	r.add(c, 1)
	r.Pods = len(tr.jobPodsOf(j.Name))
	r.Faults = fmt.Sprintf("%d device failures on %s", len(failures), strings.Join(nodes, ", "))
	return r
}

// deviceFault is one device failure the scenario caused, on the machine's uptime clock.
type deviceFault struct {
	Node, Device string
	At           float64
}

// failDevices fails a random test GPU of the nodes every 2-4 s and heals it 2-5 s later,
// n times or until ctx ends; it records every failure.
func failDevices(ctx context.Context, e *env, nodes []string, n int, mu *sync.Mutex, out *[]deviceFault) error {
	gs := map[string]lab.GPUControl{}
	for _, n := range nodes {
		g, release, err := e.cfg.TestGPUDevices(ctx, n)
		if err != nil {
			return err
		}
		defer release()
		gs[n] = g
	}
	rng := rand.New(rand.NewPCG(e.rng.Uint64(), 37))
	var wg sync.WaitGroup
	defer wg.Wait()
	for range n {
		if err := lab.Sleep(ctx, time.Duration(2000+rng.IntN(2000))*time.Millisecond); err != nil {
			return nil
		}
		n := nodes[rng.IntN(len(nodes))]
		id := fmt.Sprintf("GPU-%d", rng.IntN(lab.TestGPUs))
		u, _ := uptime()
		d, _, err := gs[n].Fail(ctx, id, 0)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("fail %s %s: %w", n, id, err)
		}
		mu.Lock()
		*out = append(*out, deviceFault{Node: n, Device: d.ID, At: u})
		mu.Unlock()
		heal := time.Duration(2000+rng.IntN(3000)) * time.Millisecond
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(heal)
			hctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _ = gs[n].Heal(hctx, d.ID)
		}()
	}
	return nil
}

// deviceStormJob is the storm Job: Indexed, backoffLimitPerIndex 1, Ignore on
// DisruptionTarget, each pod holding one test GPU on one of nodes and recording its truth.
func deviceStormJob(ns, dir string, nodes []string, completions, parallelism int32, fail []int) *batchv1.Job {
	s := stormJob{Name: "gpus", Completions: completions, Parallelism: parallelism, Nodes: nodes, Fail: fail, RunTicks: 1, RerunTicks: 1}
	j := s.job(ns, dir)
	c := &j.Spec.Template.Spec.Containers[0]
	c.Command = []string{"sh", "-c", deviceScript}
	for i := range c.Env {
		if c.Env[i].Name == "RUN_TICKS" {
			c.Env[i].Value = "20" // 4 s
		}
	}
	c.Resources.Limits = corev1.ResourceList{corev1.ResourceName(lab.TestGPUResource): resource.MustParse("1")}
	return j
}

// deviceAttempt is an attempt of deviceScript's, with the device it held.
type deviceAttempt struct {
	attempt
	Device string
}

// readDeviceTruth reads the Job's truth, with each attempt's device (the fourth field of
// its start line).
func readDeviceTruth(root, job string) (map[int][]deviceAttempt, error) {
	t, err := readJobTruth(root, job)
	if err != nil {
		return nil, err
	}
	out := map[int][]deviceAttempt{}
	for ix, as := range t {
		for _, a := range as {
			da := deviceAttempt{attempt: a}
			if b, err := readFirstLine(fmt.Sprintf("%s/%s/%d/%s", root, job, ix, a.Pod)); err == nil {
				if f := strings.Fields(b); len(f) >= 4 {
					da.Device = f[3]
				}
			}
			out[ix] = append(out[ix], da)
		}
	}
	return out, nil
}

// checkDeviceStorm checks the storm Job against its pods' truth and the faults.
func checkDeviceStorm(j *batchv1.Job, truth map[int][]deviceAttempt, pods []*corev1.Pod, faults []deviceFault) jobCheck {
	var c jobCheck
	plain := jobTruth{}
	for ix, as := range truth {
		for _, a := range as {
			plain[ix] = append(plain[ix], a.attempt)
		}
	}
	c.Overlap, c.OverlapIndex = plain.maxOverlap()
	if c.Overlap > 0 {
		c.problem("index %d ran twice at once for %.2fs", c.OverlapIndex, c.Overlap)
	}
	if j == nil {
		c.problem("the Job is gone")
		return c
	}
	if fc := finishedCondition(j); fc == nil || fc.Type != batchv1.JobComplete {
		c.problem("the Job did not complete: %+v (failed %d, failedIndexes %v)", fc, j.Status.Failed, strOrNil(j.Status.FailedIndexes))
	}
	byName := map[string]*corev1.Pod{}
	for _, p := range pods {
		byName[p.Name] = p
	}
	var bugs, deaths, ambiguous, refused int
	var miscounted, unstamped, notes []string
	for _, p := range pods {
		if _, ok := conditions.AdmissionDeviceFailure(p); ok {
			refused++
			if !conditions.IsTrue(&p.Status, conditions.DeviceFailed) {
				unstamped = append(unstamped, fmt.Sprintf("%s (refused by the kubelet: %s)", p.Name, p.Status.Message))
			}
		}
	}
	for ix, as := range truth {
		for _, a := range as {
			if !a.Exited || a.Code == 0 {
				continue
			}
			p := byName[a.Pod]
			stamped := p != nil && conditions.IsTrue(&p.Status, conditions.DeviceFailed)
			switch a.Code {
			case deviceExit:
				deaths++
				if !stamped {
					unstamped = append(unstamped, fmt.Sprintf("%s (index %d, %s on %s)", a.Pod, ix, a.Device, a.Node))
				}
			default:
				bugs++
				if stamped {
					if deviceFailedWithin(faults, a, 12) {
						ambiguous++
						notes = append(notes, fmt.Sprintf("%s (index %d) died of its bug and its device %s failed within the window after: blamed on the device", a.Pod, ix, a.Device))
						continue
					}
					miscounted = append(miscounted, fmt.Sprintf("%s (index %d): a bug stamped DeviceFailed", a.Pod, ix))
				}
			}
		}
	}
	if want := int32(bugs - ambiguous); j.Status.Failed != want {
		if j.Status.Failed > want {
			c.Double += int(j.Status.Failed - want)
		} else {
			c.Lost += int(want - j.Status.Failed)
		}
		c.problem("status.failed %d, want %d: %d bugs (%d of them blamed on a device within the window), %d device deaths", j.Status.Failed, want, bugs, ambiguous, deaths)
	}
	if len(unstamped) > 0 {
		c.problem("%d pods killed by their device without the DeviceFailed stamp: %v", len(unstamped), unstamped)
	}
	if len(miscounted) > 0 {
		c.problem("%v", miscounted)
	}
	c.Notes = append(c.Notes, fmt.Sprintf("%d device deaths and %d pods refused by the kubelet for their device stamped and ignored, %d bugs counted, %d device failures caused", deaths, refused, bugs-ambiguous, len(faults)))
	c.Notes = append(c.Notes, notes...)
	if deaths == 0 {
		c.problem("no pod died of its device: the storm tested nothing")
	}
	return c
}

// deviceFailedWithin reports whether a's device on a's node failed within window seconds
// after a ended.
func deviceFailedWithin(faults []deviceFault, a deviceAttempt, window float64) bool {
	for _, f := range faults {
		if f.Node == a.Node && f.Device == a.Device && f.At >= a.End-0.5 && f.At <= a.End+window {
			return true
		}
	}
	return false
}

// readFirstLine is the first line of a file.
func readFirstLine(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return first, nil
}
