package quarantine

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/conditions"
)

var labelsEverything = labels.Everything()

// FieldManager names the shim's node patches in managedFields.
const FieldManager = "coroner-shim-quarantine"

// maxDeathsNamed bounds the deaths an Event names (the latest), to keep it short.
const maxDeathsNamed = 10

// carryOut does one Action to node (from the cache; nil when it is gone): the taint
// written (or removed) first, then, once that succeeded, the Event and the metrics.
func (c *Controller) carryOut(ctx context.Context, now time.Time, node *corev1.Node, a Action) error {
	if node == nil {
		return nil
	}
	logger := c.logger.WithValues("node", a.Node)
	switch a.Kind {
	case Quarantine:
		t := Taint(a.Cause, now)
		if err := c.patch(ctx, node, &t); err != nil {
			return err
		}
		logger.Info("Quarantined a node", "cause", a.Cause, "deaths", len(a.Deaths))
		c.cfg.Recorder.Event(node, corev1.EventTypeWarning, conditions.ReasonNodeQuarantined, QuarantinedMessage(a, c.cfg.Options))
		c.cfg.Metrics.NodeQuarantines.WithLabelValues(string(a.Cause)).Inc()
	case Spare:
		logger.Info("Spared a node from quarantine: the most nodes are quarantined", "cause", a.Cause, "deaths", len(a.Deaths), "quarantined", a.Holding, "max", a.Max)
		c.cfg.Recorder.Event(node, corev1.EventTypeWarning, conditions.ReasonQuarantineSpared, SparedMessage(a, c.cfg.Options))
		c.cfg.Metrics.NodeQuarantinesSpared.Inc()
		c.mu.Lock()
		if h := c.history[a.Node]; h != nil {
			h.SparedUntil = a.Deaths[len(a.Deaths)-1].At
		}
		c.mu.Unlock()
	case Lift:
		if err := c.patch(ctx, node, nil); err != nil {
			return err
		}
		logger.Info("Lifted a node's quarantine", "quietSince", a.QuietSince)
		c.cfg.Recorder.Event(node, corev1.EventTypeNormal, conditions.ReasonNodeQuarantineLifted, LiftedMessage(a, c.cfg.Options))
		c.cfg.Metrics.NodeQuarantinesLifted.Inc()
	}
	return nil
}

// patch sets or removes node's quarantine taint (conditions.QuarantineTaintPatch): a node
// deleted meanwhile is no error; a node changed meanwhile is (the patch's test fails), and
// the sync is retried on the cache's newer copy.
func (c *Controller) patch(ctx context.Context, node *corev1.Node, taint *corev1.Taint) error {
	body, err := conditions.QuarantineTaintPatch(node, taint)
	if err != nil {
		return err
	}
	_, err = c.client.CoreV1().Nodes().Patch(ctx, node.Name, types.JSONPatchType, body, metav1.PatchOptions{FieldManager: FieldManager})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("patching the taint %s of node %s: %w", conditions.QuarantineTaintKey, node.Name, err)
	}
	return nil
}

// Taint is the quarantine taint for cause, added at now.
func Taint(cause conditions.DisruptionClass, now time.Time) corev1.Taint {
	return corev1.Taint{Key: conditions.QuarantineTaintKey, Value: string(cause), Effect: corev1.TaintEffectNoSchedule, TimeAdded: &metav1.Time{Time: now.Truncate(time.Second)}}
}

// deathList names the deaths, the latest maxDeathsNamed: "ns/pod (device, 15:04:05Z)".
func deathList(deaths []Death) string {
	var b strings.Builder
	if n := len(deaths) - maxDeathsNamed; n > 0 {
		fmt.Fprintf(&b, "%d earlier, ", n)
		deaths = deaths[n:]
	}
	for i, d := range deaths {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (%s, %s)", d.Pod, d.Class, d.At.UTC().Format(time.RFC3339))
	}
	return b.String()
}

// QuarantinedMessage is the message of the NodeQuarantined Event.
func QuarantinedMessage(a Action, o Options) string {
	return fmt.Sprintf("%d pod deaths blamed on this node within %v: %s; tainted %s=%s:NoSchedule (running pods stay); lifted after %v without another, or by hand with coronerctl quarantine lift %s",
		len(a.Deaths), o.Window, deathList(a.Deaths), conditions.QuarantineTaintKey, a.Cause, o.For, a.Node)
}

// SparedMessage is the message of the QuarantineSpared Event.
func SparedMessage(a Action, o Options) string {
	return fmt.Sprintf("Not quarantined though %d pod deaths were blamed on node %s within %v (%s): nodes quarantined already: %d (%s), the most --quarantine-max=%s allows",
		len(a.Deaths), a.Node, o.Window, deathList(a.Deaths), len(a.Holding), strings.Join(a.Holding, ", "), o.Max)
}

// LiftedMessage is the message of the NodeQuarantineLifted Event.
func LiftedMessage(a Action, o Options) string {
	return fmt.Sprintf("Removed the taint %s: no pod death blamed on this node for %v (since %s)",
		conditions.QuarantineTaintKey, o.For, a.QuietSince.UTC().Format(time.RFC3339))
}
