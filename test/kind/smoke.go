package kind

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Smoke checks the cluster Up made, in about a minute: a Job handed to coroner-shim whose
// index 1 exits 42 under a FailIndex rule fails with failedIndexes "1" (the pods resolve
// the API server's Service name through CoreDNS and kube-proxy, across nodes), and a pod
// OOM-killed at its own 32Mi limit on a worker is stamped coroner.dev/OOMKilled
// (MemoryLimitExceeded) by that node's agent; the stamp's delay after the container
// finished is reported. It is not the e2e suite (test/e2e): it proves the lab works.
func (c Config) Smoke(ctx context.Context) error {
	ns := "coroner-smoke"
	if _, err := c.kubectl(ctx, "delete", "namespace", ns, "--ignore-not-found", "--wait=true"); err != nil {
		return err
	}
	if _, err := c.kubectl(ctx, "create", "namespace", ns); err != nil {
		return err
	}
	defer func() {
		// The next Smoke deletes it first: say so, the check's result stands.
		if _, err := c.kubectl(ctx, "delete", "namespace", ns, "--wait=false"); err != nil {
			c.say("deleting namespace %s: %v", ns, err)
		}
	}()
	if err := waitFor(ctx, time.Minute, time.Second, "default ServiceAccount", func() (bool, error) {
		_, err := c.kubectl(ctx, "-n", ns, "get", "serviceaccount", "default")
		return err == nil, err
	}); err != nil {
		return err
	}
	manifests := `apiVersion: batch/v1
kind: Job
metadata: {name: failindex, namespace: ` + ns + `}
spec:
  managedBy: coroner.dev/shim
  completionMode: Indexed
  completions: 2
  parallelism: 2
  backoffLimitPerIndex: 1
  podFailurePolicy:
    rules:
    - action: FailIndex
      onExitCodes: {containerName: main, operator: In, values: [42]}
    - action: Ignore
      onPodConditions: [{type: DisruptionTarget}]
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: busybox:local
        imagePullPolicy: Never
        command: ["sh", "-c", "nslookup kubernetes.default.svc.cluster.local >/dev/null || exit 3; [ \"$JOB_COMPLETION_INDEX\" != 1 ] || exit 42"]
---
apiVersion: v1
kind: Pod
metadata: {name: limit-oom, namespace: ` + ns + `}
spec:
  restartPolicy: Never
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: []
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions: [{key: node-role.kubernetes.io/control-plane, operator: DoesNotExist}]
  containers:
  - name: main
    image: busybox:local
    imagePullPolicy: Never
    command: ["/bin/memhog"]
    resources: {limits: {memory: 32Mi}}
`
	if err := c.run(ctx, strings.NewReader(manifests), c.bin("kubectl"), "--kubeconfig", c.Kubeconfig(), "apply", "-f", "-"); err != nil {
		return err
	}
	if err := waitFor(ctx, 2*time.Minute, 2*time.Second, "Job failindex Failed with failedIndexes 1", func() (bool, error) {
		out, err := c.kubectl(ctx, "-n", ns, "get", "job", "failindex", "-o",
			`jsonpath={.status.failedIndexes}/{.status.conditions[?(@.type=="Failed")].reason}/{.status.succeeded}`)
		if err != nil {
			return false, err
		}
		if out == "1/FailedIndexes/1" {
			return true, nil
		}
		return false, fmt.Errorf("failedIndexes/Failed reason/succeeded = %q", out)
	}); err != nil {
		return err
	}
	c.say("smoke: Job failindex failed index 1 (rule FailIndex), index 0 succeeded")
	return waitFor(ctx, 2*time.Minute, time.Second, "pod limit-oom stamped coroner.dev/OOMKilled", func() (bool, error) {
		out, err := c.kubectl(ctx, "-n", ns, "get", "pod", "limit-oom", "-o", "json")
		if err != nil {
			return false, err
		}
		var p struct {
			Spec   struct{ NodeName string }
			Status struct {
				Conditions []struct {
					Type, Status, Reason string
					LastTransitionTime   time.Time
				}
				ContainerStatuses []struct {
					State struct {
						Terminated *struct {
							Reason     string
							FinishedAt time.Time
						}
					}
				}
			}
		}
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			return false, err
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == "coroner.dev/OOMKilled" && cond.Status == "True" {
				msg := fmt.Sprintf("smoke: pod limit-oom on %s stamped coroner.dev/OOMKilled (%s)", p.Spec.NodeName, cond.Reason)
				if cs := p.Status.ContainerStatuses; len(cs) == 1 && cs[0].State.Terminated != nil {
					msg += fmt.Sprintf(", kubelet says %s; condition dated %s after finishedAt (1 s resolution)",
						cs[0].State.Terminated.Reason, cond.LastTransitionTime.Sub(cs[0].State.Terminated.FinishedAt))
				}
				c.say("%s", msg)
				return cond.Reason == "MemoryLimitExceeded", fmt.Errorf("reason %s", cond.Reason)
			}
		}
		return false, fmt.Errorf("no coroner.dev/OOMKilled condition yet")
	})
}
