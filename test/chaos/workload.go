package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// truthScript is the command of the storm Jobs' pods: it records its start, beats every
// half second for RUN_TICKS half-seconds (RERUN_TICKS once an earlier attempt of its index
// started, plus JOB_COMPLETION_INDEX % JITTER), then exits 1 if its index is in FAIL and no
// attempt of the index failed before (mkdir is atomic: one failure per index, whatever
// runs at once), else 0, and records the exit.
const truthScript = `set -u
d=/truth/$JOB/$JOB_COMPLETION_INDEX
mkdir -p $d
f=$d/$POD
now() { read u r < /proc/uptime; echo $u; }
echo "start $(now) $NODE" >> $f
n=$RUN_TICKS
if [ -e $d/ran ]; then n=$RERUN_TICKS; fi
touch $d/ran
n=$((n + JOB_COMPLETION_INDEX % JITTER))
i=0
while [ $i -lt $n ]; do now > $f.beat; sleep 0.5; i=$((i+1)); done
code=0
case ",$FAIL," in *",$JOB_COMPLETION_INDEX,"*) if mkdir $d/failed 2>/dev/null; then code=1; fi;; esac
echo "exit $code $(now)" >> $f
exit $code
`

// restartScript is the command of a container restarted in place: it exits 3 after two
// seconds, every run, recording its run ordinal (= the container's restart count).
const restartScript = `mkdir -p /truth/restart
f=/truth/restart/$POD
now() { read u r < /proc/uptime; echo $u; }
n=$(cat $f 2>/dev/null | grep -c ^start)
echo "start $n $(now)" >> $f
sleep 2
echo "exit 3 $n $(now)" >> $f
exit 3
`

// stormJob describes a Job whose pods run truthScript.
type stormJob struct {
	Name                     string
	Completions, Parallelism int32
	// Fail are the indexes whose first attempt to reach its end exits 1.
	Fail []int
	// RunTicks, RerunTicks: half-seconds of the first attempt of an index and of later
	// ones; Jitter adds index % Jitter half-seconds (1: none).
	RunTicks, RerunTicks, Jitter int
	// Nodes, if set, are the nodes the pods may run on; Prefer the one they prefer.
	Nodes  []string
	Prefer string
	// EvictAfter, if set, is the pods' toleration (seconds) of the unreachable and
	// not-ready NoExecute taints.
	EvictAfter *int64
	// Annotations of the pods (the opt-in to forceful deletion, ...).
	Annotations map[string]string
	// BackoffLimitPerIndex (1 unless set).
	BackoffLimitPerIndex int32
	// ExtraRules come before the rule that ignores disruptions.
	ExtraRules []*wrappers.RuleWrapper
}

// randomIndexes picks round(frac*n) distinct indexes of 0..n-1.
func randomIndexes(rng *rand.Rand, n int, frac float64) []int {
	k := int(frac*float64(n) + 0.5)
	perm := rng.Perm(n)[:k]
	slices.Sort(perm)
	return perm
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// job builds the Job: managed by coroner-shim, Indexed, backoffLimitPerIndex, a
// podFailurePolicy that ignores disruptions (so its podReplacementPolicy is Failed: a
// replacement waits for its predecessor to be terminal), pods that record their truth in
// hostDir (a hostPath, this machine's, which every lab node shares).
func (s stormJob) job(ns, hostDir string) *batchv1.Job {
	blpi := s.BackoffLimitPerIndex
	if blpi == 0 {
		blpi = 1
	}
	jitter := max(s.Jitter, 1)
	rules := append(slices.Clone(s.ExtraRules), wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget))
	j := wrappers.MakeJob(s.Name, ns).
		ManagedBy(conditions.ManagedBy).
		Indexed().
		Completions(s.Completions).
		Parallelism(s.Parallelism).
		BackoffLimitPerIndex(blpi).
		PodFailurePolicy(rules...).
		TerminationGracePeriodSeconds(1).
		Command("sh", "-c", truthScript).
		Obj()
	spec := &j.Spec.Template.Spec
	if len(s.Annotations) > 0 {
		j.Spec.Template.Annotations = s.Annotations
	}
	c := &spec.Containers[0]
	c.Env = []corev1.EnvVar{
		{Name: "JOB", Value: s.Name},
		{Name: "FAIL", Value: joinInts(s.Fail)},
		{Name: "RUN_TICKS", Value: strconv.Itoa(s.RunTicks)},
		{Name: "RERUN_TICKS", Value: strconv.Itoa(s.RerunTicks)},
		{Name: "JITTER", Value: strconv.Itoa(jitter)},
		{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
	}
	c.VolumeMounts = []corev1.VolumeMount{{Name: "truth", MountPath: "/truth"}}
	spec.Volumes = []corev1.Volume{{Name: "truth", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: hostDir, Type: ptr.To(corev1.HostPathDirectoryOrCreate)},
	}}}
	if s.EvictAfter != nil {
		spec.Tolerations = []corev1.Toleration{
			{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: s.EvictAfter},
			{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: s.EvictAfter},
		}
	}
	if len(s.Nodes) > 0 {
		spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: s.Nodes}},
			}}},
		}}
		if s.Prefer != "" {
			spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = []corev1.PreferredSchedulingTerm{{
				Weight: 100, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
					{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{s.Prefer}},
				}},
			}}
		}
	}
	return j
}

// truthPod is a bare pod with the truth volume.
func truthPod(name, ns, hostDir, node string, restart corev1.RestartPolicy, script string) *corev1.Pod {
	p := wrappers.MakePod(name, ns).Obj()
	p.Spec.NodeName = node
	p.Spec.RestartPolicy = restart
	p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
	c := &p.Spec.Containers[0]
	c.Command = []string{"sh", "-c", script}
	c.Env = []corev1.EnvVar{{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
	c.VolumeMounts = []corev1.VolumeMount{{Name: "truth", MountPath: "/truth"}}
	p.Spec.Volumes = []corev1.Volume{{Name: "truth", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: hostDir, Type: ptr.To(corev1.HostPathDirectoryOrCreate)},
	}}}
	return p
}

// indexRange is the completedIndexes of a Job whose n indexes all succeeded, written as
// the Job controller writes intervals: "0", "0,1", "0-(n-1)".
func indexRange(n int32) string {
	switch n {
	case 1:
		return "0"
	case 2:
		return "0,1"
	}
	return fmt.Sprintf("0-%d", n-1)
}
