package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/coroner-dev/coroner/test/images"
	"github.com/coroner-dev/coroner/test/lab"
)

// specImages are the images the Job specs name (k8s.io/kubernetes/test/utils/image at v1.36.3), each a
// second name of one of the lab's images, in every node's containerd: the specs' containers
// run busybox's sh, sleep and exit, which busybox:local serves; pause must keep running, so
// it names the lab's sandbox image.
var specImages = []struct{ src, dst string }{
	{images.BusyboxName, "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"},
	{images.PauseName, "registry.k8s.io/pause:3.10.2"},
}

// tagImages tags specImages on every node (idempotent: ctr images tag --force), and waits
// until each node's CRI plugin knows them.
func tagImages(ctx context.Context, cfg lab.Config) error {
	for _, im := range specImages {
		if err := cfg.TagImage(ctx, im.src, im.dst); err != nil {
			return err
		}
	}
	return nil
}

// slowTaint keeps the specs' pods off the VM node (QEMU TCG: its kubelet and containerd
// are 5-10x slower than the process nodes') when the lab did not taint it itself: the e2e
// framework picks nodes among the untainted ones (GetRandomReadySchedulableNode) and the
// scheduler leaves it alone. It is NoSchedule: coroner's agent keeps running there.
var slowTaint = corev1.Taint{Key: "coroner.dev/e2e-upstream", Value: "slow-vm", Effect: corev1.TaintEffectNoSchedule}

// setTaint adds (on) or removes (!on) slowTaint on the node; a missing node is no error
// when removing.
func setTaint(ctx context.Context, cs kubernetes.Interface, node string, on bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			if !on && apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
		i := slices.IndexFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == slowTaint.Key })
		switch {
		case on && i < 0:
			n.Spec.Taints = append(n.Spec.Taints, slowTaint)
		case !on && i >= 0:
			n.Spec.Taints = slices.Delete(n.Spec.Taints, i, i+1)
		default:
			return nil
		}
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// waitE2ENamespacesGone waits until no namespace of the e2e framework's Job specs is left
// (each spec's process deletes its own; the next pass must start on a clean cluster).
func waitE2ENamespacesGone(ctx context.Context, cs kubernetes.Interface, timeout time.Duration) error {
	sel := e2eNamespaceLabel + "=" + e2eNamespaceBase
	var left []string
	err := lab.Poll(ctx, timeout, "the e2e namespaces to be deleted", func() (bool, error) {
		l, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return false, nil
		}
		left = left[:0]
		for _, ns := range l.Items {
			if ns.Name != probeNamespace {
				left = append(left, ns.Name+" ("+string(ns.Status.Phase)+")")
			}
		}
		return len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.Join(left, ", "))
	}
	return nil
}
