package shim

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/shim/podwire"
)

// Clients are the API clients of coroner-shim's two controllers. Build them with
// NewClients; Run does.
type Clients struct {
	// Kube is the typed client: protobuf, as kube-controller-manager's, with pods decoded
	// by shim/podwire (in place, without managedFields).
	Kube kubernetes.Interface
	// PodMetadata carries the Job controller's pod patches, answered with the pod's
	// metadata alone (controller.Config.PodMetadata).
	PodMetadata metadata.Interface
	// Records is where the JobRecords go (RecordsConfig); zero without them.
	Records controller.RecordsConfig
}

// NewClients builds the controllers' clients from cfg, with the JobRecords' when
// jobRecords is set (maxPods is controller.RecordsConfig.MaxPods). They share one rate
// limiter, so that cfg's QPS and Burst (--kube-api-qps, --kube-api-burst) bound the
// controllers' requests together, as kube-controller-manager's bound its Job
// controller's; a RateLimiter already in cfg is used as it is.
func NewClients(cfg *rest.Config, jobRecords bool, maxPods int) (*Clients, error) {
	c := rest.CopyConfig(cfg)
	if c.RateLimiter == nil {
		qps, burst := c.QPS, c.Burst
		if qps == 0 {
			qps, burst = rest.DefaultQPS, rest.DefaultBurst
		}
		if qps > 0 {
			if burst <= 0 {
				return nil, fmt.Errorf("a burst of %d requests with %v requests per second: the burst must be at least 1", burst, qps)
			}
			c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(qps, burst)
		}
	}
	kube, err := podwire.NewClientset(protobuf(c))
	if err != nil {
		return nil, fmt.Errorf("building the client: %w", err)
	}
	meta, err := metadata.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("building the pods' metadata client: %w", err)
	}
	out := &Clients{Kube: kube, PodMetadata: meta}
	if jobRecords {
		if out.Records, err = RecordsConfig(c, maxPods); err != nil {
			return nil, err
		}
	}
	return out, nil
}
