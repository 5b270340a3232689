package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/coroner-dev/coroner/test/lab"
)

// followLogs copies the log of every coroner container that runs during the suite, from
// its start, into dir (one file per pod, container and restart): the suite kills, rolls
// and replaces coroner's pods on purpose, and a replaced pod's log is gone with it, while
// a finding such as a pod left unstamped is explained only by the log of the agent that
// ran then. It returns when ctx is done; wait for the copies with the returned function.
func (e *env) followLogs(ctx context.Context, dir string) (wait func()) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	started := map[string]bool{} // container IDs followed
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.logf("chaos: no copies of coroner's logs: %v", err)
		return func() {}
	}
	follow := func(p *corev1.Pod) {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.ContainerID == "" || cs.State.Running == nil {
				continue
			}
			mu.Lock()
			seen := started[cs.ContainerID]
			started[cs.ContainerID] = true
			mu.Unlock()
			if seen {
				continue
			}
			name := fmt.Sprintf("%s_%s_%d.log", p.Name, cs.Name, cs.RestartCount)
			ns, pod, container := p.Namespace, p.Name, cs.Name
			wg.Go(func() { e.copyLog(ctx, filepath.Join(dir, name), ns, pod, container) })
		}
	}
	lw := cache.NewListWatchFromClient(e.cs.CoreV1().RESTClient(), "pods", lab.ShimNamespace, fields.Everything())
	inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { follow(obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { follow(obj.(*corev1.Pod)) },
	})
	wg.Go(func() { inf.Run(ctx.Done()) })
	return wg.Wait
}

// copyLog streams one container's log into path until the container ends or ctx is
// done; a stream cut short (an API server restart) is taken up again from where it
// stopped, by time.
func (e *env) copyLog(ctx context.Context, path, ns, pod, container string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		e.logf("chaos: copy of %s/%s: %v", pod, container, err)
		return
	}
	defer f.Close()
	var since *metav1.Time
	for ctx.Err() == nil {
		opts := &corev1.PodLogOptions{Container: container, Follow: true, Timestamps: true, SinceTime: since}
		rc, err := e.cs.CoreV1().Pods(ns).GetLogs(pod, opts).Stream(ctx)
		if err == nil {
			_, _ = io.Copy(f, rc)
			rc.Close()
		}
		now := metav1.NewTime(time.Now())
		since = &now
		// Ended for good when the container is no longer running.
		p, gerr := e.cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if gerr != nil || !running(p, container) {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func running(p *corev1.Pod, container string) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == container {
			return cs.State.Running != nil
		}
	}
	return false
}
