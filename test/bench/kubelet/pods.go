package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/images"
)

// kind is what a bench pod's container does.
type kind string

const (
	// kindExit: restartPolicy OnFailure, exits once with code 3, then sleeps when the
	// kubelet restarts it; coroner records the exit in coroner.dev/exit-history.
	kindExit kind = "exit"
	// kindOOM: restartPolicy Never, memhog over the container's memory limit; coroner
	// stamps coroner.dev/OOMKilled (MemoryLimitExceeded).
	kindOOM kind = "oom"
)

const (
	containerName = "main"
	vmTaintKey    = "lab.coroner.dev/vm"
	benchLabel    = "bench.coroner.dev/p2"
)

// podSpec says how to make one bench pod.
type podSpec struct {
	name, namespace, node string
	kind                  kind
	runFor                time.Duration
	memoryLimit           resource.Quantity
	vm                    bool // tolerate the VM node's taint
}

// newPod builds the pod of s, pinned to its node (no scheduler in the way).
func newPod(s podSpec) *corev1.Pod {
	secs := strconv.FormatFloat(s.runFor.Seconds(), 'f', -1, 64)
	c := corev1.Container{Name: containerName, Image: images.BusyboxName, ImagePullPolicy: corev1.PullNever}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: s.namespace, Labels: map[string]string{benchLabel: string(s.kind)}},
		Spec: corev1.PodSpec{
			NodeName:                      s.node,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			EnableServiceLinks:            ptr.To(false),
			AutomountServiceAccountToken:  ptr.To(false),
		},
	}
	switch s.kind {
	case kindExit:
		// The marker in the emptyDir makes the restarted container sleep: one exit per pod.
		p.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
		c.Command = []string{"sh", "-c", "[ -e /d/ran ] && exec sleep 3600; touch /d/ran; sleep " + secs + "; exit 3"}
		c.VolumeMounts = []corev1.VolumeMount{{Name: "d", MountPath: "/d"}}
		p.Spec.Volumes = []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	case kindOOM:
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		c.Command = []string{"sh", "-c", "sleep " + secs + "; exec memhog"}
		c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: s.memoryLimit}
	}
	p.Spec.Containers = []corev1.Container{c}
	if s.vm {
		p.Spec.Tolerations = []corev1.Toleration{{Key: vmTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	}
	return p
}

// view is what one version of a bench pod says about its measured exit.
type view struct {
	// stamped: coroner's stamp for the pod's kind is there.
	stamped bool
	// wrong says what coroner stamped instead of the expected (an OOM kill taken for
	// a node OOM, a limit OOM with another reason).
	wrong string
	// terminated is the kubelet's report of the measured exit: lastState.terminated,
	// else state.terminated, of the container (there is one exit per pod).
	terminated *corev1.ContainerStateTerminated
	// failed says why the pod failed without the exit it was made for (the kubelet
	// rejected or evicted it).
	failed string
}

// viewOf reads a bench pod of kind k.
func viewOf(p *corev1.Pod, k kind) view {
	var v view
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != containerName {
			continue
		}
		if t := cs.LastTerminationState.Terminated; t != nil {
			v.terminated = t
		} else if t := cs.State.Terminated; t != nil {
			v.terminated = t
		}
	}
	switch k {
	case kindExit:
		if h, err := v1alpha1.ParseExitHistory(p.Annotations[conditions.AnnotationExitHistory]); err == nil && len(h) > 0 {
			v.stamped = true
		}
		if p.Status.Phase == corev1.PodFailed {
			v.failed = failure(p)
		}
	case kindOOM:
		if c := conditions.Find(&p.Status, conditions.OOMKilled); c != nil && c.Status == corev1.ConditionTrue {
			v.stamped = true
			if c.Reason != conditions.ReasonMemoryLimitExceeded {
				v.wrong = fmt.Sprintf("%s reason %s", conditions.OOMKilled, c.Reason)
			}
		}
		if c := conditions.Find(&p.Status, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
			v.wrong = fmt.Sprintf("%s %s", corev1.DisruptionTarget, c.Reason)
		}
		if p.Status.Phase == corev1.PodFailed && (p.Status.Reason != "" || v.terminated == nil) {
			v.failed = failure(p)
		}
	}
	if v.terminated != nil && k == kindOOM && v.failed == "" && v.terminated.ExitCode != 137 {
		v.failed = fmt.Sprintf("container ended %s (exit %d), not killed", v.terminated.Reason, v.terminated.ExitCode)
	}
	return v
}

func failure(p *corev1.Pod) string {
	s := strings.TrimSpace(p.Status.Reason + ": " + p.Status.Message)
	if s == ":" {
		return "pod Failed"
	}
	return s
}
